package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// defaultDescriptors are what -descriptors N selects (the first N) when no
// -d template is given. They match config/example.yaml.
var defaultDescriptors = []string{
	"api_key=%k",
	"api_key=%k;route=/v1/search",
	"remote_address=%i",
	"generic_key=login",
}

// A descriptor template is one request descriptor: entries separated by ';',
// each key=value. In a value, %k is the key (-key-prefix + index), %n the
// key's index, %i an IPv4 address derived from the index (10.x.y.z) and %%
// a literal '%'.
type descTemplate []entryTemplate

type entryTemplate struct {
	key   string
	parts []part // the value
}

type part struct {
	lit  string
	verb byte // 0 for a literal, else 'k', 'n' or 'i'
}

func parseTemplate(s string) (descTemplate, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("empty descriptor template")
	}
	var d descTemplate
	for e := range strings.SplitSeq(s, ";") {
		k, v, ok := strings.Cut(e, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("descriptor template %q: entry %q is not key=value", s, e)
		}
		if strings.Contains(k, "%") {
			return nil, fmt.Errorf("descriptor template %q: placeholders belong in values, not in key %q", s, k)
		}
		parts, err := parseValue(v)
		if err != nil {
			return nil, fmt.Errorf("descriptor template %q: %v", s, err)
		}
		d = append(d, entryTemplate{key: k, parts: parts})
	}
	return d, nil
}

func parseValue(v string) ([]part, error) {
	var parts []part
	var lit strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] != '%' {
			lit.WriteByte(v[i])
			continue
		}
		if i+1 == len(v) {
			return nil, fmt.Errorf("value %q ends with a lone %%", v)
		}
		i++
		switch c := v[i]; c {
		case '%':
			lit.WriteByte('%')
		case 'k', 'n', 'i':
			if lit.Len() > 0 {
				parts = append(parts, part{lit: lit.String()})
				lit.Reset()
			}
			parts = append(parts, part{verb: c})
		default:
			return nil, fmt.Errorf("value %q: unknown placeholder %%%c (want %%k, %%n, %%i or %%%%)", v, c)
		}
	}
	if lit.Len() > 0 || len(parts) == 0 {
		parts = append(parts, part{lit: lit.String()})
	}
	return parts, nil
}

// usesKey reports whether any value depends on the key.
func (d descTemplate) usesKey() bool {
	for _, e := range d {
		for _, p := range e.parts {
			if p.verb != 0 {
				return true
			}
		}
	}
	return false
}

func ipOf(idx int) string {
	u := uint32(idx)
	return "10." + strconv.Itoa(int(u>>16&255)) + "." + strconv.Itoa(int(u>>8&255)) + "." + strconv.Itoa(int(u&255))
}

func (d descTemplate) build(prefix string, idx int) *rlcommon.RateLimitDescriptor {
	out := &rlcommon.RateLimitDescriptor{Entries: make([]*rlcommon.RateLimitDescriptor_Entry, len(d))}
	for i, e := range d {
		var b strings.Builder
		for _, p := range e.parts {
			switch p.verb {
			case 0:
				b.WriteString(p.lit)
			case 'k':
				b.WriteString(prefix)
				b.WriteString(strconv.Itoa(idx))
			case 'n':
				b.WriteString(strconv.Itoa(idx))
			case 'i':
				b.WriteString(ipOf(idx))
			}
		}
		out.Entries[i] = &rlcommon.RateLimitDescriptor_Entry{Key: e.key, Value: b.String()}
	}
	return out
}

// requestSet makes the ShouldRateLimit request of each key. Up to
// maxPrebuilt keys are built once up front, so the hot loop only reads
// shared, immutable messages (proto marshalling is safe concurrently);
// beyond that a request is built per call.
type requestSet struct {
	domain   string
	prefix   string
	hits     uint32
	tmpls    []descTemplate
	prebuilt []*rlsv3.RateLimitRequest
}

const maxPrebuilt = 1 << 17

func newRequestSet(domain, prefix string, hits uint32, tmpls []descTemplate, keys int) *requestSet {
	rs := &requestSet{domain: domain, prefix: prefix, hits: hits, tmpls: tmpls}
	n := keys
	keyed := false
	for _, t := range tmpls {
		keyed = keyed || t.usesKey()
	}
	if !keyed {
		n = 1 // every key makes the same request
	}
	if n <= maxPrebuilt {
		rs.prebuilt = make([]*rlsv3.RateLimitRequest, n)
		for i := range n {
			rs.prebuilt[i] = rs.build(i)
		}
	}
	return rs
}

func (rs *requestSet) build(idx int) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: rs.domain, HitsAddend: rs.hits,
		Descriptors: make([]*rlcommon.RateLimitDescriptor, len(rs.tmpls))}
	for i, t := range rs.tmpls {
		req.Descriptors[i] = t.build(rs.prefix, idx)
	}
	return req
}

func (rs *requestSet) get(idx int) *rlsv3.RateLimitRequest {
	if rs.prebuilt != nil {
		if len(rs.prebuilt) == 1 {
			return rs.prebuilt[0]
		}
		return rs.prebuilt[idx]
	}
	return rs.build(idx)
}

// describe renders the request of key idx as text, e.g. for the report.
func (rs *requestSet) describe(idx int) string {
	req := rs.build(idx)
	var b strings.Builder
	for i, d := range req.Descriptors {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString("[")
		for j, e := range d.Entries {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString(e.Key + "=" + e.Value)
		}
		b.WriteString("]")
	}
	return b.String()
}
