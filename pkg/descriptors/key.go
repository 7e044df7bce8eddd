package descriptors

import (
	"strconv"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/store"
)

// AppendKey appends to dst the store key of the counter that rule r keeps
// for the request descriptor entries of domain, and returns the extended
// slice:
//
//	rl:{<tenant>}:<rest>   sliding_window, fixed_window
//	tb:{<tenant>}:<rest>   token_bucket
//	tenant = esc(domain) "|" esc(entries[0].key) "=" val(0)
//	rest   = ("s"|"f"|"t") <window seconds> ["p" <precision>] ["o" <requests_per_unit>] {"|" esc(key) "=" val(i)}
//
// where val(i) is esc(value), or "%*" esc(pattern) for an entry matched by
// a share_threshold wildcard, and esc percent-encodes '%', '{', '}', ':',
// '=', '|', every byte below 0x21 or equal to 0x7f and every byte that is
// not part of valid UTF-8 as "%XX" (keys are valid UTF-8; input bytes are
// kept exactly: "a\xff" and "a%FF" have distinct keys). The "p" part is
// present for sliding windows of precision 2 or more only (so a rule
// without precision keeps its key), the "o" part for override rules only.
// The window seconds are the whole window (unit times unit_multiplier), so
// a rule of one unit keeps its key and two periods never share a counter. Distinct inputs (domain,
// entries, algorithm, window, override and its requests_per_unit) give
// distinct keys, and the Redis Cluster hash tag is exactly the tenant.
// Without entries the tenant is esc(domain) "|". A nil r is treated as a
// sliding-window rule of window 0. AppendKey does not allocate when dst has
// enough capacity.
func AppendKey(dst []byte, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, r *Rule) []byte {
	var alg store.Algorithm
	var secs int64
	if r != nil {
		alg, secs = r.Algorithm, r.WindowSeconds()
	}
	if alg == store.TokenBucket {
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
	case store.TokenBucket:
		dst = append(dst, 't')
	case store.FixedWindow:
		dst = append(dst, 'f')
	default:
		dst = append(dst, 's')
	}
	dst = strconv.AppendInt(dst, secs, 10)
	if r != nil && alg == store.SlidingWindow && r.Precision >= 2 {
		dst = append(dst, 'p')
		dst = strconv.AppendUint(dst, uint64(r.Precision), 10)
		if r.Strict { // counted otherwise: a counter of its own
			dst = append(dst, 'x')
		}
	}
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

// appendEscaped appends s with the key's reserved bytes percent-encoded,
// and the bytes of s that are not part of valid UTF-8 (Envoy forwards
// header bytes as they come), so that every key is valid UTF-8. Runs of
// bytes kept as they are are appended at once.
func appendEscaped(dst []byte, s string) []byte {
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && keyLiteral[s[j]] {
			j++
		}
		dst = append(dst, s[i:j]...)
		if j == len(s) {
			break
		}
		c, n := s[j], 1
		if c >= utf8.RuneSelf {
			if r, size := utf8.DecodeRuneInString(s[j:]); r != utf8.RuneError || size > 1 {
				dst = append(dst, s[j:j+size]...)
				i = j + size
				continue
			}
		}
		dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&0xf])
		i = j + n
	}
	return dst
}

// keyLiteral reports the ASCII bytes a key holds as they are: the printable
// ones but '%', '{', '}', ':', '=' and '|'.
var keyLiteral = func() (t [256]bool) {
	for c := 0x21; c < 0x7f; c++ {
		t[c] = true
	}
	for _, c := range "%{}:=|" {
		t[c] = false
	}
	return t
}()
