package lru

import (
	"fmt"
	"testing"
)

// order returns the keys from the oldest to the newest.
func order[V any](l *List[V]) []string {
	var keys []string
	for n := l.Oldest(); n != nil; n = n.Newer() {
		keys = append(keys, n.Key)
	}
	return keys
}

func TestOrderAndCost(t *testing.T) {
	l := New[int](2)
	a := l.Add("a", 1, 10)
	l.Add("b", 2, 20)
	c := l.Add("c", 3, 30)
	if got := fmt.Sprint(order(l)); got != "[a b c]" {
		t.Fatalf("order %s, want [a b c]", got)
	}
	l.Touch(a)
	if got := fmt.Sprint(order(l)); got != "[b c a]" {
		t.Fatalf("after touching a: %s, want [b c a]", got)
	}
	if l.Len() != 3 || l.Bytes() != 60 {
		t.Fatalf("len %d bytes %d, want 3 and 60", l.Len(), l.Bytes())
	}
	l.SetCost(c, 5)
	l.Remove(l.Oldest())
	if l.Get("b") != nil || l.Len() != 2 || l.Bytes() != 15 {
		t.Fatalf("after removing b: get %v len %d bytes %d, want nil, 2, 15", l.Get("b"), l.Len(), l.Bytes())
	}
	if got := fmt.Sprint(order(l)); got != "[c a]" {
		t.Fatalf("order %s, want [c a]", got)
	}
	l.Remove(a)
	l.Remove(c)
	if l.Oldest() != nil || l.Len() != 0 || l.Bytes() != 0 {
		t.Fatal("not empty after removing every entry")
	}
	d := l.Add("d", 4, 1) // reuses a removed node
	if d.Value != 4 || d.Key != "d" || d.Newer() != nil || l.Get("d") != d {
		t.Fatalf("reused node %+v", d)
	}
}

func TestTouchNewestAndSingle(t *testing.T) {
	l := New[string](0)
	n := l.Add("x", "v", 1)
	l.Touch(n)
	if l.Oldest() != n || n.Newer() != nil {
		t.Fatal("a single entry is both the oldest and the newest")
	}
	m := l.Add("y", "w", 1)
	l.Touch(m) // already the newest
	if got := fmt.Sprint(order(l)); got != "[x y]" {
		t.Fatalf("order %s, want [x y]", got)
	}
}
