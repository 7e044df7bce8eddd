package rlqs

import (
	"math"
	"testing"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// ledgerStream returns a stream on a Server with the defaults (no store:
// the ledger's methods only compute the checks to make).
func ledgerStream(now time.Time) *stream {
	s := New(Options{Now: func() time.Time { return now }})
	return &stream{srv: s, buckets: map[string]*bucket{}}
}

// windowed returns a subscribed bucket on a fixed window of limit hits
// per window, holding g reserved at reservedAt in the window ending at
// windowEnd.
func windowed(st *stream, key string, limit uint64, window time.Duration, g grant, reservedAt, windowEnd time.Time) *bucket {
	b := &bucket{id: map[string]string{"k": key}, key: key, last: reservedAt,
		check: store.Check{Key: "c:" + key, Algorithm: store.FixedWindow, Limit: limit, Window: window}}
	g.reservedAt, g.windowEnd, g.reserved = reservedAt, windowEnd, g.worst()
	b.g, b.hasGrant = g, true
	b.pace.Store(math.Float64bits(limitPace(b)))
	st.buckets[key] = b
	st.srv.join(b)
	return b
}

// setDemandTo makes b's demand count for d hits a second until until.
func setDemandTo(b *bucket, d float64, until time.Time) {
	b.demand.Store(math.Float64bits(d))
	b.claim.Store(math.Float64bits(d))
	b.demandUntil.Store(until.UnixNano())
}

// TestRefundKeepsWhatTheGrantCanAdmit holds invariant 4 of docs/rlqs.md: a
// refund gives back only what the reports prove unused (all of the
// reservation but what was used and what the grant can still admit until
// its window ends, plus Overlap), and nothing once the window is over.
func TestRefundKeepsWhatTheGrantCanAdmit(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	for _, used := range []uint64{0, 7, 50, 90} {
		for _, at := range []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 900 * time.Millisecond, 959 * time.Millisecond, 960 * time.Millisecond, 2 * time.Second} {
			st := ledgerStream(t0)
			overlap := st.srv.o.Overlap
			b := windowed(st, "a", 1000, time.Second, shape(200, 1), t0, t0.Add(time.Second))
			b.used = used
			before := b.g.reserved
			now := t0.Add(at)
			c, ok := st.refund(b, now)
			left := t0.Add(time.Second + overlap).Sub(now).Seconds()
			canAdmit := used + b.g.max + uint64(math.Ceil(float64(b.g.per)*left/float64(b.g.fill)))
			switch {
			case !now.Add(overlap).Before(t0.Add(time.Second)):
				if ok {
					t.Errorf("used %d, at %v: refund %d after the window (with Overlap) ended", used, at, c.Hits)
				}
			case canAdmit >= before:
				if ok {
					t.Errorf("used %d, at %v: refund %d, but the grant can still admit all it reserved", used, at, c.Hits)
				}
			default:
				if !ok || !c.Refund || c.Key != b.check.Key {
					t.Fatalf("used %d, at %v: no refund (%+v, %v), want %d", used, at, c, ok, before-canAdmit)
				}
				if c.Hits != before-canAdmit || b.g.reserved != canAdmit {
					t.Errorf("used %d, at %v: refund %d leaving %d reserved, want %d leaving %d", used, at, c.Hits, b.g.reserved, before-canAdmit, canAdmit)
				}
				if c.Shadow || c.Force {
					t.Errorf("a refund must be a plain refund check: %+v", c)
				}
			}
		}
	}
	// A blanket grant reserves nothing, so it refunds nothing.
	st := ledgerStream(t0)
	b := windowed(st, "d", 1000, time.Second, grant{deny: true, ttl: 1}, t0, t0.Add(time.Second))
	b.g.reserved = 10
	if c, ok := st.refund(b, t0.Add(100*time.Millisecond)); ok {
		t.Errorf("a DENY_ALL grant refunded %d", c.Hits)
	}
}

