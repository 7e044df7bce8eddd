package descriptors

import (
	"bytes"
	"slices"
	"strconv"
	"sync/atomic"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/store"
)

// Hot keys (split, an rls extension). A rule with split: N spreads each of
// its keys' counters over N sub-keys whose Redis Cluster hash tags land in
// N different parts of the slot space, so one hot key's script calls reach
// N shards instead of one. Sub-key i enforces its share of the limit
// (SubLimit: the shares differ by at most one and sum to requests_per_unit,
// and likewise burst), each request counts on one sub-key (NextSub: round
// robin per key within a process). The whole key admits no more than its
// limit (a sliding window rounds each sub-key's budget up: at most one
// request per sub-key more than unsplit); it can admit less, when one
// sub-key is spent while another still has room (docs/redis.md, "Hot keys:
// split").

// MaxSplit is the most sub-keys a rule's split may spread a counter over.
const MaxSplit = 64

// slots is the number of Redis Cluster hash slots.
const slots = 16384

// splitStripes is the number of round-robin counters of a split rule: a
// request's key picks one by its hash, so a hot key keeps its own counter
// (and its own strict rotation) unless it shares a stripe with another key.
const splitStripes = 64

// splitRR is a split rule's round-robin state.
type splitRR struct {
	next [splitStripes]atomic.Uint32
}

// Splits returns the number of sub-keys r spreads a key's counter over: its
// split, at most its requests_per_unit and, for a token bucket with a
// burst, its burst (a limit override smaller than split gets fewer
// sub-keys, so none has a zero share), and at least 1. 1 means no split.
func (r *Rule) Splits() int {
	if r == nil || r.Split <= 1 || r.Unlimited {
		return 1
	}
	n := min(r.Split, r.RequestsPerUnit)
	if r.Algorithm == store.TokenBucket && r.Burst > 0 {
		n = min(n, r.Burst)
	}
	return int(max(n, 1))
}

// SubLimit returns sub-key i's share of r's requests_per_unit and of its
// burst (0 when r sets no burst): with N = Splits(), x/N, plus one for the
// first x mod N sub-keys, so the shares sum to x exactly. Without split it
// returns r's own values.
func (r *Rule) SubLimit(i int) (requestsPerUnit, burst uint32) {
	n := uint32(r.Splits())
	share := func(x uint32) uint32 {
		s := x / n
		if uint32(i) < x%n {
			s++
		}
		return s
	}
	requestsPerUnit = share(r.RequestsPerUnit)
	if r.Burst > 0 {
		burst = share(r.Burst)
	}
	return requestsPerUnit, burst
}

// NextSub returns the sub-key (0 to Splits()-1) that a request for entries
// of domain counts on: the rule keeps round-robin counters (one per stripe
// of keys, picked by a hash of the domain and entries), so the requests one
// process sends for one key go to each sub-key in turn, whatever other keys
// of the rule are requested in between (unless they share its stripe). It
// is 0 without split, and safe for concurrent use.
func (r *Rule) NextSub(domain string, entries []*rlcommon.RateLimitDescriptor_Entry) int {
	n := r.Splits()
	if n <= 1 || r.rr == nil {
		return 0
	}
	c := &r.rr.next[stripe(domain, entries)]
	return int((c.Add(1) - 1) % uint32(n))
}

// stripe returns the round-robin counter of a request's key: FNV-1a of
// the domain and the entries, modulo splitStripes. It is deterministic, so
// which keys share a counter does not change from run to run.
func stripe(domain string, entries []*rlcommon.RateLimitDescriptor_Entry) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime
		}
		h = (h ^ 0xff) * prime // a separator
	}
	add(domain)
	for _, e := range entries {
		add(e.GetKey())
		add(e.GetValue())
	}
	return h % splitStripes
}

