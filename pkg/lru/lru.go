// Package lru is a map from string keys to values that keeps its entries
// in the order they were last touched, with a cost per entry, for the
// bounded tables of rls (the limiter's local tables, the memory store's
// counters). It decides nothing itself: the caller touches what it uses,
// and removes the oldest entries while it is over its own caps (a number of
// entries, Bytes), which lets each table choose what counts as a use.
package lru

// List is the map and its order. It is not safe for concurrent use: each
// table locks around it (per shard). The zero value is not usable; make one
// with New.
type List[V any] struct {
	m          map[string]*Node[V]
	head, tail *Node[V] // head is the most recently touched
	bytes      int64
	free       *Node[V] // removed nodes kept for reuse, linked by older
	nfree      int
	maxFree    int
}

// Node is one entry: its key, value and cost. Value may be changed in
// place; Key and Cost only through the List.
type Node[V any] struct {
	Key          string
	Value        V
	cost         int64
	newer, older *Node[V]
}

// New returns an empty List that keeps up to keepFree removed nodes for
// reuse by Add (0: none), sparing an allocation per new entry in a table
// that churns.
func New[V any](keepFree int) *List[V] {
	return &List[V]{m: make(map[string]*Node[V]), maxFree: keepFree}
}

// Get returns key's node, or nil, without touching it.
func (l *List[V]) Get(key string) *Node[V] { return l.m[key] }

// Len returns the number of entries.
func (l *List[V]) Len() int { return len(l.m) }

// Bytes returns the sum of the entries' costs.
func (l *List[V]) Bytes() int64 { return l.bytes }

// Oldest returns the least recently touched node, or nil when empty.
func (l *List[V]) Oldest() *Node[V] { return l.tail }

// Newer returns the node touched next after n, or nil when n is the newest.
func (n *Node[V]) Newer() *Node[V] { return n.newer }

// Cost returns what n counts in Bytes.
func (n *Node[V]) Cost() int64 { return n.cost }

// Add inserts key, which must not be present, with value and cost, as the
// most recently touched entry, and returns its node.
func (l *List[V]) Add(key string, value V, cost int64) *Node[V] {
	n := l.free
	if n != nil {
		l.free, l.nfree = n.older, l.nfree-1
		n.older = nil
	} else {
		n = new(Node[V])
	}
	n.Key, n.Value, n.cost = key, value, cost
	l.m[key] = n
	l.bytes += cost
	l.pushFront(n)
	return n
}

// Touch makes n the most recently touched entry.
func (l *List[V]) Touch(n *Node[V]) {
	if l.head == n {
		return
	}
	l.unlink(n)
	l.pushFront(n)
}

// SetCost changes what n counts in Bytes.
func (l *List[V]) SetCost(n *Node[V], cost int64) {
	l.bytes += cost - n.cost
	n.cost = cost
}

// Remove deletes n's entry. n must not be used afterwards.
func (l *List[V]) Remove(n *Node[V]) {
	l.unlink(n)
	delete(l.m, n.Key)
	l.bytes -= n.cost
	if l.nfree < l.maxFree {
		*n = Node[V]{older: l.free}
		l.free, l.nfree = n, l.nfree+1
	}
}

func (l *List[V]) unlink(n *Node[V]) {
	if n.newer != nil {
		n.newer.older = n.older
	} else {
		l.head = n.older
	}
	if n.older != nil {
		n.older.newer = n.newer
	} else {
		l.tail = n.newer
	}
	n.newer, n.older = nil, nil
}

func (l *List[V]) pushFront(n *Node[V]) {
	n.older = l.head
	if l.head != nil {
		l.head.newer = n
	}
	l.head = n
	if l.tail == nil {
		l.tail = n
	}
}