// TestUsageWritesBackBeyondGrants holds invariant 6: allowed requests
// beyond every grant active since the last report are written back
// (forced); those the grants covered are not counted twice.
func TestUsageWritesBackBeyondGrants(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	st := ledgerStream(t0)
	b := windowed(st, "a", 1000, 10*time.Second, shape(100, 10), t0.Add(-time.Second), t0.Add(9*time.Second))
	b.covered = 30
	checks := st.usage(b, &usage{bucket: b.id, allowed: 45}, t0)
	var forced uint64
	for _, c := range checks {
		if c.Force {
			forced += c.Hits
		}
	}
	if forced != 15 {
		t.Errorf("45 allowed under grants covering 30: wrote back %d, want 15 (%+v)", forced, checks)
	}
	if b.covered != b.g.worst() {
		t.Errorf("after the report covered = %d, want the active grant's worst case %d", b.covered, b.g.worst())
	}
	// Within what the grants covered: nothing written back.
	checks = st.usage(b, &usage{bucket: b.id, allowed: b.covered}, t0.Add(time.Second))
	for _, c := range checks {
		if c.Force {
			t.Errorf("allowed within the grants, yet wrote back %+v", c)
		}
	}
	// Denials ask for a top-up after the write-backs.
	st.usage(b, &usage{bucket: b.id, allowed: 1, denied: 5}, t0.Add(2*time.Second))
	if !b.pendingTopUp {
		t.Errorf("a report with denials did not ask for a top-up")
	}
}

// TestUsageShadowWritesBackAll: a shadow bucket's allowed requests are all
// counted (its counter stays true), an unlimited one's none.
func TestUsageShadowWritesBackAll(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	st := ledgerStream(t0)
	shadow := &bucket{id: map[string]string{"k": "s"}, key: "s", last: t0, static: &grant{allow: true}, shadow: true,
		check: store.Check{Key: "c:s", Algorithm: store.FixedWindow, Limit: 5, Window: time.Second, Shadow: true}}
	st.buckets["s"] = shadow
	checks := st.usage(shadow, &usage{bucket: shadow.id, allowed: 12}, t0.Add(time.Second))
	if len(checks) != 1 || !checks[0].Force || checks[0].Hits != 12 || checks[0].Shadow {
		t.Errorf("shadow bucket, 12 allowed: checks %+v, want one forced write-back of 12 (not shadow)", checks)
	}
	unlimited := &bucket{id: map[string]string{"k": "u"}, key: "u", last: t0, static: &grant{allow: true}}
	st.buckets["u"] = unlimited
	if checks := st.usage(unlimited, &usage{bucket: unlimited.id, allowed: 12}, t0.Add(time.Second)); len(checks) != 0 {
		t.Errorf("unlimited bucket: checks %+v, want none", checks)
	}
}

// TestUsageIdleAbandons: IdleReports reports in a row without requests
// abandon the bucket: it leaves the stream and its share group, and the
// abandon is queued.
func TestUsageIdleAbandons(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	st := ledgerStream(t0)
	b := windowed(st, "a", 1000, time.Second, shape(10, 1), t0, t0.Add(time.Second))
	for i := 1; i < st.srv.o.IdleReports; i++ {
		st.usage(b, &usage{bucket: b.id}, t0.Add(time.Duration(i)*time.Second))
		if b.gone {
			t.Fatalf("abandoned after %d idle reports, want %d", i, st.srv.o.IdleReports)
		}
	}
	// A report with requests starts the count again.
	st.usage(b, &usage{bucket: b.id, allowed: 1}, t0.Add(10*time.Second))
	for i := 0; i < st.srv.o.IdleReports; i++ {
		st.usage(b, &usage{bucket: b.id}, t0.Add(time.Duration(11+i)*time.Second))
	}
	if !b.gone || st.buckets["a"] != nil || st.srv.groupSize(b.check.Key) != 0 {
		t.Fatalf("after %d idle reports: gone %v, on the stream %v, group %d", st.srv.o.IdleReports, b.gone, st.buckets["a"] != nil, st.srv.groupSize(b.check.Key))
	}
	last := st.pending[len(st.pending)-1]
	if last.GetAbandonAction() == nil || last.GetBucketId().GetBucket()["k"] != "a" {
		t.Errorf("the last action queued is %v, want the bucket's abandon", last)
	}
}

