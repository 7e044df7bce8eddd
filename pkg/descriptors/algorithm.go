package descriptors

import "strings"

// Algorithm is a rule's counting algorithm (rate_limit.algorithm, an rls
// extension). The service maps it to the store's algorithm of the same name.
type Algorithm uint8

// The algorithms. The zero value is the default, the sliding-window counter.
const (
	SlidingWindow Algorithm = iota
	TokenBucket
	FixedWindow
)

// String returns the algorithm's configuration name ("sliding_window",
// "token_bucket", "fixed_window"), or "unknown" for any other value.
func (a Algorithm) String() string {
	switch a {
	case SlidingWindow:
		return "sliding_window"
	case TokenBucket:
		return "token_bucket"
	case FixedWindow:
		return "fixed_window"
	}
	return "unknown"
}

// ParseAlgorithm returns the algorithm whose name equals s in lower case
// ("token_bucket", "TOKEN_BUCKET"). ok is false for any other string.
func ParseAlgorithm(s string) (a Algorithm, ok bool) {
	s = strings.ToLower(s)
	for a := SlidingWindow; a <= FixedWindow; a++ {
		if s == a.String() {
			return a, true
		}
	}
	return 0, false
}

// MaxPrecision is the most sub-windows a sliding_window rule's precision
// may ask for (store.MaxPrecision).
const MaxPrecision = 60
