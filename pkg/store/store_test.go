package store

import (
	"strings"
	"testing"
)

func TestAlgorithmNames(t *testing.T) {
	for _, tc := range []struct {
		a    Algorithm
		name string
	}{
		{SlidingWindow, "sliding_window"},
		{TokenBucket, "token_bucket"},
		{FixedWindow, "fixed_window"},
	} {
		if got := tc.a.String(); got != tc.name {
			t.Errorf("%d.String() = %q, want %q", tc.a, got, tc.name)
		}
		for _, s := range []string{tc.name, strings.ToUpper(tc.name)} {
			if got, ok := ParseAlgorithm(s); !ok || got != tc.a {
				t.Errorf("ParseAlgorithm(%q) = %v, %v; want %v, true", s, got, ok, tc.a)
			}
		}
	}
	if got := Algorithm(9).String(); got != "unknown" {
		t.Errorf("Algorithm(9).String() = %q, want unknown", got)
	}
	for _, s := range []string{"", "unknown", "sliding", "token-bucket", " fixed_window"} {
		if a, ok := ParseAlgorithm(s); ok {
			t.Errorf("ParseAlgorithm(%q) = %v, true; want false", s, a)
		}
	}
}
