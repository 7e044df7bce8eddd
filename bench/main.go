// Command rls-bench is rls's own load generator: it calls
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit on a local
// rls, closed loop (-c workers as fast as they can) or open loop (-rate
// requests/s, latency measured from each request's intended send time), and
// reports decisions/s, the verdicts, errors by gRPC code, latency
// percentiles and, given -server-pid and -redis-addr, the CPU and Redis work
// each decision costs.
//
// It calls through grpc-go's client, one ClientConn per -connections.
//
// It only ever targets this machine: -addr and -redis-addr must be loopback.
//
//	rls-bench -addr 127.0.0.1:8081 -c 50 -duration 10s -keys 1000 -dist roundrobin -server-pid $(pidof rls)
//	rls-bench -rate 5000 -duration 10s -d 'api_key=%k;route=/v1/search' -json
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if os.Getenv("GOGC") == "" {
		// The generator shares the machine with the server: collecting its
		// small heap less often keeps its own pauses and GC work out of
		// the server's measured latency. GOGC in the environment wins.
		debug.SetGCPercent(800)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "rls-bench:", err)
		}
		os.Exit(1)
	}
}

const (
	maxDuration  = 10 * time.Minute
	maxWarmup    = time.Minute
	maxWorkers   = 4096
	maxConns     = 256
	maxKeys      = 10_000_000
	maxRate      = 10_000_000
	maxKeySample = 100_000
)

type options struct {
	addr        string
	workers     int
	conns       int
	dur         time.Duration
	n           uint64
	rate        float64
	warmup      time.Duration
	keys        int
	dist        string
	zipfS       float64
	seed        uint64
	descriptors int
	templates   []string
	domain      string
	hits        uint
	prefix      string
	timeout     time.Duration
	pids        []int
	redisAddr   string
	keySample   int
	metricsURL  string
	json        bool
}

type listFlag struct{ vals *[]string }

func (f listFlag) String() string {
	if f.vals == nil {
		return ""
	}
	return strings.Join(*f.vals, " ")
}
func (f listFlag) Set(v string) error { *f.vals = append(*f.vals, v); return nil }

type pidsFlag struct{ pids *[]int }

func (f pidsFlag) String() string {
	if f.pids == nil || len(*f.pids) == 0 {
		return ""
	}
	return fmt.Sprint(*f.pids)
}

func (f pidsFlag) Set(v string) error {
	for s := range strings.SplitSeq(v, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || p < 1 {
			return fmt.Errorf("bad pid %q", s)
		}
		*f.pids = append(*f.pids, p)
	}
	return nil
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("rls-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8081", "rls gRPC `host:port`; loopback only (127.0.0.0/8, ::1, localhost)")
	fs.IntVar(&o.workers, "c", 32, "concurrency: worker goroutines, each with one request in flight")
	fs.IntVar(&o.conns, "connections", 1, "gRPC client connections, used round-robin")
	fs.DurationVar(&o.dur, "duration", 0, "measure for this long (at most 10m); -duration and/or -n is required")
	fs.Uint64Var(&o.n, "n", 0, "measure this many requests (whichever of -duration and -n comes first)")
	fs.Float64Var(&o.rate, "rate", 0, "open loop: send this many `requests/s` on a fixed schedule (0: closed loop)")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "warm-up run before measuring, excluded from every figure (0: none)")
	fs.IntVar(&o.keys, "keys", 1000, "number of distinct keys (%k in the descriptors)")
	fs.StringVar(&o.dist, "dist", "uniform", "key distribution: one, uniform, zipf or roundrobin")
	fs.Float64Var(&o.zipfS, "zipf-s", 1.1, "zipf exponent s (> 0): key k is drawn with weight 1/(k+1)^s")
	fs.Uint64Var(&o.seed, "seed", 1, "random seed for the key draws")
	fs.IntVar(&o.descriptors, "descriptors", 1, "descriptors per request, 1..4, from the defaults: "+strings.Join(bracket(defaultDescriptors), " "))
	fs.Var(listFlag{&o.templates}, "d", "a descriptor template, repeatable, replacing -descriptors: `'key=value;key=value'`;\n"+
		"in values %k is the key (-key-prefix + index), %n its index, %i an IPv4 address from it, %% a '%'")
	fs.StringVar(&o.domain, "domain", "example", "rate-limit domain")
	fs.UintVar(&o.hits, "hits", 0, "hits_addend of each request (0: unset, the server counts 1, as Envoy sends it)")
	fs.StringVar(&o.prefix, "key-prefix", "k", "prefix of the generated keys")
	fs.DurationVar(&o.timeout, "timeout", time.Second, "per-request deadline (0: none)")
	fs.Var(pidsFlag{&o.pids}, "server-pid", "`pid` of an rls process whose CPU to measure (repeatable, or comma-separated)")
	fs.StringVar(&o.redisAddr, "redis-addr", "", "Redis `host:port` (loopback) whose INFO cpu/stats/commandstats to measure")
	fs.IntVar(&o.keySample, "redis-key-sample", 0, "after the run, DBSIZE and the mean MEMORY USAGE of up to `n` keys found by SCAN\n"+
		"on -redis-addr, with INFO used_memory before the warm-up and after the run (0: none)")
	fs.StringVar(&o.metricsURL, "metrics-url", "", "rls Prometheus `URL` (loopback), e.g. http://127.0.0.1:8080/metrics: report the change of\n"+
		"rls_fallback_decisions_total, rls_local_cache_hits_total and rls_store_errors_total (decisions not made by the store)")
	fs.BoolVar(&o.json, "json", false, "print the report as JSON")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return o, o.validate(set)
}