// TestShrinkKeepsWhatTheOldGrantCanAdmit holds invariant 5: a shrink's
// refund leaves reserved what the replaced grant can still admit (its
// bucket and its refill from the window's start until the replacement
// lands, and where the report covers the grant's life what was used and
// 2 x Overlap of refill) plus the new grant's worst case; a report with
// denials or a grant that is not its own reservation is never shrunk.
func TestShrinkKeepsWhatTheOldGrantCanAdmit(t *testing.T) {
	t0 := time.Unix(1_000_000, 0) // a multiple of 10 s: a window's start
	for _, reported := range []bool{false, true} {
		for _, at := range []time.Duration{time.Second, 3 * time.Second, 8 * time.Second} {
			st := ledgerStream(t0)
			overlap := st.srv.o.Overlap
			b := windowed(st, "a", 100000, 10*time.Second, shape(10000, 10), t0, t0.Add(10*time.Second))
			b.used = 40
			now := t0.Add(at)
			setDemandTo(b, 5, now.Add(time.Minute)) // 5 a second: much less than the grant's 1,000
			old := b.g
			a, c, ok := st.shrink(b, now, reported)
			if !ok {
				t.Fatalf("reported %v, at %v: a grant of %d with a demand of 5/s was not shrunk", reported, at, old.worst())
			}
			admits := old.max + uint64(math.Ceil(old.rate()*(at+overlap).Seconds()))
			if reported {
				admits = min(admits, 40+old.max+uint64(math.Ceil(old.rate()*(2*overlap).Seconds())))
			}
			if b.g.reserved < admits+b.g.worst() {
				t.Errorf("reported %v, at %v: %d kept reserved, below what the old grant admits (%d) and the new one's worst case (%d)", reported, at, b.g.reserved, admits, b.g.worst())
			}
			if !c.Refund || c.Hits != old.reserved-b.g.reserved {
				t.Errorf("reported %v, at %v: refund %+v, want %d", reported, at, c, old.reserved-b.g.reserved)
			}
			if b.g.worst() >= old.worst() || a.GetQuotaAssignmentAction() == nil {
				t.Errorf("reported %v, at %v: the replacement %+v is not smaller than %+v, or not sent (%v)", reported, at, b.g, old, a)
			}
			if b.shrunk != c.Hits || !b.shrunkAt.Equal(now) {
				t.Errorf("the stream's end must know the refund to charge back: shrunk %d at %v", b.shrunk, b.shrunkAt)
			}
			// Shrunk once: its reservation is no longer its own.
			if _, _, again := st.shrink(b, now.Add(time.Millisecond), reported); again && b.g.reserved > b.g.worst() {
				t.Errorf("a shrunk grant was shrunk again")
			}
		}
	}
	st := ledgerStream(t0)
	b := windowed(st, "a", 100000, 10*time.Second, shape(10000, 10), t0, t0.Add(10*time.Second))
	setDemandTo(b, 5, t0.Add(time.Minute))
	b.pendingTopUp = true
	if _, _, ok := st.shrink(b, t0.Add(time.Second), true); ok {
		t.Errorf("a report with denials shrank its grant")
	}
	b.pendingTopUp = false
	if _, _, ok := st.shrink(b, t0.Add(10*time.Second-3*st.srv.o.Overlap), true); ok {
		t.Errorf("a grant within 4 x Overlap of its window's end was shrunk")
	}
}

// TestResolutionSame: a reload re-grants a bucket only when its blanket
// answer, counter or rule changed (stream.reconfigure).
func TestResolutionSame(t *testing.T) {
	c := store.Check{Key: "k", Algorithm: store.FixedWindow, Limit: 10, Window: time.Second}
	counted := &bucket{check: c}
	r := resolution{check: c}
	if !r.same(counted) {
		t.Errorf("the same counter and rule are not the same")
	}
	c2 := c
	c2.Limit = 11
	if r.same(&bucket{check: c2}) {
		t.Errorf("a changed limit is the same")
	}
	if r.same(&bucket{check: c, static: &grant{allow: true}}) {
		t.Errorf("counted and blanket are the same")
	}
	allow := resolution{static: &grant{allow: true}}
	if allow.same(&bucket{static: &grant{deny: true}}) {
		t.Errorf("ALLOW_ALL and DENY_ALL are the same")
	}
	if !allow.same(&bucket{static: &grant{allow: true}}) {
		t.Errorf("ALLOW_ALL and ALLOW_ALL differ")
	}
}
