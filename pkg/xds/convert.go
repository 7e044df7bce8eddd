// Package xds configures rls from an xDS management server, as Envoy
// Gateway configures envoyproxy/ratelimit: a state-of-the-world ADS stream
// (envoy.service.discovery.v3.AggregatedDiscoveryService) of
// ratelimit.config.ratelimit.v3.RateLimitConfig resources, one per domain.
// Client keeps the stream up, reconnecting with backoff, and ACKs or NACKs
// every response; Build turns a response's resources into a
// descriptors.Config with the rules of the descriptor YAML.
package xds

import (
	"fmt"
	"slices"
	"strconv"

	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"

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
// describe, as descriptors.Parse builds one from files (opts.MergeDomains
// lets several resources define one domain). Errors name the resource and
// the field: "xds:<name>: descriptors[0].rate_limit.unit: ...".
//
// A rate_limit carrying fields this build does not know is refused (see
// unknownPolicyFields).
func Build(resources []*rlsconf.RateLimitConfig, opts descriptors.ParseOptions) (*descriptors.Config, error) {
	var unknown descriptors.Errors
	specs := make([]descriptors.DomainSpec, len(resources))
	for i, r := range resources {
		specs[i] = Spec(r)
		unknownPolicyFields(SpecName(r), "descriptors", r.GetDescriptors(), &unknown)
	}
	if len(unknown) > 0 {
		return nil, unknown
	}
	return descriptors.ParseSpecs(specs, opts)
}

// unknownPolicyFields reports every rate_limit under ds (at path) that
// carries protobuf fields RateLimitPolicy does not have here. Its five
// fields say nothing of a period, so a newer control plane's policy with,
// say, a unit multiplier would otherwise be counted over one unit: a limit
// N times the one configured, with nothing to show it. Refusing it (the
// response is NACKed) keeps the config in force and names the cause.
func unknownPolicyFields(spec, path string, ds []*rlsconf.RateLimitDescriptor, errs *descriptors.Errors) {
	for i, d := range ds {
		at := path + "[" + strconv.Itoa(i) + "]"
		if p := d.GetRateLimit(); p != nil {
			if nums := unknownNumbers(p.ProtoReflect().GetUnknown()); len(nums) > 0 {
				*errs = append(*errs, &descriptors.ConfigError{File: spec, Field: at + ".rate_limit",
					Msg: fmt.Sprintf("has protobuf field(s) %v that this rls does not know (a newer RateLimitPolicy?); "+
						"refused rather than ignored, since one could change the limit (periods of several units are set in config files: unit_multiplier)", nums)})
			}
		}
		unknownPolicyFields(spec, at+".descriptors", d.GetDescriptors(), errs)
	}
}

// unknownNumbers returns the field numbers of b, a message's unknown
// fields, in order and without repeats; what cannot be parsed ends it.
func unknownNumbers(b []byte) []protowire.Number {
	var nums []protowire.Number
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if !slices.Contains(nums, num) {
			nums = append(nums, num)
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			break
		}
		b = b[m:]
	}
	return nums
}