func bracket(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%d=[%s]", i+1, s)
	}
	return out
}

func (o *options) validate(set map[string]bool) error {
	return errors.Join(slices.Concat(o.validateEndpoints(), o.validateTiming(), o.validateSizes(), o.validateRequest(set))...)
}

// complaints collects validation errors in the order they are found.
type complaints []error

func (c *complaints) bad(format string, a ...any) { *c = append(*c, fmt.Errorf(format, a...)) }

func (c *complaints) add(err error) {
	if err != nil {
		*c = append(*c, err)
	}
}

// validateEndpoints checks the addresses: every one loopback.
func (o *options) validateEndpoints() []error {
	var c complaints
	c.add(checkLoopback("addr", o.addr))
	if o.redisAddr != "" {
		c.add(checkLoopback("redis-addr", o.redisAddr))
	}
	if o.keySample < 0 || o.keySample > maxKeySample {
		c.bad("-redis-key-sample %d: want 0..%d", o.keySample, maxKeySample)
	}
	if o.keySample > 0 && o.redisAddr == "" {
		c.bad("-redis-key-sample needs -redis-addr")
	}
	if o.metricsURL != "" {
		c.add(checkMetricsURL(o.metricsURL))
	}
	return c
}

// validateTiming checks how long and how fast the run goes: it is bounded.
func (o *options) validateTiming() []error {
	var c complaints
	if o.dur == 0 && o.n == 0 {
		c.bad("give -duration and/or -n: an unbounded run is refused")
	}
	if o.dur < 0 || o.dur > maxDuration {
		c.bad("-duration %v: want at most %v", o.dur, maxDuration)
	}
	if o.warmup < 0 || o.warmup > maxWarmup {
		c.bad("-warmup %v: want 0..%v", o.warmup, maxWarmup)
	}
	return c
}

// validateSizes checks the counts of workers, connections, keys and
// descriptors, and the rate.
func (o *options) validateSizes() []error {
	var c complaints
	if o.workers < 1 || o.workers > maxWorkers {
		c.bad("-c %d: want 1..%d", o.workers, maxWorkers)
	}
	if o.conns < 1 || o.conns > maxConns {
		c.bad("-connections %d: want 1..%d", o.conns, maxConns)
	}
	if o.rate < 0 || o.rate > maxRate || o.rate != o.rate {
		c.bad("-rate %v: want 0 (closed loop) up to %d", o.rate, maxRate)
	}
	if o.keys < 1 || o.keys > maxKeys {
		c.bad("-keys %d: want 1..%d", o.keys, maxKeys)
	}
	if o.descriptors < 1 || o.descriptors > len(defaultDescriptors) {
		c.bad("-descriptors %d: want 1..%d", o.descriptors, len(defaultDescriptors))
	}
	return c
}

// validateRequest checks what each request carries.
func (o *options) validateRequest(set map[string]bool) []error {
	var c complaints
	if len(o.templates) > 0 && set["descriptors"] {
		c.bad("-d and -descriptors exclude each other")
	}
	if o.domain == "" {
		c.bad("-domain is empty")
	}
	if o.hits > 1<<32-1 {
		c.bad("-hits %d: want a uint32", o.hits)
	}
	if o.timeout < 0 {
		c.bad("-timeout %v: want >= 0", o.timeout)
	}
	_, err := newKeyPicker(o.dist, 1, o.zipfS)
	c.add(err)
	return c
}

