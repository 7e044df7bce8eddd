package rlqs

import (
	"context"
	"sync"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// demandSeen is the fleet's demand for a key, less this replica's, as last
// read through Options.Demand.
type demandSeen struct {
	others float64
	at     time.Time
	here   float64 // this replica's demand as then shared
}

// demandShift is how far a report must move this replica's demand for a
// key from what it last shared before it shares it at once, rather than at
// its next push (see shareShifted).
const demandShift = 0.25

// demandReuse is how long a reading of the fleet's demand serves the other
// streams of the same key here (their pushes at one boundary) without
// another store call.
const demandReuse = 250 * time.Millisecond

// demandBackoff is how long after a failed Demand call grants are sized
// without asking again (a Redis that is down, or a user whose ACL lacks the
// hash commands, costs one call per backoff, not one per grant).
const demandBackoff = 5 * time.Second

// demandParallel bounds the Demand calls in flight for one report or tick
// (Options.Demand decides one key per call).
const demandParallel = 8

// fleetDemand shares here (this replica's demand for b's key) and returns
// the fleet's; false when the store could not answer. A reading younger
// than demandReuse is reused.
func (s *Server) fleetDemand(ctx context.Context, b *bucket, here float64, now time.Time) (float64, bool) {
	key := b.check.Key
	s.mu.Lock()
	seen, ok := s.demands[key]
	s.mu.Unlock()
	if age := now.Sub(seen.at); ok && age >= 0 && age < demandReuse {
		return seen.others + here, true
	}
	if now.UnixNano() < s.demandDown.Load() || ctx.Err() != nil {
		return 0, false
	}
	c, cancel := context.WithTimeout(ctx, s.o.StoreTimeout)
	defer cancel()
	fleet, err := s.o.Demand(c, key, here, s.demandTTL(b))
	if err != nil {
		if ctx.Err() != nil {
			return 0, false // the stream ended: no news of the store
		}
		s.demandDown.Store(now.Add(demandBackoff).UnixNano())
		if held, ok := s.storeLog.Allow(); ok {
			s.o.Log.Warn("rlqs: sharing demand failed; this replica takes the limit over the fleet's size", "err", err, "held", held,
				"retry_in", demandBackoff)
		}
		return 0, false
	}
	s.mu.Lock()
	s.demands[key] = demandSeen{others: max(0, fleet-here), at: now, here: here}
	s.mu.Unlock()
	return fleet, true
}

// fetchDemands shares this replica's demand for the keys of bs that have
// no reading younger than demandReuse, demandParallel calls at a time, so
// that the grants of a report or a tick size their parts without a store
// round trip each. It returns the calls made.
func (s *Server) fetchDemands(ctx context.Context, bs []*bucket, now time.Time) int {
	if s.o.Demand == nil || now.UnixNano() < s.demandDown.Load() {
		return 0
	}
	todo := map[string]*bucket{}
	s.mu.Lock()
	for _, b := range bs {
		if b.static != nil {
			continue
		}
		if seen, ok := s.demands[b.check.Key]; ok && now.Sub(seen.at) >= 0 && now.Sub(seen.at) < demandReuse {
			continue
		}
		todo[b.check.Key] = b
	}
	s.mu.Unlock()
	return s.shareAll(ctx, todo, now)
}

// shareAll calls fleetDemand for each key of keys with this replica's
// demand, demandParallel at a time; it returns the calls made.
func (s *Server) shareAll(ctx context.Context, keys map[string]*bucket, now time.Time) int {
	var wg sync.WaitGroup
	sem := make(chan struct{}, demandParallel)
	calls := 0
	for key, b := range keys {
		here := s.localDemand(key, now)
		if here <= 0 {
			continue
		}
		calls++
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			s.fleetDemand(ctx, b, here, now)
		})
	}
	wg.Wait()
	return calls
}

// shareShifted shares at once this replica's demand for each of keys whose
// reports moved it by more than demandShift from what it last shared, so
// that the other replicas' next pushes see it (invariant 7). It returns
// the store calls made.
func (s *Server) shareShifted(ctx context.Context, keys map[string]*bucket, now time.Time) int {
	if s.o.Demand == nil || now.UnixNano() < s.demandDown.Load() {
		return 0
	}
	todo := map[string]*bucket{}
	for key, b := range keys {
		here := s.localDemand(key, now)
		s.mu.Lock()
		seen, ok := s.demands[key]
		shifted := ok && here > 0 && (here > seen.here*(1+demandShift) || here < seen.here*(1-demandShift))
		if shifted {
			delete(s.demands, key) // not a reading to reuse: ask again
		}
		s.mu.Unlock()
		if shifted { // else never shared (its first grant shares it), or about as shared
			todo[key] = b
		}
	}
	return s.shareAll(ctx, todo, now)
}

// localDemand is this replica's demand for key: the sum of its streams'.
func (s *Server) localDemand(key string, now time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, g := 0.0, s.groups[key]
	for o := range g {
		d += s.demandOf(o, now, len(g))
	}
	return d
}

// groupSize is the number of this replica's buckets counting on key.
func (s *Server) groupSize(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.groups[key])
}

// demandTTL is how long a replica's demand for b's key holds: two of its
// pushes (a window, or a token-bucket grant's Period), and at least the
// fleet's heartbeat TTL, 6 s. A replica that stopped cleanly withdrew it.
func (s *Server) demandTTL(b *bucket) time.Duration {
	d := 2 * b.check.Window
	if b.check.Algorithm == store.TokenBucket {
		d = 2 * s.o.Period
	}
	return max(d, 6*time.Second)
}

// withdrawDemand withdraws this replica's demand for keys (those it shared
// one for), so that the replicas left take the whole limit at their next
// push; it stops when ctx is done.
func (s *Server) withdrawDemand(ctx context.Context, keys []string) {
	if s.o.Demand == nil {
		return
	}
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		c, cancel := context.WithTimeout(ctx, s.o.StoreTimeout)
		_, _ = s.o.Demand(c, k, 0, time.Second)
		cancel()
	}
}

func (s *Server) join(b *bucket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[b.check.Key]
	if g == nil {
		g = map[*bucket]struct{}{}
		s.groups[b.check.Key] = g
	}
	g[b] = struct{}{}
}

func (s *Server) leave(b *bucket) { s.leaveKey(b, b.check.Key) }

// leaveKey takes b out of the share group of key.
func (s *Server) leaveKey(b *bucket, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[key]; g != nil {
		delete(g, b)
		if len(g) == 0 {
			delete(s.groups, key)
			delete(s.demands, key) // its record in the store expires
		}
	}
}
