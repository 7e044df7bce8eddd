// Package xds configures rls from an xDS management server, as Envoy
// Gateway configures envoyproxy/ratelimit: a state-of-the-world ADS stream
// (envoy.service.discovery.v3.AggregatedDiscoveryService) of
// ratelimit.config.ratelimit.v3.RateLimitConfig resources, one per domain.
// Client keeps the stream up, reconnecting with backoff, and ACKs or NACKs
// every response; Build turns a response's resources into a
// descriptors.Config with the rules of the descriptor YAML.
package xds

import (
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
)

// TypeURL is the type of the resources rls subscribes to (go-control-plane's
// resource.RateLimitConfigType).
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// SpecName is how errors and Rule.File name a resource: "xds:" and its name
// (its domain when it has no name).
func SpecName(c *rlsconf.RateLimitConfig) string {
	return specName(c.GetName(), c.GetDomain())
}

func specName(name, domain string) string {
	if name == "" {
		return "xds:(domain " + domain + ")"
	}
	return "xds:" + name
}

// Spec converts a resource into the descriptor model's DomainSpec: the YAML
// file it stands for. Nothing is validated here; descriptors.ParseSpecs
// does that, with the YAML's rules.
func Spec(c *rlsconf.RateLimitConfig) descriptors.DomainSpec {
	return descriptors.DomainSpec{Name: SpecName(c), Domain: c.GetDomain(), Descriptors: descriptorSpecs(c.GetDescriptors())}
}

func descriptorSpecs(ds []*rlsconf.RateLimitDescriptor) []descriptors.DescriptorSpec {
	if len(ds) == 0 {
		return nil
	}
	out := make([]descriptors.DescriptorSpec, len(ds))
	for i, d := range ds {
		out[i] = descriptors.DescriptorSpec{
			Key:            d.GetKey(),
			Value:          d.GetValue(),
			RateLimit:      rateLimitSpec(d.GetRateLimit()),
			ShadowMode:     d.GetShadowMode(),
			DetailedMetric: d.GetDetailedMetric(),
			QuotaMode:      d.GetQuotaMode(),
			Metadata:       d.GetMetadata(),
			Descriptors:    descriptorSpecs(d.GetDescriptors()),
		}
	}
	return out
}

// rateLimitSpec converts a policy. The unit is the enum's name; UNKNOWN
// (the protobuf default) is no unit on an unlimited rule, where the YAML
// has none, and stays UNKNOWN otherwise, to be refused by name.
func rateLimitSpec(p *rlsconf.RateLimitPolicy) *descriptors.RateLimitSpec {
	if p == nil {
		return nil
	}
	r := &descriptors.RateLimitSpec{
		RequestsPerUnit: p.GetRequestsPerUnit(),
		Unlimited:       p.GetUnlimited(),
		Name:            p.GetName(),
	}
	if p.GetUnit() != rlsconf.RateLimitUnit_UNKNOWN || !p.GetUnlimited() {
		r.Unit = p.GetUnit().String()
	}
	for _, rep := range p.GetReplaces() {
		r.Replaces = append(r.Replaces, rep.GetName())
	}
	return r
}

// Build validates resources, one response's, and builds the config they
// describe, as descriptors.ParseWith builds one from files (opts.MergeDomains
// lets several resources define one domain). Errors name the resource and
// the field: "xds:<name>: descriptors[0].rate_limit.unit: ...".
func Build(resources []*rlsconf.RateLimitConfig, opts descriptors.ParseOptions) (*descriptors.Config, error) {
	specs := make([]descriptors.DomainSpec, len(resources))
	for i, r := range resources {
		specs[i] = Spec(r)
	}
	return descriptors.ParseSpecs(specs, opts)
}
