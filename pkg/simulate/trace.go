package simulate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Event is one request of a trace: when it arrives, which counter it
// counts against and how many hits it asks for.
type Event struct {
	At   int64  // microseconds; windows are aligned to multiples of the window from 0 (the Unix epoch for absolute times)
	Key  string // the counter: events with equal keys share state
	Hits uint64 // at least 1
	Line int    // the CSV line it came from; 0 for a generated event
}

// Trace is a named sequence of events in time order (ties keep their
// input order).
type Trace struct {
	Name   string
	Seed   uint64 // the random stream of a generated trace; 0 for a CSV one
	Events []Event
	// Skipped counts CSV rows whose descriptor matched no rule or another
	// rule than the one simulated (Source.Key returned ok false).
	Skipped int
}

// KeyFunc maps a CSV row's descriptor entries ("key=value" each, in order)
// to the counter they count against; ok false skips the row (it matched
// another rule, or none). An empty entries slice is a row without
// descriptor columns.
type KeyFunc func(entries []string) (key string, ok bool)

// ReadCSV reads a trace: one request per line,
//
//	timestamp,key=value[,key=value...][,hits]
//
// timestamp in seconds (a decimal number, at most microsecond precision
// counts; absolute Unix time or from any origin: windows are aligned to
// multiples of the window from 0), then the descriptor's entries, then
// optionally the hits (a whole number >= 1; default 1). Blank lines and
// lines starting with '#' are ignored, and so is a first line whose first
// field is "timestamp" (a header). Fields are trimmed of spaces. Rows need
// not be in time order. Errors name the file and line: name:line: what.
// A trace of more than MaxKeys distinct keys is a *KeyCapError at the row
// that crossed it.
// It stops with ctx's error when ctx is done, looking at it every few
// thousand events.
func ReadCSV(ctx context.Context, r io.Reader, name string, key KeyFunc) (Trace, error) {
	return readCSV(ctx, r, name, key, MaxKeys)
}

func readCSV(ctx context.Context, r io.Reader, name string, key KeyFunc, maxKeys int) (Trace, error) {
	tr := Trace{Name: name}
	keys := keySet{seen: map[string]string{}, max: maxKeys} // and a look at ctx every few thousand events
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Split(text, ",")
		for i := range fields {
			fields[i] = strings.TrimSpace(fields[i])
		}
		if len(tr.Events) == 0 && tr.Skipped == 0 && strings.EqualFold(fields[0], "timestamp") {
			continue // a header
		}
		ev, entries, err := parseRow(fields)
		if err != nil {
			return Trace{}, fmt.Errorf("%s:%d: %v", name, line, err)
		}
		k, ok := key(entries)
		if !ok {
			tr.Skipped++
			continue
		}
		ev.Line = line
		if ev.Key, err = keys.add(ctx, k, name, line); err != nil {
			return Trace{}, err
		}
		tr.Events = append(tr.Events, ev)
	}
	if err := sc.Err(); err != nil {
		return Trace{}, fmt.Errorf("%s:%d: %v", name, line+1, err)
	}
	if len(tr.Events) == 0 {
		if tr.Skipped > 0 {
			return Trace{}, fmt.Errorf("%s: none of its %d rows matches the rule simulated", name, tr.Skipped)
		}
		return Trace{}, fmt.Errorf("%s: no requests in it", name)
	}
	slices.SortStableFunc(tr.Events, func(a, b Event) int { return cmpInt(a.At, b.At) })
	return tr, nil
}

// parseRow reads a CSV row's trimmed fields: the event's time and hits
// (Key and Line unset), and its descriptor entries.
func parseRow(fields []string) (ev Event, entries []string, err error) {
	at, err := parseSeconds(fields[0])
	if err != nil {
		return Event{}, nil, fmt.Errorf("timestamp %q: %v", fields[0], err)
	}
	ev = Event{At: at, Hits: 1}
	entries = fields[1:]
	if n := len(entries); n > 0 && !strings.Contains(entries[n-1], "=") {
		h, err := strconv.ParseUint(entries[n-1], 10, 64)
		if err != nil || h == 0 || h > maxHits {
			return Event{}, nil, fmt.Errorf("hits %q: want a whole number from 1 to %d (descriptor entries are key=value)", entries[n-1], uint64(maxHits))
		}
		ev.Hits, entries = h, entries[:n-1]
	}
	for _, e := range entries {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return Event{}, nil, fmt.Errorf("descriptor entry %q: want key=value (hits, if any, come last)", e)
		}
	}
	return ev, entries, nil
}

// maxHits bounds a row's hits: the stores' counts stay exact below 2^53.
const maxHits = 1 << 53

// maxSeconds bounds a timestamp: microseconds stay within int64 by far.
const maxSeconds = 1 << 40