// run is the whole program: parse, preflight, warm up, measure, report.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	l, nDesc, err := newLoader(o)
	if err != nil {
		return err
	}
	defer l.close()
	redPreflight, err := preflight(ctx, o, l, stderr)
	if err != nil {
		return err
	}
	mode := "closed"
	if o.rate > 0 {
		mode = "open"
	}
	if o.warmup > 0 {
		fmt.Fprintf(stderr, "rls-bench: warming up for %v\n", o.warmup)
		if w := l.run(ctx, phase{dur: o.warmup, rate: o.rate}); w.interrupted {
			return errors.New("interrupted during warm-up")
		}
	}
	dur := o.dur
	if dur == 0 {
		dur = maxDuration
	}
	before, err := takeSnapshot(ctx, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "rls-bench: measuring (%s loop)\n", mode)
	res := l.run(ctx, phase{dur: dur, n: o.n, rate: o.rate})
	cliAfter := selfCPU()
	hostAfter, hostErr2 := readHostTicks()

	rep := newReport(o, l, mode, nDesc, &res, cliAfter-before.cli)
	if err := addAfter(context.WithoutCancel(ctx), o, rep, redPreflight, &before); err != nil {
		return err
	}
	if before.hostErr == nil && hostErr2 == nil {
		rep.Host = newHostCPU(before.host, hostAfter, rep.ElapsedSec, rep.ourCores())
	}
	if o.json {
		return writeJSON(stdout, rep)
	}
	return writeText(stdout, rep)
}

// newLoader builds the requests, the key picker and the connections; it
// returns the number of descriptors per request too.
func newLoader(o *options) (*loader, int, error) {
	srcs := o.templates
	if len(srcs) == 0 {
		srcs = defaultDescriptors[:o.descriptors]
	}
	tmpls := make([]descTemplate, len(srcs))
	for i, s := range srcs {
		var err error
		if tmpls[i], err = parseTemplate(s); err != nil {
			return nil, 0, err
		}
	}
	keys := o.keys
	if o.dist == "one" {
		keys = 1
	}
	picker, err := newKeyPicker(o.dist, keys, o.zipfS)
	if err != nil {
		return nil, 0, err
	}
	l := &loader{
		reqs:    newRequestSet(o.domain, o.prefix, uint32(o.hits), tmpls, keys),
		picker:  picker,
		keys:    keys,
		workers: o.workers,
		timeout: o.timeout,
		seed:    o.seed,
	}
	for i := range o.conns {
		c, err := dialCaller(o.addr, l.reqs)
		if err != nil {
			l.close()
			return nil, 0, fmt.Errorf("connect to %s (connection %d): %v", o.addr, i, err)
		}
		l.conns = append(l.conns, c)
	}
	return l, len(tmpls), nil
}

// preflight makes one call on every connection, so a wrong address, domain
// or a server that is down fails here rather than as a run of errors, and
// reads every source of figures once, so that one that cannot be read
// fails before the run. It returns Redis's INFO before the warm-up.
func preflight(ctx context.Context, o *options, l *loader, stderr io.Writer) (redisInfo, error) {
	for i, c := range l.conns {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		code, err := c.call(pctx, 0, new(callScratch))
		cancel()
		if err != nil {
			return redisInfo{}, fmt.Errorf("preflight call to %s (connection %d): %v", o.addr, i, err)
		}
		if i == 0 {
			fmt.Fprintf(stderr, "rls-bench: preflight %s %s -> %s\n", o.domain, l.reqs.describe(0), code)
		}
	}
	if o.pids != nil {
		if _, err := procCPU(o.pids); err != nil {
			return redisInfo{}, err
		}
	}
	var red redisInfo
	if o.redisAddr != "" {
		var err error
		if red, err = fetchRedisInfo(ctx, o.redisAddr); err != nil {
			return redisInfo{}, err
		}
	}
	if o.metricsURL != "" {
		if _, err := fetchMetrics(ctx, o.metricsURL); err != nil {
			return redisInfo{}, err
		}
	}
	return red, nil
}

// snapshot is every counter read just before the measured phase.
type snapshot struct {
	srv     time.Duration
	red     redisInfo
	met     map[string]float64
	cli     time.Duration
	host    hostTicks
	hostErr error
}

