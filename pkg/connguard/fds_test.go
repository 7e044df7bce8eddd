package connguard

import (
	"errors"
	"strings"
	"testing"
)

func TestFitFDs(t *testing.T) {
	for _, c := range []struct {
		max, ports int
		limit      uint64
		want       int
		err        string
	}{
		{1000, 3, 65536, 1000, ""},
		{1000, 3, 0, 1000, ""},    // limit unknown
		{0, 3, 1024, 0, ""},       // no cap
		{1000, 3, 3256, 1000, ""}, // exactly fits
		{1000, 2, 1024, 384, "each port is capped at 384 instead"},
		{1000, 3, 200, 0, "raise the limit"},
	} {
		got, err := FitFDs(c.max, c.ports, c.limit)
		var fe *FDError
		if got != c.want || (c.err == "") != (err == nil) || (err != nil && (!errors.As(err, &fe) || !strings.Contains(err.Error(), c.err))) {
			t.Errorf("FitFDs(%d, %d, %d) = %d, %v; want %d and an error containing %q", c.max, c.ports, c.limit, got, err, c.want, c.err)
		}
	}
	if FDLimit() == 0 {
		t.Error("FDLimit() = 0 on this system")
	}
}
