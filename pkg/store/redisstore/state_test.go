package redisstore

import (
	"encoding/binary"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/rls-project/rls/pkg/store"
	"github.com/rls-project/rls/pkg/store/redisstore/lua"
)

// The tag bytes of decide.lua's stored state (TAG_* in decide.lua).
const (
	tagTokenBucket = 't'
	tagPrecise     = 'p'
)

// state is a token bucket's or a precision window's state as decide.lua
// stores it: a tag byte and little-endian IEEE-754 doubles (see decide.lua's
// header). The tests read and write it with parseState and encode.
type state struct {
	Algorithm store.Algorithm
	// Token bucket: Tokens, and LastRefill in Unix microseconds.
	Tokens, LastRefill float64
	// Sliding window of precision len(Old) >= 2: Window is the sub-window
	// index, Count its count, Old the counts of the sub-windows before it,
	// newest first.
	Window, Count float64
	Old           []float64
}

// parseState decodes a state decide.lua stored.
func parseState(v string) (state, error) {
	f := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[1+8*i:]))) }
	switch {
	case len(v) == 17 && v[0] == tagTokenBucket:
		return state{Algorithm: store.TokenBucket, Tokens: f(0), LastRefill: f(1)}, nil
	case len(v) >= 25 && (len(v)-25)%8 == 0 && v[0] == tagPrecise && f(0) == float64((len(v)-25)/8):
		st := state{Algorithm: store.SlidingWindow, Window: f(1), Count: f(2)}
		for i := range (len(v) - 25) / 8 {
			st.Old = append(st.Old, f(3+i))
		}
		return st, nil
	}
	return state{}, fmt.Errorf("not a decide.lua state: %q", v)
}

// encode returns s as decide.lua stores it.
func (s state) encode() string {
	b := []byte{tagTokenBucket}
	fs := []float64{s.Tokens, s.LastRefill}
	if s.Algorithm != store.TokenBucket {
		b[0], fs = tagPrecise, append([]float64{float64(len(s.Old)), s.Window, s.Count}, s.Old...)
	}
	for _, x := range fs {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return string(b)
}

func TestStateRoundTrip(t *testing.T) {
	want := fmt.Sprintf("local TAG_TOKEN_BUCKET, TAG_PRECISE = '%c', '%c'", tagTokenBucket, tagPrecise)
	if !strings.Contains(lua.DecideSource, want) {
		t.Errorf("decide.lua does not say %q", want)
	}
	for _, s := range []state{
		{Algorithm: store.TokenBucket, Tokens: 1.5, LastRefill: 1751538000250123},
		{Algorithm: store.SlidingWindow, Window: 105092280017, Count: 4, Old: []float64{1, 0, 7}},
	} {
		got, err := parseState(s.encode())
		if err != nil || !reflect.DeepEqual(got, s) {
			t.Errorf("parseState(encode(%+v)) = %+v, %v", s, got, err)
		}
	}
	for _, v := range []string{"", "12", "s", "x" + strings.Repeat("\x00", 24), "t" + strings.Repeat("\x00", 24)} {
		if _, err := parseState(v); err == nil {
			t.Errorf("parseState(%q) succeeded", v)
		}
	}
}