func takeSnapshot(ctx context.Context, o *options) (snapshot, error) {
	var s snapshot
	var err error
	if o.metricsURL != "" {
		if s.met, err = fetchMetrics(ctx, o.metricsURL); err != nil {
			return s, err
		}
	}
	if o.redisAddr != "" {
		if s.red, err = fetchRedisInfo(ctx, o.redisAddr); err != nil {
			return s, err
		}
	}
	if o.pids != nil {
		if s.srv, err = procCPU(o.pids); err != nil {
			return s, err
		}
	}
	s.cli = selfCPU()
	s.host, s.hostErr = readHostTicks()
	return s, nil
}

// newReport is the measured phase's counts, latencies and schedule, and the
// generator's own CPU.
func newReport(o *options, l *loader, mode string, nDesc int, res *result, cli time.Duration) *Report {
	st := &res.st
	el := res.elapsed.Seconds()
	rep := &Report{
		Mode: mode, Target: o.addr, Domain: o.domain, Request: l.reqs.describe(0),
		Descriptors: nDesc, Keys: l.keys, Dist: o.dist, Concurrency: o.workers, Connections: o.conns,
		TargetRate: o.rate, WarmupSec: o.warmup.Seconds(), ElapsedSec: el, Interrupted: res.interrupted,
		Requests: st.decisions() + st.errors(), Decisions: st.decisions(),
		OK: st.ok, OverLimit: st.over, Unknown: st.unk,
		Latency: summarize(&st.lat),
		Client:  newCPU(cli.Seconds(), el, st.decisions()),
	}
	if el > 0 {
		rep.DecisionsPerSec = float64(st.decisions()) / el
	}
	for c, n := range st.errs {
		if n > 0 {
			if rep.Errors == nil {
				rep.Errors = map[string]uint64{}
			}
			rep.Errors[codeName(c)] = n
		}
	}
	if mode == "open" {
		svc := summarize(&st.svc)
		rep.ServiceLatency = &svc
		rep.Schedule = newSchedule(res, o.rate)
	}
	return rep
}

// newSchedule tells how well the open loop kept to its timetable.
func newSchedule(res *result, rate float64) *Schedule {
	st := &res.st
	s := &Schedule{Intended: res.intended, Sent: st.sent, MaxLagUs: st.lagMax, LateOver1ms: st.late}
	if st.sent > 0 {
		s.MeanLagUs = float64(st.lagSum) / float64(st.sent)
	}
	if res.intended > st.sent {
		s.BehindAtEnd = res.intended - st.sent
		s.BehindAtEndMs = float64(s.BehindAtEnd) / rate * 1e3
	}
	return s
}

// addAfter reads what the server processes, Redis and rls's /metrics did
// over the measured phase into rep.
func addAfter(ctx context.Context, o *options, rep *Report, redPreflight redisInfo, before *snapshot) error {
	if o.pids != nil {
		after, err := procCPU(o.pids)
		if err != nil {
			return err
		}
		rep.Server = &ServerCPU{Pids: o.pids, CPU: newCPU((after - before.srv).Seconds(), rep.ElapsedSec, rep.Decisions)}
	}
	if err := addRedis(ctx, o, rep, redPreflight, before.red); err != nil {
		return err
	}
	if o.metricsURL != "" {
		after, err := fetchMetrics(ctx, o.metricsURL)
		if err != nil {
			return err
		}
		rep.ServerMetrics = metricDeltas(before.met, after)
	}
	return nil
}

// addRedis reads Redis's INFO after the run into rep and, given
// -redis-key-sample, what the keys left behind cost.
func addRedis(ctx context.Context, o *options, rep *Report, preflight, before redisInfo) error {
	if o.redisAddr == "" {
		return nil
	}
	after, err := fetchRedisInfo(ctx, o.redisAddr)
	if err != nil {
		return err
	}
	rep.Redis = redisDelta(o.redisAddr, before, after, rep.ElapsedSec, rep.Decisions)
	if o.keySample == 0 {
		return nil
	}
	k, err := sampleKeys(ctx, o.redisAddr, o.keySample)
	if err != nil {
		return err
	}
	k.UsedMemoryFrom, k.UsedMemoryTo = preflight.mem, after.mem
	if k.DBSize > 0 {
		k.UsedMemoryPerKey = (float64(after.mem) - float64(preflight.mem)) / float64(k.DBSize)
	}
	rep.Redis.Keys = k
	return nil
}

// selfCPU is this process's user+system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
