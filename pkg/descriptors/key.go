package descriptors

import (
	"strconv"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// AppendKey appends to dst the store key of the counter that rule r keeps
// for the request descriptor entries of domain, and returns the extended
// slice:
//
//	rl:{<tenant>}:<rest>   sliding_window, fixed_window
//	tb:{<tenant>}:<rest>   token_bucket
//	tenant = esc(domain) "|" esc(entries[0].key) "=" val(0)
//	rest   = ("s"|"f"|"t") <window seconds> ["o" <requests_per_unit>] {"|" esc(key) "=" val(i)}
//
// where val(i) is esc(value), or "%*" esc(pattern) for an entry matched by
// a share_threshold wildcard, and esc percent-encodes '%', '{', '}', ':',
// '=', '|' and every byte below 0x21 or equal to 0x7f as "%XX". The "o"
// part is present for override rules only. Distinct inputs (domain,
// entries, algorithm, window, override and its requests_per_unit) give
// distinct keys, and the Redis Cluster hash tag is exactly the tenant.
// Without entries the tenant is esc(domain) "|". A nil r is treated as a
// sliding-window rule of window 0. AppendKey does not allocate when dst has
// enough capacity.
func AppendKey(dst []byte, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, r *Rule) []byte {
	var alg Algorithm
	var secs int64
	if r != nil {
		alg, secs = r.Algorithm, r.Unit.Seconds()
	}
	if alg == TokenBucket {
		dst = append(dst, "tb:{"...)
	} else {
		dst = append(dst, "rl:{"...)
	}
	dst = appendEscaped(dst, domain)
	dst = append(dst, '|')
	if len(entries) > 0 {
		dst = appendEntry(dst, entries[0], r, 0)
	}
	dst = append(dst, "}:"...)
	switch alg {
	case TokenBucket:
		dst = append(dst, 't')
	case FixedWindow:
		dst = append(dst, 'f')
	default:
		dst = append(dst, 's')
	}
	dst = strconv.AppendInt(dst, secs, 10)
	if r != nil && r.Override {
		dst = append(dst, 'o')
		dst = strconv.AppendUint(dst, uint64(r.RequestsPerUnit), 10)
	}
	for i := 1; i < len(entries); i++ {
		dst = append(dst, '|')
		dst = appendEntry(dst, entries[i], r, i)
	}
	return dst
}

// appendEntry appends esc(key) "=" val(i).
func appendEntry(dst []byte, e *rlcommon.RateLimitDescriptor_Entry, r *Rule, i int) []byte {
	dst = appendEscaped(dst, e.GetKey())
	dst = append(dst, '=')
	if r != nil && !r.Override && i < len(r.share) && r.share[i] != "" {
		dst = append(dst, "%*"...)
		return appendEscaped(dst, r.share[i])
	}
	return appendEscaped(dst, e.GetValue())
}

const hexDigits = "0123456789ABCDEF"

// appendEscaped appends s with the key's reserved bytes percent-encoded.
func appendEscaped(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c < 0x21 || c == 0x7f, c == '%', c == '{', c == '}', c == ':', c == '=', c == '|':
			dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}
