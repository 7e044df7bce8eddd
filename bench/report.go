package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// Report is the result of one measured run. -json prints it as is.
type Report struct {
	Mode        string  `json:"mode"` // "closed" or "open"
	Target      string  `json:"target"`
	Domain      string  `json:"domain"`
	Request     string  `json:"request"` // the descriptors of key 0, e.g. "[api_key=k0]"
	Descriptors int     `json:"descriptors_per_request"`
	Keys        int     `json:"keys"`
	Dist        string  `json:"dist"`
	Concurrency int     `json:"concurrency"`
	Connections int     `json:"connections"`
	TargetRate  float64 `json:"target_rate,omitempty"`
	WarmupSec   float64 `json:"warmup_seconds"`
	ElapsedSec  float64 `json:"elapsed_seconds"`
	Interrupted bool    `json:"interrupted,omitempty"`

	Requests        uint64            `json:"requests"`  // RPCs completed, errors included
	Decisions       uint64            `json:"decisions"` // RPCs answered OK, OVER_LIMIT or UNKNOWN
	DecisionsPerSec float64           `json:"decisions_per_second"`
	OK              uint64            `json:"ok"`
	OverLimit       uint64            `json:"over_limit"`
	Unknown         uint64            `json:"unknown,omitempty"` // overall_code UNKNOWN
	Errors          map[string]uint64 `json:"errors,omitempty"`  // by gRPC code

	// Latency of every completed RPC; in the open loop measured from its
	// intended send time (coordinated-omission corrected).
	Latency Latency `json:"latency_us"`
	// Open loop only: measured from the actual send.
	ServiceLatency *Latency   `json:"service_latency_us,omitempty"`
	Schedule       *Schedule  `json:"schedule,omitempty"`
	Client         CPU        `json:"client_cpu"`
	Server         *ServerCPU `json:"server,omitempty"`
	Redis          *Redis     `json:"redis,omitempty"`
	// The whole machine over the measured phase (Linux).
	Host *HostCPU `json:"host_cpu,omitempty"`
	// -metrics-url: change of rls's own counters over the measured phase.
	ServerMetrics map[string]float64 `json:"server_metrics,omitempty"`
}

// Latency summarizes a histogram, in microseconds.
type Latency struct {
	Min  uint64  `json:"min"`
	Mean float64 `json:"mean"`
	P50  uint64  `json:"p50"`
	P90  uint64  `json:"p90"`
	P99  uint64  `json:"p99"`
	P999 uint64  `json:"p99_9"`
	Max  uint64  `json:"max"`
}

func summarize(h *hist) Latency {
	return Latency{Min: h.Min(), Mean: h.Mean(), P50: h.Quantile(0.5), P90: h.Quantile(0.9),
		P99: h.Quantile(0.99), P999: h.Quantile(0.999), Max: h.Max()}
}

// Schedule tells how well the open loop kept to its timetable.
type Schedule struct {
	Intended      uint64  `json:"intended"`         // sends due by the end of the run
	Sent          uint64  `json:"sent"`             // sends made
	BehindAtEnd   uint64  `json:"behind_at_end"`    // due but never sent
	BehindAtEndMs float64 `json:"behind_at_end_ms"` // the same as time at the target rate
	MeanLagUs     float64 `json:"mean_lag_us"`      // actual minus intended send time
	MaxLagUs      uint64  `json:"max_lag_us"`
	LateOver1ms   uint64  `json:"late_over_1ms"` // sends more than 1 ms behind their slot
}

// CPU is a process's CPU time over the measured phase.
type CPU struct {
	Seconds       float64 `json:"cpu_seconds"`
	Cores         float64 `json:"cores"` // CPU seconds per elapsed second
	UsPerDecision float64 `json:"cpu_us_per_decision"`
}

// ServerCPU is the CPU of the -server-pid processes, summed.
type ServerCPU struct {
	Pids []int `json:"pids"`
	CPU
}

