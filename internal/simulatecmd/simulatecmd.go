// Package simulatecmd is rls simulate: its flags, help and errors, around
// pkg/simulate.
package simulatecmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/pkg/descriptors"
	"github.com/rls-project/rls/pkg/simulate"
)

// simulateFlags are rls simulate's flags.
type simulateFlags struct {
	configDir    string
	rule         string
	mergeDomains bool
	limit        uint64
	window       time.Duration
	precisions   string
	trace        string
	gens         multiFlag
	seed         uint64
	jsonOut      string
	svgOut       string
}

// multiFlag is a flag that may be given several times.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func newSimulateFlagSet(f *simulateFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("rls simulate", flag.ContinueOnError)
	fs.StringVar(&f.configDir, "config", "", "descriptor config directory: simulate one of its rules (--rule, else the first limited rule)")
	fs.StringVar(&f.rule, "rule", "", "the rule to simulate, as the descriptor that matches it: domain:key=value[,key=value...] (needs --config)")
	fs.BoolVar(&f.mergeDomains, "merge-domains", false, "let several files of --config define one domain, as rls serve --merge-domains does")
	fs.Uint64Var(&f.limit, "limit", 0, "without --config: the limit, requests per --window")
	fs.DurationVar(&f.window, "window", time.Second, "without --config: the window, a whole number of seconds")
	fs.StringVar(&f.precisions, "precisions", "2,5,10,20,60", "sliding-window precisions to compare besides the two-counter window (2 to 60, comma-separated; empty for none)")
	fs.StringVar(&f.trace, "trace", "", "CSV trace: timestamp seconds, then the descriptor's key=value entries, then optionally the hits (one request a line)")
	fs.Var(&f.gens, "gen", "generated trace (repeatable): poisson[:rate=R,duration=D], onoff[:rate=R,on=D,off=D,duration=D], boundary[:n=N,spread=D,every=D,duration=D] or standard (the five of docs/algorithms.md)")
	fs.Uint64Var(&f.seed, "seed", 1, "random seed of the generated traces")
	fs.StringVar(&f.jsonOut, "json", "", "also write the results as JSON to this file (- for stdout, instead of the tables)")
	fs.StringVar(&f.svgOut, "svg", "", "also draw admitted-per-trailing-window over time as SVG into this file (with several traces: FILE-1.svg, FILE-2.svg, ...)")
	return fs
}

const simulateUsage = `usage: rls simulate (--config DIR [--rule DOMAIN:KEY=VALUE,...] | --limit L [--window 1s])
                    (--trace FILE.csv | --gen SPEC ...) [--precisions 2,5,10,20,60]
                    [--seed N] [--json FILE] [--svg FILE]

Replays a trace through every algorithm and precision the rule could use
(sliding window with two counters and with each precision, fixed window,
token buckets of burst L and L/10; '*' marks the rule's own), with the
stores' own arithmetic on a simulated clock, and compares each with an
exact sliding log: a request is admitted by the log iff the hits it
admitted in the trailing window (t-W, t], plus the request's, are at most L.

Per candidate: peak/L, the most hits admitted in any trailing window over
the limit (the busiest key's); wrongly admitted, requests it admitted that
the exact log denied (share of the log's denials); wrongly denied, requests
it denied that the log admitted (share of the log's admissions); Redis
script calls and commands per decision (pkg/simulate's RedisCost); Redis
MEMORY USAGE per key of its state.

CSV: timestamp,key=value[,key=value...][,hits] a line; timestamp in
seconds (12.5 or 1751540400.123456; windows align to multiples of the
window from 0); '#' lines and a "timestamp,..." header are skipped. With
--config, rows whose descriptor matches another rule are skipped; a row
without entries counts against --rule's descriptor.

`

// Run is rls simulate with args, writing its output and help to stdout. A
// help request returns flag.ErrHelp; other errors name the flag at fault.
func Run(ctx context.Context, args []string, stdout io.Writer) error {
	var f simulateFlags
	fs := newSimulateFlagSet(&f)
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, simulateUsage)
		fmt.Fprintln(stdout, "Flags:")
		fs.VisitAll(func(fl *flag.Flag) {
			fmt.Fprintf(stdout, "  --%s (default %q)\n    \t%s\n", fl.Name, fl.DefValue, fl.Usage)
		})
		fmt.Fprintf(stdout, "\n%s\n", simulate.GeneratorHelp)
		return err
	} else if err != nil {
		msg := strings.Replace(err.Error(), "flag -", "flag --", 1)
		return fmt.Errorf("simulate: %s (rls simulate --help lists the flags)", msg)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("simulate: unexpected argument %q (rls simulate --help)", fs.Arg(0))
	}
	return f.run(ctx, stdout)
}

// setup resolves the flags that say what to simulate (simulate.NewSetup),
// naming the flag of a bad one.
func (f *simulateFlags) setup() (*simulate.Setup, error) {
	precisions, err := simulate.ParsePrecisions(f.precisions)
	if err != nil {
		return nil, fmt.Errorf("--precisions: %v", err)
	}
	src, err := f.source()
	if err != nil {
		return nil, err
	}
	su, err := simulate.NewSetup(src, precisions)
	var oe *simulate.OptionError
	if errors.As(err, &oe) {
		return nil, fmt.Errorf("%s: %s", map[string]string{
			"Config":  "--config " + f.configDir,
			"Entries": "--rule " + f.rule,
			"Limit":   "--limit/--window",
		}[oe.Option], oe.Msg)
	}
	return su, err
}

