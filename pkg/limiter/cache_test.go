package limiter

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/memory"
	"github.com/rls-project/rls/pkg/testkit"
)

// A request naming one key twice (999,997 hits, then 1, with 999,997 left)
// is denied and consumes nothing; the cache remembers the denial for the
// 999,998 hits the request asked of the key in all, so an ordinary 1-hit
// request goes to the store and is admitted.
func TestDuplicateKeyDenialDoesNotBlockSmallRequests(t *testing.T) {
	l, cs, _ := setup(t, 1)
	c := chk("rl:{d|k=v}:s3600", 1_000_000, time.Hour)
	if r, _ := decide(t, l, false, hits(c, 3)); !r[0].Allowed || r[0].Remaining != 999_997 {
		t.Fatalf("3 hits: %+v, want allowed, 999,997 left", r[0])
	}
	items := []Item{{Check: hits(c, 999_997)}, {Check: hits(c, 1)}}
	decideItems(t, l, items)
	if !vetoes(items, func(i int) bool { return !items[i].Result.Allowed }) {
		t.Fatalf("999,997 + 1 hits with 999,997 left: %+v, want denied", items)
	}
	calls := cs.calls.Load()
	r, src := decide(t, l, false, c)
	if !r[0].Allowed || src[0] != FromStore || r[0].Remaining != 999_996 {
		t.Fatalf("1 hit after the denied request: %+v from %v, want allowed by the store, 999,996 left", r[0], src[0])
	}
	if cs.calls.Load() != calls+1 {
		t.Fatal("the 1-hit request did not reach the store")
	}
	// The cache still denies what the store denied: the 999,998 hits.
	if _, src := decide(t, l, false, hits(c, 999_998)); src[0] != FromCache {
		t.Errorf("999,998 hits: from %v, want the cache (the store denied that total)", src[0])
	}
}

// diffKeys are the keys of the differential test: every algorithm, small
// limits that deny often, and the big key of the duplicate-key example.
var diffKeys = []store.Check{
	{Key: "fw", Algorithm: store.FixedWindow, Limit: 10, Window: time.Minute},
	{Key: "sw", Algorithm: store.SlidingWindow, Limit: 10, Window: time.Minute},
	{Key: "sw6", Algorithm: store.SlidingWindow, Limit: 12, Window: time.Minute, Precision: 6},
	{Key: "tb", Algorithm: store.TokenBucket, Limit: 10, Burst: 5, Window: time.Minute},
	{Key: "big", Algorithm: store.FixedWindow, Limit: 1_000_000, Window: time.Hour},
}

// bigHits are the hits of a check on the big key.
var bigHits = []uint64{1, 3, 999_997, 1_000_001, 0, 500_000}

// diffRun decides the same requests on two limiters over two memory stores
// on one clock, one with the over-limit cache and one without, and fails
// when they disagree on a request's verdict or on any key's state: the
// cache must only answer what the store would. The request of each step is
// read from 4 bytes of data: the number of checks and the clock's advance,
// then a key, hits and a refund flag per check (up to 3 checks, the same
// key possibly more than once).
func diffRun(t *testing.T, data []byte) {
	t.Helper()
	clk := testkit.NewClock(time.Unix(1_751_540_400, 0))
	cached := New(memory.New(memory.Options{Now: clk.Now}), Options{Now: clk.Now})
	plainStore := memory.New(memory.Options{Now: clk.Now})
	plain := New(plainStore, Options{Now: clk.Now, DisableOverLimitCache: true})
	ctx := context.Background()
	for step := 0; len(data) >= 4; step++ {
		head := data[0]
		n := 1 + int(head%3)
		clk.Advance(time.Duration(head>>2) * time.Second)
		data = data[1:]
		var req []Item
		for ; n > 0 && len(data) >= 2; n-- {
			c := diffKeys[int(data[0]&0x7f)%len(diffKeys)]
			if c.Key == "big" {
				c.Hits = bigHits[int(data[1])%len(bigHits)]
			} else {
				c.Hits = uint64(data[1] % 13)
			}
			c.Refund = data[0]&0x80 != 0 && c.Hits > 0
			req = append(req, Item{Check: c})
			data = data[2:]
		}
		a, b := append([]Item(nil), req...), append([]Item(nil), req...)
		if err := cached.Decide(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := plain.Decide(ctx, b); err != nil {
			t.Fatal(err)
		}
		deniedA := vetoes(a, func(i int) bool { return !a[i].Result.Allowed })
		deniedB := vetoes(b, func(i int) bool { return !b[i].Result.Allowed })
		if deniedA != deniedB {
			t.Fatalf("step %d, request %v: denied %v with the cache, %v by the store alone", step, checksOf(req), deniedA, deniedB)
		}
		for _, k := range diffKeys {
			if ra, rb := peek(t, cached.st, k), peek(t, plainStore, k); ra != rb {
				t.Fatalf("step %d, request %v: key %s state %+v with the cache, %+v by the store alone", step, checksOf(req), k.Key, ra, rb)
			}
		}
	}
}

func checksOf(items []Item) []string {
	out := make([]string, len(items))
	for i, it := range items {
		sign := "+"
		if it.Check.Refund {
			sign = "-"
		}
		out[i] = fmt.Sprintf("%s%s%d", it.Check.Key, sign, it.Check.Hits)
	}
	return out
}

// peek returns what the store reports for a check-only c.
func peek(t *testing.T, st store.Store, c store.Check) store.Result {
	t.Helper()
	c.Hits, c.Refund = 0, false
	r := make([]store.Result, 1)
	if err := st.(*memory.Store).Peek(context.Background(), []store.Check{c}, r); err != nil {
		t.Fatal(err)
	}
	return r[0]
}

// The cache against the store's own answer, over random requests with
// duplicate keys, mixed hits and refunds.
func TestCacheAgreesWithTheStore(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		data := make([]byte, 4*400)
		for i := 0; i < len(data); i += 8 {
			binary.LittleEndian.PutUint64(data[i:], rng.Uint64())
		}
		diffRun(t, data)
	}
}

// FuzzCacheAgreesWithTheStore is TestCacheAgreesWithTheStore on the
// fuzzer's requests; go test runs its seeds, make fuzz runs it longer.
func FuzzCacheAgreesWithTheStore(f *testing.F) {
	// The duplicate-key example: 3 hits on big, then 999,997 and 1 in one
	// request, then 1 hit.
	f.Add([]byte{0, 4, 1, 1, 4, 2, 4, 0, 0, 4, 0, 0})
	// 8 hits of 10, 5 denied, then a refund of 5 with 5 hits in one
	// request: the store takes the refund first and admits them.
	f.Add([]byte{0, 0, 8, 0, 0, 5, 1, 0x80, 5, 0, 5, 0})
	f.Add([]byte{1, 3, 12, 3, 12, 0, 3, 1, 0, 0, 0, 5, 0x83, 4, 3, 7, 0})
	f.Add([]byte("sliding windows and token buckets over a few minutes of traffic"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		diffRun(t, data)
	})
}
