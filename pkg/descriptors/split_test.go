package descriptors

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/rls-project/rls/pkg/store"
)

func TestSplitParse(t *testing.T) {
	cfg, err := Parse(map[string][]byte{"s.yaml": []byte(`
domain: d
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 50000}
  - key: one
    rate_limit: {unit: second, requests_per_unit: 50000, split: 1}
  - key: hot
    rate_limit: {unit: second, requests_per_unit: 50000, split: 3}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 10, split: 10}
`)})
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int{"plain": 1, "one": 1, "hot": 3, "bucket": 10} {
		if got := cfg.Match("d", entries(key, "x")).Splits(); got != want {
			t.Errorf("%s: Splits() = %d, want %d", key, got, want)
		}
	}
	// Without split (or with 1) the key is the one AppendKey makes.
	for _, key := range []string{"plain", "one"} {
		r := cfg.Match("d", entries(key, "x"))
		if a, b := AppendKey(nil, "d", entries(key, "x"), r), AppendSubKey(nil, "d", entries(key, "x"), r, 0); string(a) != string(b) {
			t.Errorf("%s: sub-key %q, want the key %q", key, b, a)
		}
	}

	for yaml, want := range map[string]string{
		`{unit: second, requests_per_unit: 5, split: 0}`:                                    "s.yaml:4: split: must be 1 to 64 sub-keys, got 0",
		`{unit: second, requests_per_unit: 500, split: 65}`:                                 "s.yaml:4: split: must be 1 to 64 sub-keys, got 65",
		`{unit: second, requests_per_unit: 5, split: 2.5}`:                                  "s.yaml:4: split: must be an integer, got 2.5",
		`{unit: second, requests_per_unit: 5, split: -1}`:                                   "s.yaml:4: split: must not be negative, got -1",
		`{unit: second, requests_per_unit: 5, split: three}`:                                `s.yaml:4: split: must be a non-negative integer, got the scalar "three"`,
		`{unit: second, requests_per_unit: 5, split: [3]}`:                                  "s.yaml:4: split: must be a non-negative integer, got a list",
		`{unlimited: true, split: 3}`:                                                       "s.yaml:4: split: must not be set when unlimited is true",
		`{unit: second, requests_per_unit: 2, split: 3}`:                                    "s.yaml:4: split: 3 sub-keys for requests_per_unit 2: each sub-key needs a share of at least 1",
		`{unit: second, requests_per_unit: 9, algorithm: token_bucket, burst: 2, split: 3}`: "s.yaml:4: split: 3 sub-keys for burst 2: each sub-key needs a share of at least 1",
	} {
		_, err := Parse(map[string][]byte{"s.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: " + yaml + "\n")})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", yaml, err, want)
		}
	}
}

// TestSplitShares: the shares of requests_per_unit and burst differ by at
// most one and sum to the whole, for every split and many limits.
func TestSplitShares(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := uint32(1); n <= MaxSplit; n++ {
		for range 50 {
			l := n + rng.Uint32N(100000)
			if rng.IntN(4) == 0 {
				l = n + rng.Uint32N(3)
			}
			b := uint32(0)
			if rng.IntN(2) == 0 {
				b = n + rng.Uint32N(1000)
			}
			r := &Rule{Unit: UnitSecond, RequestsPerUnit: l, Burst: b, Algorithm: store.TokenBucket, Split: n}
			var sumL, sumB uint64
			lo, hi := uint32(1<<31), uint32(0)
			for i := range r.Splits() {
				sl, sb := r.SubLimit(i)
				sumL, sumB = sumL+uint64(sl), sumB+uint64(sb)
				lo, hi = min(lo, sl), max(hi, sl)
			}
			if r.Splits() != int(n) || sumL != uint64(l) || sumB != uint64(b) || hi-lo > 1 || lo < 1 {
				t.Fatalf("split %d of %d (burst %d): %d sub-keys, shares sum to %d (burst %d), from %d to %d", n, l, b, r.Splits(), sumL, sumB, lo, hi)
			}
		}
	}
	// An override smaller than the split gets fewer sub-keys, each with a
	// share of at least one.
	base := &Rule{Unit: UnitSecond, RequestsPerUnit: 9000, Split: 8, rr: new(splitRR)}
	for rpu, want := range map[uint32]int{0: 1, 1: 1, 5: 5, 8: 8, 100: 8} {
		if got := OverrideRule(base, "d", rpu, UnitSecond, 1).Splits(); got != want {
			t.Errorf("override of %d on split 8: %d sub-keys, want %d", rpu, got, want)
		}
	}
	if got := (&Rule{Unlimited: true, Split: 4}).Splits(); got != 1 {
		t.Errorf("unlimited rule: %d sub-keys, want 1", got)
	}
}

