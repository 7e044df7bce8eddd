package rlqs

import (
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// budget is the one memory budget, in bytes, of every stream of a Server:
// reports being decoded and handled, buckets kept, responses queued, each
// counted before it is made; a stream holds at most a quarter of it
// (docs/rlqs.md, "One memory budget"). Safe for concurrent use.
type budget struct {
	max, perStream int64
	used           atomic.Int64
}

func newBudget(max int64) *budget {
	return &budget{max: max, perStream: max / 4}
}

// take counts n more bytes for st (held is st's count), or reports why
// they do not fit.
func (b *budget) take(held *atomic.Int64, n int64) error {
	if h := held.Load(); h+n > b.perStream {
		return status.Errorf(codes.ResourceExhausted, "this RLQS stream would hold %d bytes (its buckets' BucketIds, its report, its unsent responses), over its part of rls's stream memory budget (%d of %d bytes): rls ended it; use fewer or smaller buckets per stream", h+n, b.perStream, b.max)
	}
	for {
		u := b.used.Load()
		if u+n > b.max {
			return status.Errorf(codes.ResourceExhausted, "rls's RLQS streams hold %d bytes of their memory budget of %d bytes; %d more for this stream would pass it: rls ended this stream (reconnect later, or to another replica)", u, b.max, n)
		}
		if b.used.CompareAndSwap(u, u+n) {
			held.Add(n)
			return nil
		}
	}
}

// give returns n bytes st (held) had taken.
func (b *budget) give(held *atomic.Int64, n int64) {
	if n == 0 {
		return
	}
	held.Add(-n)
	b.used.Add(-n)
}

// Costs of what a stream keeps beyond the bytes of its strings: a bucket
// (its struct, its map, its timers' share), an entry of a BucketId map,
// and a decoded usage.
const (
	bucketCost = 640
	entryCost  = 64
	usageCost  = 256
)

// reportCost is what decoding and handling b costs at most: its strings
// copied into maps and keys (three times its size covers the BucketIds,
// their canonical keys and the actions echoing them) and the structures
// of its usages and entries, counted by walking b without allocating. A
// message that is not a report walks short and costs its size.
func reportCost(b []byte) int64 {
	usages, entries := 0, 0
	_ = each(b, func(num protowire.Number, typ protowire.Type, _ uint64, data []byte) error {
		if num != 2 || typ != protowire.BytesType {
			return nil
		}
		usages++
		return each(data, func(num protowire.Number, typ protowire.Type, _ uint64, id []byte) error {
			if num == 1 && typ == protowire.BytesType {
				return each(id, func(num protowire.Number, _ protowire.Type, _ uint64, _ []byte) error {
					if num == 1 {
						entries++
					}
					return nil
				})
			}
			return nil
		})
	})
	return 3*int64(len(b)) + usageCost*int64(usages) + entryCost*int64(entries)
}

// keptCost is what a subscribed bucket of id keeps: its BucketId map and
// its canonical key (each about the id's bytes), and its structures.
func keptCost(id map[string]string) int64 {
	n := int64(bucketCost)
	for k, v := range id {
		n += 2*int64(len(k)+len(v)) + entryCost
	}
	return n
}