// Redis is what INFO says Redis did during the measured phase.
type Redis struct {
	Addr                string  `json:"addr"`
	CPU                         // used_cpu_sys + used_cpu_user
	Commands            uint64  `json:"commands"` // total_commands_processed, minus our INFO calls
	CommandsPerDecision float64 `json:"commands_per_decision"`
	// The sum of INFO commandstats' calls over every command but INFO: what
	// Redis executed, each command a script ran counted like one a client
	// sent (so EVALSHA and the commands inside it are all counted).
	CommandstatsCalls       uint64            `json:"commandstats_calls"`
	CommandstatsPerDecision float64           `json:"commandstats_calls_per_decision"`
	Evalsha                 uint64            `json:"evalsha"`
	EvalshaPerDecision      float64           `json:"evalsha_per_decision"`
	Calls                   map[string]uint64 `json:"calls"` // per command, INFO excluded
	// Connections Redis accepted during the phase, our INFO connection
	// excluded: a client that keeps its pool open makes none.
	NewConnections uint64 `json:"new_connections"`
	// -redis-key-sample: the keys left in Redis after the run and their size.
	Keys *RedisKeys `json:"keys,omitempty"`
}

func newCPU(seconds, elapsed float64, decisions uint64) CPU {
	c := CPU{Seconds: seconds}
	if elapsed > 0 {
		c.Cores = seconds / elapsed
	}
	if decisions > 0 {
		c.UsPerDecision = seconds * 1e6 / float64(decisions)
	}
	return c
}

// redisDelta turns two INFO snapshots into the phase's figures; the INFO
// commands themselves (ours and anyone else's) are not counted.
func redisDelta(addr string, before, after redisInfo, elapsed float64, decisions uint64) *Redis {
	r := &Redis{Addr: addr, CPU: newCPU(after.cpu-before.cpu, elapsed, decisions), Calls: map[string]uint64{}}
	for cmd, n := range after.calls {
		if b := before.calls[cmd]; n > b && cmd != "info" {
			r.Calls[cmd] = n - b
			r.CommandstatsCalls += n - b
		}
	}
	infos := after.calls["info"] - before.calls["info"]
	if cmds := after.commands - before.commands; cmds >= infos {
		r.Commands = cmds - infos
	}
	if d := after.conns - before.conns; after.conns > before.conns && d > 0 {
		r.NewConnections = d - 1 // the connection of the closing INFO
	}
	r.Evalsha = r.Calls["evalsha"]
	if decisions > 0 {
		r.CommandsPerDecision = float64(r.Commands) / float64(decisions)
		r.EvalshaPerDecision = float64(r.Evalsha) / float64(decisions)
		r.CommandstatsPerDecision = float64(r.CommandstatsCalls) / float64(decisions)
	}
	return r
}

// ourCores is the cores of the processes the run measured: the generator,
// the -server-pid processes and Redis.
func (r *Report) ourCores() float64 {
	ours := r.Client.Cores
	if r.Server != nil {
		ours += r.Server.Cores
	}
	if r.Redis != nil {
		ours += r.Redis.Cores
	}
	return ours
}

func writeJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func writeText(w io.Writer, r *Report) error {
	t := &textReport{}
	t.head(r)
	t.counts(r)
	t.latencies(r)
	t.cpu("client cpu", r.Client)
	if r.Server != nil {
		t.cpu(fmt.Sprintf("server cpu %v", r.Server.Pids), r.Server.CPU)
	}
	if r.Redis != nil {
		t.redis(r.Redis)
	}
	if h := r.Host; h != nil {
		t.p("machine cpu    %.2f cores busy, %.2f of them other processes'\n", h.BusyCores, h.OtherCores)
	}
	t.serverMetrics(r)
	_, err := io.WriteString(w, t.b.String())
	return err
}

// textReport builds writeText's output, one section at a time.
type textReport struct{ b strings.Builder }

func (t *textReport) p(format string, a ...any) { fmt.Fprintf(&t.b, format, a...) }

func (t *textReport) head(r *Report) {
	t.p("rls-bench: %s loop against %s, domain %q, %d descriptor(s)/request %s\n", r.Mode, r.Target, r.Domain, r.Descriptors, r.Request)
	t.p("  keys %d (%s), concurrency %d, connections %d", r.Keys, r.Dist, r.Concurrency, r.Connections)
	if r.Mode == "open" {
		t.p(", target rate %.0f/s", r.TargetRate)
	}
	t.p(", warm-up %.1fs excluded\n", r.WarmupSec)
	if r.Interrupted {
		t.p("  INTERRUPTED: figures cover the run up to the interruption\n")
	}
}