// source checks which of --config (with --rule, --merge-domains) and
// --limit (with --window) is given, and reads it.
func (f *simulateFlags) source() (simulate.Source, error) {
	if f.configDir == "" {
		if f.rule != "" || f.mergeDomains {
			return simulate.Source{}, errors.New("--rule and --merge-domains need --config")
		}
		if f.limit == 0 {
			return simulate.Source{}, errors.New("give --config DIR (and --rule) or --limit L (rls simulate --help)")
		}
		return simulate.Source{Limit: simulate.Limit{Requests: f.limit, Window: f.window}}, nil
	}
	if f.limit != 0 {
		return simulate.Source{}, errors.New("--limit: give either --config (the rule's limit) or --limit")
	}
	cfg, _, err := descriptors.Load(f.configDir, descriptors.LoadOptions{MergeDomains: f.mergeDomains})
	if err != nil {
		return simulate.Source{}, fmt.Errorf("--config %s: %v", f.configDir, err)
	}
	src := simulate.Source{Config: cfg}
	if f.rule != "" {
		src.Domain, src.Entries, err = parseRuleFlag(f.rule)
	}
	return src, err
}

// parseRuleFlag reads --rule: domain:key=value[,key=value...].
func parseRuleFlag(s string) (string, []*rlcommon.RateLimitDescriptor_Entry, error) {
	domain, rest, ok := strings.Cut(s, ":")
	if !ok || domain == "" || rest == "" {
		return "", nil, fmt.Errorf("--rule %q: want domain:key=value[,key=value...]", s)
	}
	var es []*rlcommon.RateLimitDescriptor_Entry
	for _, kv := range strings.Split(rest, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return "", nil, fmt.Errorf("--rule %q: entry %q: want key=value", s, kv)
		}
		es = append(es, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return domain, es, nil
}

func (f *simulateFlags) run(ctx context.Context, stdout io.Writer) error {
	su, err := f.setup()
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	traces, err := f.traces(ctx, su)
	if err != nil {
		return fmt.Errorf("simulate: %w", err)
	}
	reps, stopped := simulate.RunAll(ctx, traces, su.Limit, su.Candidates) // on SIGINT or SIGTERM, what it has
	if reps == nil {
		return fmt.Errorf("simulate: %w", stopped)
	}
	if f.jsonOut != "-" {
		if err := writeTables(stdout, reps); err != nil {
			return err
		}
	}
	if f.jsonOut != "" {
		if err := writeOut(f.jsonOut, stdout, func(w io.Writer) error { return simulate.WriteJSON(w, reps) }); err != nil {
			return fmt.Errorf("simulate: --json: %w", err)
		}
	}
	if err := f.writeSVGs(stdout, reps); err != nil {
		return err
	}
	return stopped
}

// traces reads --trace and generates the --gen traces.
func (f *simulateFlags) traces(ctx context.Context, su *simulate.Setup) ([]simulate.Trace, error) {
	var traces []simulate.Trace
	if f.trace != "" {
		file, err := os.Open(f.trace)
		if err != nil {
			return nil, fmt.Errorf("--trace: %w", err)
		}
		tr, err := simulate.ReadCSV(ctx, file, f.trace, su.Key)
		file.Close()
		if err != nil {
			return nil, fmt.Errorf("--trace %w", err)
		}
		traces = append(traces, tr)
	}
	gen, err := su.Generate(f.gens, f.seed)
	var ge *simulate.GenError
	if errors.As(err, &ge) {
		return nil, fmt.Errorf("--gen %q: %s", ge.Spec, ge.Msg)
	} else if err != nil {
		return nil, err
	}
	if traces = append(traces, gen...); len(traces) == 0 {
		return nil, errors.New("no trace: give --trace FILE.csv or --gen SPEC (rls simulate --help)")
	}
	return traces, nil
}

// writeTables prints one table per report, and a summary of several.
func writeTables(stdout io.Writer, reps []*simulate.Report) error {
	for i, rep := range reps {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		if err := simulate.WriteTable(stdout, rep); err != nil {
			return err
		}
	}
	if len(reps) < 2 {
		return nil
	}
	fmt.Fprintln(stdout)
	return simulate.WriteSummary(stdout, reps)
}

// writeSVGs draws each report into --svg (FILE-1.svg, ... for several).
func (f *simulateFlags) writeSVGs(stdout io.Writer, reps []*simulate.Report) error {
	if f.svgOut == "" {
		return nil
	}
	for i, rep := range reps {
		name := f.svgOut
		if len(reps) > 1 {
			ext := filepath.Ext(name)
			name = fmt.Sprintf("%s-%d%s", strings.TrimSuffix(name, ext), i+1, ext)
		}
		if err := writeOut(name, nil, func(w io.Writer) error { return simulate.WriteSVG(w, rep) }); err != nil {
			return fmt.Errorf("simulate: --svg: %w", err)
		}
		if f.jsonOut != "-" {
			fmt.Fprintf(stdout, "wrote %s (%s)\n", name, rep.Trace)
		}
	}
	return nil
}

// writeOut writes to the file name, or to stdout when name is "-" and
// stdout is not nil.
func writeOut(name string, stdout io.Writer, write func(io.Writer) error) error {
	if name == "-" && stdout != nil {
		return write(stdout)
	}
	file, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := write(file); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}
