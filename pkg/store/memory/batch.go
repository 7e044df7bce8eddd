package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"time"

	"github.com/rls-project/rls/pkg/store"
)

// inlineChecks is the largest batch whose scratch space lives on the stack.
const inlineChecks = 8

// slot is the tentative state of one distinct key of a batch.
type slot struct {
	key      string
	hash     uint64
	shard    *shard
	ent      *entry // the stored entry, nil if absent or expired
	now      int64  // the key's time: the batch's clock reading, or its last write when later
	st       state  // tentative state
	base     state  // state after the write-backs (refunds and forced hits), when written
	exp      int64  // expiry of st
	baseExp  int64  // expiry of base
	written  bool   // a refund or a force applies: base is written whatever the verdict
	consumed bool
	leased   bool // the batch's only consuming check was denied and leased (see store's Leases)
}

func (m *Store) decide(ctx context.Context, checks []store.Check, results []store.Result, peek bool) error {
	if len(results) != len(checks) {
		return fmt.Errorf("memory store: %d results for %d checks", len(results), len(checks))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for i := range checks {
		if w := checks[i].Window; w < time.Second || w%time.Second != 0 {
			return fmt.Errorf("memory store: check %d (key %q): window %v is not a whole number of seconds of at least 1s", i, checks[i].Key, w)
		}
	}
	now := m.now().UnixMicro()

	// Scratch space on the stack, sized to the batch: zeroing it is a
	// noticeable part of a single check's cost.
	switch {
	case len(checks) == 1:
		var slots [1]slot
		var idx [1]int
		m.run(now, checks, results, slots[:0], idx[:0], peek)
	case len(checks) <= inlineChecks:
		var slots [inlineChecks]slot
		var idx [inlineChecks]int
		m.run(now, checks, results, slots[:0], idx[:0], peek)
	default:
		m.run(now, checks, results, nil, nil, peek)
	}
	return nil
}

// run decides checks at now, with slots and idx as empty scratch slices
// whose backing arrays are zeroed.
func (m *Store) run(now int64, checks []store.Check, results []store.Result, slots []slot, idx []int, peek bool) {
	slots, idx, locked := m.group(checks, slots, idx)
	m.lock(locked, now, peek)
	load(slots, now, peek)
	if !peek && writeBacks(checks, results, slots, idx) {
		// The state to write if the batch is vetoed.
		for j := range slots {
			slots[j].base, slots[j].baseExp = slots[j].st.clone(), slots[j].exp
		}
	}
	veto := evaluate(checks, results, slots, idx, peek)
	if !peek {
		commit(slots, veto)
		if !veto {
			markConsumed(checks, results)
		} else {
			store.Unconsume(checks, results)
		}
	}
	m.unlock(locked)
	if !peek {
		m.sweepOther(slots, locked, now)
	}
}

// group gives each distinct key of checks a slot and maps each check to its
// key's slot in idx. It returns the extended slices and the mask of the
// shards the keys live in.
func (m *Store) group(checks []store.Check, slots []slot, idx []int) ([]slot, []int, uint64) {
	var locked uint64
	for i := range checks {
		key := checks[i].Key
		h := maphash.String(m.seed, key)
		j := 0
		for j < len(slots) && (slots[j].hash != h || slots[j].key != key) {
			j++
		}
		if j == len(slots) {
			si := h & m.mask
			// The scratch slices arrive zeroed: extend without copying a
			// slot literal.
			if j < cap(slots) {
				slots = slots[:j+1]
			} else {
				slots = append(slots, slot{})
			}
			s := &slots[j]
			s.key, s.hash, s.shard = key, h, &m.shards[si]
			locked |= 1 << si
		}
		idx = append(idx, j)
	}
	return slots, idx, locked
}

// lock locks the shards of mask in ascending order (so batches never
// deadlock) and, unless peeking, sweeps each.
func (m *Store) lock(mask uint64, now int64, peek bool) {
	for ; mask != 0; mask &= mask - 1 {
		sh := &m.shards[bits.TrailingZeros64(mask)]
		sh.mu.Lock()
		if !peek {
			sh.sweep(now)
		}
	}
}

// unlock unlocks the shards of mask.
func (m *Store) unlock(mask uint64) {
	for ; mask != 0; mask &= mask - 1 {
		m.shards[bits.TrailingZeros64(mask)].mu.Unlock()
	}
}

// load reads each slot's stored state and fixes the key's time: now, or the
// key's last write when that is later (the clock was read before the lock,
// or stepped back), so a key's window never moves backwards. State expired
// at that time is absent, and reclaimed unless peeking. The shards must be
// locked.
func load(slots []slot, now int64, peek bool) {
	for j := range slots {
		s := &slots[j]
		s.st.alg = algNone
		s.now = now
		e := s.shard.list.Get(s.key)
		if e == nil {
			continue
		}
		s.now = max(now, e.Value.seen)
		if e.Value.expires > s.now {
			s.ent, s.st = e, e.Value.st.clone()
		} else if !peek {
			s.shard.remove(e)
		}
	}
}

// markConsumed sets Consumed on the allowed consuming checks of a batch
// that was written.
func markConsumed(checks []store.Check, results []store.Result) {
	for i := range checks {
		c := &checks[i]
		if c.Consuming() && results[i].Allowed {
			results[i].Consumed = true
		}
	}
}

// writeBacks applies the refunds and the forced hits of checks, in order,
// before the other checks: they are always written, except those of a
// token bucket with limit 0, which neither reads nor writes state. It
// reports whether any slot is to be written.
func writeBacks(checks []store.Check, results []store.Result, slots []slot, idx []int) (written bool) {
	for i := range checks {
		c := &checks[i]
		o := writeBackOp(c)
		if o == opCheck {
			continue
		}
		s := &slots[idx[i]]
		results[i] = s.st.apply(c, s.now, o)
		if c.Algorithm == store.TokenBucket && c.Limit == 0 {
			continue
		}
		s.written, written = true, true
		s.exp = expiry(c, s.now)
	}
	return written
}

// writeBackOp returns c's op when c is a write-back (opRefund, which wins
// over Force, or opForce), else opCheck.
func writeBackOp(c *store.Check) op {
	switch {
	case c.Refund:
		return opRefund
	case c.Force:
		return opForce
	}
	return opCheck
}

// evaluate decides the checks other than the write-backs in order against
// the tentative state (every check when peeking, as check-only), and
// reports whether a denied consuming check that is not a shadow vetoes the
// batch's consumption.
func evaluate(checks []store.Check, results []store.Result, slots []slot, idx []int, peek bool) (veto bool) {
	consuming := 0
	for i := range checks {
		if checks[i].Consuming() {
			consuming++
		}
	}
	for i := range checks {
		c := &checks[i]
		o := opCheck
		switch {
		case peek:
		case writeBackOp(c) != opCheck:
			continue
		case c.Hits > 0 && consuming == 1:
			o = opQueue
		case c.Hits > 0:
			o = opConsume
		}
		s := &slots[idx[i]]
		results[i] = s.st.apply(c, s.now, o)
		if o == opCheck {
			continue
		}
		if !results[i].Allowed && results[i].Lease.Hits > 0 {
			s.leased = true // a queued lease stands although the check was denied
			s.exp = expiry(c, s.now)
		}
		if results[i].Allowed {
			s.consumed = true
			s.exp = expiry(c, s.now)
		} else if !c.Shadow {
			veto = true
		}
	}
	return veto
}

// commit writes the batch's state: everything when no check vetoed, else
// only the write-backs. Existing entries go first, so that evictions that
// make room for new keys never touch an entry a later write of this batch
// refers to. The shards must be locked.
func commit(slots []slot, veto bool) {
	for pass := 0; pass < 2; pass++ {
		for j := range slots {
			s := &slots[j]
			if (s.ent != nil) != (pass == 0) {
				continue
			}
			switch {
			case (!veto && (s.written || s.consumed)) || s.leased:
				s.shard.write(s.ent, s.key, s.st, s.exp, s.now)
			case s.written:
				s.shard.write(s.ent, s.key, s.base, s.baseExp, s.now)
			}
		}
	}
}

// sweepOther sweeps a pseudo-random shard not in locked, so that shards no
// traffic reaches any more are reclaimed too. TryLock: never wait for it.
func (m *Store) sweepOther(slots []slot, locked uint64, now int64) {
	if len(slots) == 0 {
		return
	}
	si := ((slots[0].hash ^ uint64(now)) * 0x9e3779b97f4a7c15 >> 32) & m.mask
	if locked&(1<<si) != 0 {
		return
	}
	if sh := &m.shards[si]; sh.mu.TryLock() {
		sh.sweep(now)
		sh.mu.Unlock()
	}
}