func (t *textReport) counts(r *Report) {
	t.p("elapsed        %.2fs\n", r.ElapsedSec)
	t.p("requests       %d\n", r.Requests)
	t.p("decisions/s    %.0f\n", r.DecisionsPerSec)
	t.p("OK             %d (%s)\n", r.OK, pct(r.OK, r.Requests))
	t.p("OVER_LIMIT     %d (%s)\n", r.OverLimit, pct(r.OverLimit, r.Requests))
	if r.Unknown > 0 {
		t.p("UNKNOWN        %d (%s)\n", r.Unknown, pct(r.Unknown, r.Requests))
	}
	var nerr uint64
	for _, n := range r.Errors {
		nerr += n
	}
	t.p("errors         %d", nerr)
	for _, c := range slices.Sorted(maps.Keys(r.Errors)) {
		t.p(" %s=%d", c, r.Errors[c])
	}
	t.p("\n")
}

func (t *textReport) latency(name string, l Latency) {
	t.p("%-14s p50 %s  p90 %s  p99 %s  p99.9 %s  max %s  (mean %s)\n", name,
		us(l.P50), us(l.P90), us(l.P99), us(l.P999), us(l.Max), us(uint64(l.Mean+0.5)))
}

func (t *textReport) latencies(r *Report) {
	if r.Mode != "open" {
		t.latency("latency", r.Latency)
	} else {
		t.latency("latency*", r.Latency)
		if r.ServiceLatency != nil {
			t.latency("service", *r.ServiceLatency)
		}
		t.p("  * from each request's intended send time (coordinated-omission corrected); service: from the actual send\n")
	}
	if s := r.Schedule; s != nil {
		t.p("schedule       %d due, %d sent; lag mean %s max %s, %d sends >1ms late; behind at end: %d (%.1f ms)\n",
			s.Intended, s.Sent, us(uint64(s.MeanLagUs+0.5)), us(s.MaxLagUs), s.LateOver1ms, s.BehindAtEnd, s.BehindAtEndMs)
	}
}

func (t *textReport) cpu(name string, c CPU) {
	t.p("%-14s %.2f CPU-s, %.2f cores, %.1f µs CPU/decision\n", name, c.Seconds, c.Cores, c.UsPerDecision)
}

func (t *textReport) redis(x *Redis) {
	t.cpu("redis cpu", x.CPU)
	t.p("redis conns    %d new during the run\n", x.NewConnections)
	t.p("redis cmds     %d (%.2f/decision, commands run by scripts included), evalsha %d (%.2f/decision)", x.Commands, x.CommandsPerDecision, x.Evalsha, x.EvalshaPerDecision)
	if len(x.Calls) > 0 {
		t.p(";")
	}
	for _, c := range slices.Sorted(maps.Keys(x.Calls)) {
		t.p(" %s=%d", c, x.Calls[c])
	}
	t.p("\n")
	t.p("redis calls    %d in commandstats (%.2f/decision)\n", x.CommandstatsCalls, x.CommandstatsPerDecision)
	if k := x.Keys; k != nil {
		t.p("redis keys     %d after the run; MEMORY USAGE mean %.0f B over %d sampled; used_memory %d -> %d B (%.0f B/key)\n",
			k.DBSize, k.MeanBytes, k.Sampled, k.UsedMemoryFrom, k.UsedMemoryTo, k.UsedMemoryPerKey)
	}
}

func (t *textReport) serverMetrics(r *Report) {
	if len(r.ServerMetrics) == 0 {
		return
	}
	t.p("rls metrics   ")
	for _, n := range slices.Sorted(maps.Keys(r.ServerMetrics)) {
		t.p(" %s +%.0f", n, r.ServerMetrics[n])
	}
	t.p("\n")
	if fb := r.ServerMetrics["rls_fallback_decisions_total"]; fb > 0 && r.Decisions > 0 {
		t.p("WARNING        %.0f checks (%.1f%% of decisions) were decided without the store: it could not answer in time\n",
			fb, 100*fb/float64(r.Decisions))
	}
}

func pct(n, of uint64) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(of))
}

// us formats microseconds compactly: 850µs, 1.25ms, 2.000s.
func us(v uint64) string {
	switch {
	case v < 1000:
		return fmt.Sprintf("%dµs", v)
	case v < 1000000:
		return fmt.Sprintf("%.2fms", float64(v)/1e3)
	}
	return fmt.Sprintf("%.3fs", float64(v)/1e6)
}