// TestSubKeySlots: sub-key i of N lands in the middle three quarters of
// the i-th N-th of the slot space, for every N and many tenants (so the salt
// search always succeeds), and every sub-key differs from every other and
// from the unsplit key.
func TestSubKeySlots(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	alphabet := "ab{}:=|%*é\x00\xff"
	word := func(max int) string {
		var b strings.Builder
		for n := rng.IntN(max); n > 0; n-- {
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	seen := make(map[string]string)
	for trial := range 3000 {
		n := 2 + trial%(MaxSplit-1)
		domain := word(6)
		es := entries("api_key", word(12), "route", word(3))[:rng.IntN(3)]
		r := &Rule{Unit: UnitSecond, RequestsPerUnit: 100000, Split: uint32(n), Algorithm: store.Algorithm(rng.IntN(3))}
		plain := string(AppendKey(nil, domain, es, r))
		for i := range n {
			key := string(AppendSubKey(nil, domain, es, r, i))
			in := fmt.Sprintf("%q %v %d/%d", domain, es, i, n)
			if prev, ok := seen[key]; ok && prev != in {
				t.Fatalf("key %q for both %s and %s", key, prev, in)
			}
			seen[key] = in
			if key == plain {
				t.Fatalf("sub-key %d of %d is the unsplit key %q", i, n, key)
			}
			open, end := strings.IndexByte(key, '{'), strings.IndexByte(key, '}')
			tag := key[open+1 : end]
			if !strings.HasPrefix(key, plain[:strings.IndexByte(plain, '}')]) || key[end:] != plain[strings.IndexByte(plain, '}'):] {
				t.Fatalf("sub-key %q is not the key %q with a longer tag", key, plain)
			}
			slot := int(crc16Update(0, []byte(tag)) % slots)
			if lo, hi := splitRange(i, n); slot < lo || slot >= hi {
				t.Fatalf("sub-key %d of %d: %q in slot %d, want [%d, %d)", i, n, key, slot, lo, hi)
			}
		}
		if len(seen) > 200000 {
			clear(seen)
		}
	}
	// The format, on one example.
	r := &Rule{Unit: UnitSecond, RequestsPerUnit: 3000, Split: 3}
	for i, want := range []string{"rl:{api|api_key=k|0/3.", "rl:{api|api_key=k|1/3.", "rl:{api|api_key=k|2/3."} {
		key := string(AppendSubKey(nil, "api", entries("api_key", "k", "route", "r"), r, i))
		if !strings.HasPrefix(key, want) || !strings.HasSuffix(key, "}:s1|route=r") {
			t.Errorf("sub-key %d: %q, want %s<salt>}:s1|route=r", i, key, want)
		}
	}
}

// TestSplitRanges: the N parts never overlap, and with as many equal
// master ranges as parts (redis-cli's: master m holds [m*16384/M, ...)),
// each part is inside one master's range, a different one for each part.
func TestSplitRanges(t *testing.T) {
	for n := 2; n <= MaxSplit; n++ {
		prevHi := 0
		for i := range n {
			lo, hi := splitRange(i, n)
			if lo < prevHi || hi <= lo || hi > slots {
				t.Fatalf("split %d: part %d is [%d, %d) after %d", n, i, lo, hi, prevHi)
			}
			prevHi = hi
			for _, masters := range []int{n, n / 2, n / 3} {
				if masters < 1 || n%masters != 0 {
					continue
				}
				// redis-cli --cluster create: cursor += 16384/M, first = round(cursor)
				m := func(slot int) int {
					for k := masters - 1; k >= 0; k-- {
						if first := int(float64(k)*slots/float64(masters) + 0.5); slot >= first {
							return k
						}
					}
					return 0
				}
				if m(lo) != m(hi-1) || m(lo) != i*masters/n {
					t.Fatalf("split %d over %d masters: part %d [%d, %d) spans masters %d to %d, want %d", n, masters, i, lo, hi, m(lo), m(hi-1), i*masters/n)
				}
			}
		}
	}
}

// TestNextSubRoundRobin: one process's requests for one key go to each
// sub-key in turn, also from many goroutines at once.
func TestNextSubRoundRobin(t *testing.T) {
	r := &Rule{Unit: UnitSecond, RequestsPerUnit: 1000, Split: 3, rr: new(splitRR)}
	es := entries("api_key", "hot")
	for k := range 9 {
		if got := r.NextSub("d", es); got != k%3 {
			t.Fatalf("request %d on sub-key %d, want %d", k, got, k%3)
		}
	}
	var counts [3]int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var local [3]int
			for range 3000 {
				local[r.NextSub("d", es)]++
			}
			mu.Lock()
			for i := range local {
				counts[i] += local[i]
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if counts != [3]int{8000, 8000, 8000} {
		t.Errorf("24000 concurrent requests spread %v over 3 sub-keys, want 8000 each", counts)
	}
	// Two keys requested in turn on a split of 2: each still alternates
	// between the sub-keys (one shared counter would send each key to one
	// sub-key only). Keys of distinct stripes, as most keys are.
	two := &Rule{Unit: UnitSecond, RequestsPerUnit: 1000, Split: 2, rr: new(splitRR)}
	a, b := entries("api_key", "a"), entries("api_key", "b")
	if stripe("d", a) == stripe("d", b) {
		t.Fatal("pick keys of distinct stripes")
	}
	var seq []int
	for range 4 {
		seq = append(seq, two.NextSub("d", a), two.NextSub("d", b))
	}
	if fmt.Sprint(seq) != "[0 0 1 1 0 0 1 1]" {
		t.Errorf("keys a and b in turn got sub-keys %v, want each to alternate: [0 0 1 1 0 0 1 1]", seq)
	}
	if got := (&Rule{Unit: UnitSecond, RequestsPerUnit: 10}).NextSub("d", es); got != 0 {
		t.Errorf("unsplit rule: sub-key %d, want 0", got)
	}
}

func TestSplitDoesNotAllocate(t *testing.T) {
	r := &Rule{Unit: UnitSecond, RequestsPerUnit: 64000, Split: 64, rr: new(splitRR)}
	es := entries("api_key", "k{1}", "route", "/v1/x y")
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { buf = AppendSubKey(buf[:0], "api", es, r, r.NextSub("api", es)) }); n != 0 {
		t.Errorf("NextSub and AppendSubKey allocate %v times", n)
	}
}

func BenchmarkAppendSubKey(b *testing.B) {
	es := entries("api_key", strings.Repeat("k", 40), "route", "/v1/search")
	for _, n := range []uint32{3, 64} {
		r := &Rule{Unit: UnitSecond, RequestsPerUnit: 64000, Split: n, rr: new(splitRR)}
		b.Run(fmt.Sprint("split=", n), func(b *testing.B) {
			buf := make([]byte, 0, 256)
			for b.Loop() {
				buf = AppendSubKey(buf[:0], "api", es, r, r.NextSub("api", es))
			}
		})
	}
}

// TestSaltReachesEveryRange: from every CRC16 state (whatever the tenant),
// the salt search reaches every sub-key's range within two-digit salts, for
// splits of 2, 3, 5, 8 and 64 (run once for every split from 2 to 64: at
// most 324 salts).
func TestSaltReachesEveryRange(t *testing.T) {
	const twoDigits = 36 + 36*36
	splits := []int{2, 3, 5, 8, 64}
	var salt [3]byte
	for state := 0; state < 1<<16; state++ {
		var reached [5][64]bool
		left := 2 + 3 + 5 + 8 + 64
		for c := 0; c < twoDigits && left > 0; c++ {
			slot := int(crc16Update(uint16(state), saltOf(&salt, c)) % slots)
			for k, n := range splits {
				i := slot * n / slots // the part holding slot
				if lo, hi := splitRange(i, n); !reached[k][i] && slot >= lo && slot < hi {
					reached[k][i] = true
					left--
				}
			}
		}
		if left > 0 {
			t.Fatalf("CRC state %#04x: %d sub-key ranges out of reach of one- and two-digit salts", state, left)
		}
	}
}
