package service

import (
	"strconv"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/rls-project/rls/pkg/descriptors"
)

// responseMetadata is the response's dynamic_metadata with --response-metadata,
// in envoyproxy/ratelimit's shape (RESPONSE_DYNAMIC_METADATA):
//
//	domain:      the request's domain
//	descriptors: per descriptor {entries: ["key=value", ...], limit: "...",
//	             hitsAddend: n}, limit and hitsAddend only when the
//	             descriptor carries them
//	hitsAddend:  the request's hits_addend, when not 0
//	metadata:    the metadata fields of every descriptor that passed (status
//	             OK, not unlimited), merged in request order: the first
//	             descriptor to set a field wins, and fields that are
//	             mappings on both sides are merged the same way
//	quotaModeViolations: the indexes of the quota descriptors over their
//	             limit (quota_mode or QUOTA_MODE), when there are any
//	quotaModeEnabled: whether a counted descriptor's rule has quota_mode
//	             (QUOTA_MODE alone does not set it, as upstream's)
//
// Envoy puts it under the filter's namespace (envoy.filters.http.ratelimit)
// for logs and later filters.
func responseMetadata(req *rlsv3.RateLimitRequest, res *resolution, resp *rlsv3.RateLimitResponse, quota func(*descriptors.Rule) bool) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(printable(req.Domain))}
	ds := make([]*structpb.Value, 0, len(req.Descriptors))
	for _, d := range req.Descriptors {
		ds = append(ds, descriptorMetadata(d))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: ds})
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i, r := range res.rules {
		if r == nil || r.Unlimited || r.Metadata == nil || resp.Statuses[i].Code != rlsv3.RateLimitResponse_OK {
			continue
		}
		mergeMetadata(passed, r.Metadata)
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	quotaMetadata(fields, res, resp, quota)
	return &structpb.Struct{Fields: fields}
}

// descriptorMetadata is one descriptor's entry of "descriptors".
func descriptorMetadata(d *rlcommon.RateLimitDescriptor) *structpb.Value {
	entries := make([]*structpb.Value, len(d.Entries))
	for i, e := range d.Entries {
		entries[i] = structpb.NewStringValue(printable(e.Key + "=" + e.Value))
	}
	f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := d.Limit; l != nil {
		text := "requests_per_unit:" + strconv.FormatUint(uint64(l.RequestsPerUnit), 10) + " unit:" + l.Unit.String()
		if u := l.GetUnitMultiplier(); u != nil {
			text += " unit_multiplier:{value:" + strconv.FormatUint(uint64(u.Value), 10) + "}"
		}
		f["limit"] = structpb.NewStringValue(text)
	}
	if h := d.HitsAddend; h != nil {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h.Value))
	}
	return structpb.NewStructValue(&structpb.Struct{Fields: f})
}

// quotaMetadata sets quotaModeViolations (when there are any) and
// quotaModeEnabled in fields.
func quotaMetadata(fields map[string]*structpb.Value, res *resolution, resp *rlsv3.RateLimitResponse, quota func(*descriptors.Rule) bool) {
	var violations []*structpb.Value
	enabled := false
	for i, r := range res.rules {
		if r == nil || r.Unlimited {
			continue
		}
		enabled = enabled || r.QuotaMode
		if quota(r) && resp.Statuses[i].Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			violations = append(violations, structpb.NewNumberValue(float64(i)))
		}
	}
	if len(violations) > 0 {
		fields["quotaModeViolations"] = structpb.NewListValue(&structpb.ListValue{Values: violations})
	}
	fields["quotaModeEnabled"] = structpb.NewBoolValue(enabled)
}

// mergeMetadata adds src's fields to dst: a field dst already has is kept,
// except that two mappings are merged field by field. src (a rule's, shared)
// is never modified: what dst takes from it is a copy.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.Fields {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if hs, ss := have.GetStructValue(), v.GetStructValue(); hs != nil && ss != nil {
			mergeMetadata(hs, ss)
		}
	}
}