// AppendSubKey appends to dst the store key of sub-key i (0 <= i <
// Splits()) of the counter that AppendKey names, and returns the extended
// slice. Without split (Splits() is 1) it is AppendKey. Otherwise the hash
// tag gains a suffix:
//
//	{<tenant>|<i>/<N>.<salt>}
//
// where N = Splits() and salt (one or two characters of [0-9a-z]) is the
// first, in counting order, that puts the tag's Redis Cluster slot in the
// middle three quarters of the i-th of N equal parts of the slot space:
// [(8i+1)*16384/(8N), (8i+7)*16384/(8N)). On a Cluster whose masters hold
// equal slot ranges (as redis-cli --cluster create assigns them), N sub-keys
// thus land on N different masters when N is the number of masters (or a
// multiple of it, N/masters on each); the margin of an eighth of a part on
// each side keeps that true while the ranges are off by up to that much.
// An unsplit tenant holds exactly one '|' (every '|' of the domain and the
// entries is escaped) and a sub-key's two, so sub-keys never equal an
// unsplit key, and distinct (tenant, i, N) give distinct keys: a change of
// split starts the key's counters afresh.
func AppendSubKey(dst []byte, domain string, entries []*rlcommon.RateLimitDescriptor_Entry, r *Rule, i int) []byte {
	start := len(dst)
	dst = AppendKey(dst, domain, entries, r)
	n := r.Splits()
	if n <= 1 {
		return dst
	}
	open := start + len("rl:{")
	end := open + bytes.IndexByte(dst[open:], '}') // the tenant never holds '}'
	var buf [32]byte
	suffix := append(buf[:0], '|')
	suffix = strconv.AppendInt(suffix, int64(i), 10)
	suffix = append(suffix, '/')
	suffix = strconv.AppendInt(suffix, int64(n), 10)
	suffix = append(suffix, '.')
	crc := crc16Update(crc16Update(0, dst[open:end]), suffix)
	lo, hi := splitRange(i, n)
	suffix = appendSalt(suffix, crc, lo, hi)
	return slices.Insert(dst, end, suffix...)
}

// splitRange returns the slots [lo, hi) that sub-key i of n aims for.
func splitRange(i, n int) (lo, hi int) {
	return (8*i + 1) * slots / (8 * n), (8*i + 7) * slots / (8 * n)
}

const saltDigits = "0123456789abcdefghijklmnopqrstuvwxyz"

// maxSalt bounds the salts tried: every one- to three-digit salt.
const maxSalt = 36 + 36*36 + 36*36*36

// appendSalt appends the first salt (counting 0, 1, ..., z, 00, 01, ...)
// that takes the CRC16 state crc to a slot in [lo, hi). The expected
// number of tries is 16384/(hi-lo), at most 86 for 64 sub-keys; from every
// one of the 65,536 states, every sub-key's range of every split is reached
// within the first 324 salts (checked exhaustively once; TestSaltReachesEveryRange
// checks every state for a few splits), so the salt has at most two digits
// and the fallback, "0", is never taken.
func appendSalt(dst []byte, crc uint16, lo, hi int) []byte {
	var salt [3]byte
	for c := 0; c < maxSalt; c++ {
		s := saltOf(&salt, c)
		if slot := int(crc16Update(crc, s) % slots); slot >= lo && slot < hi {
			return append(dst, s...)
		}
	}
	return append(dst, '0')
}

// saltOf writes the c-th salt into buf and returns it: the one-digit salts
// first, then the two-digit ones, then the three-digit ones.
func saltOf(buf *[3]byte, c int) []byte {
	width := 1
	for size := 36; c >= size; size *= 36 {
		c -= size
		width++
	}
	for j := width - 1; j >= 0; j-- {
		buf[j] = saltDigits[c%36]
		c /= 36
	}
	return buf[:width]
}

// crc16Update continues the CRC16 (XMODEM, polynomial 0x1021) of Redis
// Cluster's key slots over b.
func crc16Update(crc uint16, b []byte) uint16 {
	for _, c := range b {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^c]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// split parses a rate_limit's split into r (after its limit and algorithm).
func (p *parser) split(fs map[string]field, r *Rule) {
	f, ok := fs["split"]
	if !ok {
		return
	}
	if r.Unlimited {
		p.errorf(f.key, "split", "must not be set when unlimited is true")
		return
	}
	n, ok := p.uint32Field(f, "split")
	if !ok {
		return
	}
	switch {
	case n < 1 || n > MaxSplit:
		p.errorf(f.val, "split", "must be 1 to %d sub-keys, got %d", MaxSplit, n)
		return
	case n > r.RequestsPerUnit:
		p.errorf(f.val, "split", "%d sub-keys for requests_per_unit %d: each sub-key needs a share of at least 1", n, r.RequestsPerUnit)
		return
	case r.Algorithm == store.TokenBucket && r.Burst > 0 && n > r.Burst:
		p.errorf(f.val, "split", "%d sub-keys for burst %d: each sub-key needs a share of at least 1", n, r.Burst)
		return
	}
	r.Split = n
	if n > 1 {
		r.rr = new(splitRR)
	}
}
