package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestRedisDelta(t *testing.T) {
	before := redisInfo{cpu: 1, commands: 100, conns: 10, calls: map[string]uint64{"evalsha": 40, "info": 5, "ping": 1}}
	after := redisInfo{cpu: 1.5, commands: 331, conns: 12, calls: map[string]uint64{"evalsha": 140, "info": 6, "ping": 1, "time": 100, "hello": 30}}
	r := redisDelta("127.0.0.1:6379", before, after, 2, 100)
	if r.Commands != 230 || r.CommandsPerDecision != 2.3 || r.Evalsha != 100 || r.EvalshaPerDecision != 1 ||
		r.CommandstatsCalls != 230 || r.CommandstatsPerDecision != 2.3 {
		t.Fatalf("%+v", r)
	}
	if r.Seconds != 0.5 || r.UsPerDecision != 5000 || r.Cores != 0.25 || r.NewConnections != 1 {
		t.Fatalf("cpu %+v", r.CPU)
	}
	if _, ok := r.Calls["info"]; ok || r.Calls["ping"] != 0 || r.Calls["hello"] != 30 || len(r.Calls) != 3 {
		t.Fatalf("calls %v", r.Calls)
	}
	// Zero decisions: no division by zero.
	if z := redisDelta("x", before, after, 0, 0); z.CommandsPerDecision != 0 || z.Cores != 0 {
		t.Fatalf("%+v", z)
	}
}

func sampleReport() *Report {
	var h hist
	for v := uint64(100); v < 1100; v++ {
		h.Record(v)
	}
	lat := summarize(&h)
	return &Report{
		Mode: "open", Target: "127.0.0.1:8081", Domain: "bench", Request: "[api_key=k0]", Descriptors: 1,
		Keys: 10, Dist: "zipf", Concurrency: 4, Connections: 2, TargetRate: 5000, WarmupSec: 1, ElapsedSec: 2,
		Requests: 1002, Decisions: 1000, DecisionsPerSec: 500, OK: 990, OverLimit: 10,
		Errors:  map[string]uint64{"Unavailable": 2},
		Latency: lat, ServiceLatency: &lat,
		Schedule:      &Schedule{Intended: 10000, Sent: 1002, BehindAtEnd: 8998, BehindAtEndMs: 1799.6, MeanLagUs: 12, MaxLagUs: 2500, LateOver1ms: 3},
		Client:        newCPU(1, 2, 1000),
		Server:        &ServerCPU{Pids: []int{1, 2}, CPU: newCPU(0.5, 2, 1000)},
		ServerMetrics: map[string]float64{"rls_fallback_decisions_total": 250, "rls_local_cache_hits_total": 0},
		Host:          &HostCPU{BusyCores: 1.9, OtherCores: 0.75},
		Redis: &Redis{Addr: "127.0.0.1:6379", CPU: newCPU(0.1, 2, 1000), Commands: 2000, CommandsPerDecision: 2, Evalsha: 1000, EvalshaPerDecision: 1, Calls: map[string]uint64{"evalsha": 1000, "time": 1000},
			CommandstatsCalls: 2000, CommandstatsPerDecision: 2,
			Keys: &RedisKeys{DBSize: 1000, Sampled: 500, MeanBytes: 96.4, UsedMemoryFrom: 1_000_000, UsedMemoryTo: 1_150_000, UsedMemoryPerKey: 150}},
	}
}

func TestWriteText(t *testing.T) {
	var b bytes.Buffer
	if err := writeText(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"open loop against 127.0.0.1:8081", "target rate 5000/s", "decisions/s    500\n",
		"OK             990 (98.8%)", "OVER_LIMIT     10 (1.0%)", "errors         2 Unavailable=2",
		"latency*       p50 599µs", "max 1.10ms", "service ", "behind at end: 8998 (1799.6 ms)",
		"client cpu     1.00 CPU-s, 0.50 cores, 1000.0 µs CPU/decision",
		"server cpu [1 2] 0.50 CPU-s, 0.25 cores, 500.0 µs CPU/decision",
		"redis cpu      0.10 CPU-s",
		"rls metrics    rls_fallback_decisions_total +250 rls_local_cache_hits_total +0",
		"WARNING        250 checks (25.0% of decisions)", "evalsha 1000 (1.00/decision); evalsha=1000 time=1000",
		"redis calls    2000 in commandstats (2.00/decision)",
		"machine cpu    1.90 cores busy, 0.75 of them other processes'",
		"redis keys     1000 after the run; MEMORY USAGE mean 96 B over 500 sampled; used_memory 1000000 -> 1150000 B (150 B/key)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	r := sampleReport()
	r.Mode, r.ServiceLatency, r.Schedule, r.Server, r.Redis, r.Errors, r.ServerMetrics = "closed", nil, nil, nil, nil, nil, nil
	b.Reset()
	if err := writeText(&b, r); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); strings.Contains(out, "schedule") || strings.Contains(out, "redis") || strings.Contains(out, "WARNING") || !strings.Contains(out, "errors         0\n") || !strings.Contains(out, "latency        p50") {
		t.Errorf("closed-loop report:\n%s", out)
	}
}

func TestWriteJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeJSON(&b, sampleReport()); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	lat := m["latency_us"].(map[string]any)
	if m["decisions_per_second"] != 500.0 || lat["p99_9"] == nil || m["errors"].(map[string]any)["Unavailable"] != 2.0 {
		t.Fatalf("%s", b.String())
	}
	if s := m["server"].(map[string]any); s["cpu_us_per_decision"] != 500.0 {
		t.Fatalf("server: %v", s)
	}
	if r := m["redis"].(map[string]any); r["evalsha_per_decision"] != 1.0 || r["commands_per_decision"] != 2.0 ||
		r["commandstats_calls_per_decision"] != 2.0 || r["keys"].(map[string]any)["memory_usage_mean_bytes"] != 96.4 {
		t.Fatalf("redis: %v", r)
	}
}

func TestUs(t *testing.T) {
	for v, want := range map[uint64]string{0: "0µs", 999: "999µs", 1000: "1.00ms", 1250: "1.25ms", 2_000_000: "2.000s"} {
		if got := us(v); got != want {
			t.Errorf("us(%d) = %q, want %q", v, got, want)
		}
	}
}