// parseSeconds reads a non-negative decimal number of seconds as whole
// microseconds, exactly (no float rounding): digits beyond the sixth
// decimal place are dropped.
func parseSeconds(s string) (int64, error) {
	intPart, frac, _ := strings.Cut(s, ".")
	if intPart == "" && frac == "" || strings.Trim(intPart, "0123456789") != "" || strings.Trim(frac, "0123456789") != "" {
		return 0, errors.New("want seconds as a non-negative decimal number, such as 12.5 or 1751540400.123456")
	}
	sec := int64(0)
	if intPart != "" {
		v, err := strconv.ParseInt(intPart, 10, 64)
		if err != nil || v > maxSeconds {
			return 0, fmt.Errorf("want at most %d seconds", int64(maxSeconds))
		}
		sec = v
	}
	frac = (frac + "000000")[:6]
	us, _ := strconv.ParseInt(frac, 10, 64)
	return sec*1_000_000 + us, nil
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// StandardGenerators are the traces of the generator "standard" and of
// docs/algorithms.md's "Choosing an algorithm" table: Poisson arrivals at
// 0.9, 1.1 and 2 times the limit, on/off bursts and a boundary attack.
var StandardGenerators = []string{
	"poisson:rate=0.9L",
	"poisson:rate=1.1L",
	"poisson:rate=2L",
	"onoff",
	"boundary",
}

// GeneratorHelp describes the generator specs Generate accepts.
const GeneratorHelp = `generators (W is the window, L the limit; every parameter is optional):
  poisson:rate=R,duration=D            Poisson arrivals at R (default 1.1L) for D (default 20W)
  onoff:rate=R,on=D1,off=D2,duration=D Poisson at R (default 4L) for D1 (default W/4), then
                                       nothing for D2 (default 3W/4), repeated; starts on a window
  boundary:n=N,spread=S,every=E,duration=D
                                       N requests (default L) evenly in the S (default W/20) before
                                       a window boundary and N in the S after it, at every E
                                       (default 2W) from the first boundary
  standard                             the five traces of docs/algorithms.md's table: poisson at 0.9L,
                                       1.1L and 2L, onoff and boundary, with their defaults
  R is requests per window as a multiple of L ("1.1L") or per second ("55"); N a count or a
  multiple of L; durations as in Go ("500ms", "20s").`

// GenError is a generator spec Generate cannot make a trace of: Spec is
// the spec, Msg what is wrong with it. The caller names the setting that
// gave the spec its own way (a flag, say).
type GenError struct {
	Spec string
	Msg  string
}

// Error is the message with the spec.
func (e *GenError) Error() string { return fmt.Sprintf("generator %q: %s", e.Spec, e.Msg) }

// Generate makes the trace a generator spec describes (GeneratorHelp) for
// a limit of limit requests per window, every event on key with one hit,
// from the random stream seed. The first event comes at or after 0, a
// window boundary. Errors are *GenError.
func Generate(spec string, limit uint64, window time.Duration, seed uint64, key string) (Trace, error) {
	kind, params, _ := strings.Cut(spec, ":")
	g := genParams{limit: float64(limit), window: window}
	if err := g.parse(params); err != nil {
		return Trace{}, &GenError{Spec: spec, Msg: err.Error()}
	}
	rng := rand.New(rand.NewPCG(seed, 0x17))
	w := window.Microseconds()
	var at []int64
	var err error
	switch kind {
	case "poisson":
		at, err = g.poisson(rng)
	case "onoff":
		at, err = g.onoff(rng)
	case "boundary":
		at, err = g.boundary(w)
	default:
		return Trace{}, &GenError{Spec: spec, Msg: fmt.Sprintf("unknown generator %q: want poisson, onoff, boundary or standard", kind)}
	}
	if err == nil {
		err = g.unused()
	}
	if err != nil {
		return Trace{}, &GenError{Spec: spec, Msg: err.Error()}
	}
	if len(at) == 0 {
		return Trace{}, &GenError{Spec: spec, Msg: "the trace has no requests (a longer duration or a higher rate?)"}
	}
	tr := Trace{Name: spec, Seed: seed, Events: make([]Event, len(at))}
	for i, t := range at {
		tr.Events[i] = Event{At: t, Key: key, Hits: 1}
	}
	return tr, nil
}

// genParams holds a generator's parameters as given, and which were used.
type genParams struct {
	limit  float64
	window time.Duration
	vals   map[string]string
	used   map[string]bool
}

func (g *genParams) parse(s string) error {
	g.vals, g.used = map[string]string{}, map[string]bool{}
	if s == "" {
		return nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || v == "" {
			return fmt.Errorf("parameter %q: want name=value", kv)
		}
		if _, dup := g.vals[k]; dup {
			return fmt.Errorf("parameter %s given twice", k)
		}
		g.vals[k] = v
	}
	return nil
}

// unused reports a parameter the generator does not take.
func (g *genParams) unused() error {
	for k := range g.vals {
		if !g.used[k] {
			return fmt.Errorf("unknown parameter %q", k)
		}
	}
	return nil
}

// rate returns parameter name as requests per microsecond: "1.1L" is 1.1
// times the limit per window, a plain number is per second.
func (g *genParams) rate(name string, def float64) (float64, error) {
	g.used[name] = true
	v, ok := g.vals[name]
	if !ok {
		return def * g.limit / float64(g.window.Microseconds()), nil
	}
	if x, ok := strings.CutSuffix(v, "L"); ok {
		f, err := strconv.ParseFloat(x, 64)
		if err != nil || !(f > 0) || math.IsInf(f, 0) {
			return 0, fmt.Errorf("%s=%s: want a positive multiple of L such as 1.1L", name, v)
		}
		return f * g.limit / float64(g.window.Microseconds()), nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("%s=%s: want requests per second (55) or a multiple of the limit per window (1.1L)", name, v)
	}
	return f / 1e6, nil
}

// count returns parameter name as a number of requests: "1.2L" or "60".
func (g *genParams) count(name string, def float64) (int, error) {
	g.used[name] = true
	v, ok := g.vals[name]
	f := def * g.limit
	if ok {
		x, isL := strings.CutSuffix(v, "L")
		var err error
		if f, err = strconv.ParseFloat(x, 64); err != nil || f < 0 || math.IsInf(f, 0) {
			return 0, fmt.Errorf("%s=%s: want a count (60) or a multiple of L (1.2L)", name, v)
		}
		if isL {
			f *= g.limit
		}
	}
	if f > 1e7 {
		return 0, fmt.Errorf("%s=%s: at most 10,000,000 requests", name, v)
	}
	return int(math.Round(f)), nil
}

// duration returns parameter name in microseconds, def windows when absent.
func (g *genParams) duration(name string, def float64) (int64, error) {
	g.used[name] = true
	v, ok := g.vals[name]
	if !ok {
		return int64(def * float64(g.window.Microseconds())), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s=%s: want a positive duration such as 500ms or 20s", name, v)
	}
	if d < time.Microsecond {
		return 0, fmt.Errorf("%s=%s: at least 1µs", name, v)
	}
	return d.Microseconds(), nil
}

// maxEvents bounds a generated trace.
const maxEvents = 10_000_000

func (g *genParams) poisson(rng *rand.Rand) ([]int64, error) {
	rate, err := g.rate("rate", 1.1)
	if err != nil {
		return nil, err
	}
	dur, err := g.duration("duration", 20)
	if err != nil {
		return nil, err
	}
	return arrivals(rng, rate, 0, dur, nil)
}

func (g *genParams) onoff(rng *rand.Rand) ([]int64, error) {
	rate, err := g.rate("rate", 4)
	if err != nil {
		return nil, err
	}
	on, err := g.duration("on", 0.25)
	if err != nil {
		return nil, err
	}
	off, err := g.duration("off", 0.75)
	if err != nil {
		return nil, err
	}
	dur, err := g.duration("duration", 20)
	if err != nil {
		return nil, err
	}
	var at []int64
	for start := int64(0); start < dur; start += on + off {
		if at, err = arrivals(rng, rate, start, min(start+on, dur), at); err != nil {
			return nil, err
		}
	}
	return at, nil
}

func (g *genParams) boundary(w int64) ([]int64, error) {
	n, err := g.count("n", 1)
	if err != nil {
		return nil, err
	}
	spread, err := g.duration("spread", 0.05)
	if err != nil {
		return nil, err
	}
	every, err := g.duration("every", 2)
	if err != nil {
		return nil, err
	}
	dur, err := g.duration("duration", 20)
	if err != nil {
		return nil, err
	}
	if spread > w {
		return nil, fmt.Errorf("spread=%v: at most the window (%v)", time.Duration(spread)*time.Microsecond, time.Duration(w)*time.Microsecond)
	}
	if int64(2*n)*(dur/every+1) > maxEvents {
		return nil, fmt.Errorf("more than %d requests", maxEvents)
	}
	var at []int64
	// The boundaries: the first window boundary, then one every E.
	for b := w; b-spread < dur; b += every {
		// n evenly in [b-spread, b), then n evenly in [b, b+spread).
		for i := range n {
			if t := b - spread + int64(i)*spread/int64(n); t < dur {
				at = append(at, t)
			}
		}
		for i := range n {
			if t := b + int64(i)*spread/int64(n); t < dur {
				at = append(at, t)
			}
		}
	}
	return at, nil
}

// arrivals appends to at the arrival times of a Poisson process of rate
// (per microsecond) in [from, to).
func arrivals(rng *rand.Rand, rate float64, from, to int64, at []int64) ([]int64, error) {
	t := float64(from)
	for {
		t += rng.ExpFloat64() / rate
		if t >= float64(to) {
			return at, nil
		}
		if len(at) >= maxEvents {
			return nil, fmt.Errorf("more than %d requests", maxEvents)
		}
		at = append(at, int64(t))
	}
}
