#!/usr/bin/env python3
"""Render make bench's raw results (rls-bench and ghz JSON) into two
documents, each between its BEGIN/END markers: a summary (the machine, the
commit and command, the targets against the peer) into docs/BENCHMARKS.md,
and every table (per scenario, memory store, Cluster, micro-benchmarks)
into docs/bench/RESULTS.md.

    python3 scripts/bench_report.py OUT_DIR SUMMARY_DOC RESULTS_DOC

The single-Redis results are runs of rls and of envoyproxy/ratelimit (the
peer) side by side: redis-<scenario>-<n>-<server>.json, n counting the runs
of ABBA rounds (peer, rls, rls, peer). They are rendered as medians per
server, their ratio rls/peer and the targets against the peer. meta-<store>.json says
how and when each store's results were taken. Only the standard library."""
import glob
import json
import os
import platform
import re
import statistics
import subprocess
import sys

out_dir, doc, results_doc = sys.argv[1], sys.argv[2], sys.argv[3]
STORES = [("memory", "memory store"), ("redis", "Redis, single node"), ("cluster", "Redis Cluster, 3 masters")]
PEER_MOD = "github.com/envoyproxy/ratelimit"
SCEN = [
    ("a_one_key", "(a) one key, under the limit"),
    ("b_over_limit", "(b) one key over its limit (local cache)"),
    ("c_1000_keys", "(c) 1,000 keys round-robin"),
    ("d_two_descriptors", "(d) two descriptors"),
    ("e_fixed_5000", "fixed 5,000/s (open loop)"),
    ("f_hot_40000", "(f) one hot key under its limit, 40,000/s (open loop)"),
    ("g_hot_over_5000", "(g) one hot key at twice its limit (2,500/s), 5,000/s (open loop)"),
    ("h_5000_keys_5000", "(h) 5,000 keys round-robin at 5,000/s: each key about once a window (open loop)"),
]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fmt_us(us):
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us} µs"


def row(label, r):
    """One table row of an rls-bench result."""
    lat = r["latency_us"]
    srv = r.get("server") or {}
    red = r.get("redis") or {}
    cli = r.get("client_cpu") or {}
    m = r.get("server_metrics") or {}
    fallback = sum(v for k, v in m.items() if k.startswith("rls_fallback_decisions_total"))
    errs = sum((r.get("errors") or {}).values())
    oc = other_cores(r)
    return "| {} | {:,.0f} | {} / {} | {} / {} | {} | {} | {} | {} | {} | {} | {} |".format(
        label, r["decisions_per_second"], r["ok"], r["over_limit"],
        fmt_us(lat["p50"]), fmt_us(lat["p99"]),
        f'{srv.get("cpu_us_per_decision", 0):.1f}' if srv else "–",
        f'{red.get("cpu_us_per_decision", 0):.1f}' if red else "–",
        f'{cli.get("cpu_us_per_decision", 0):.1f}' if cli else "–",
        f'{red.get("commandstats_calls_per_decision", red.get("commands_per_decision", 0)):.2f} ({red.get("evalsha_per_decision", 0):.4f})' if red else "–",
        f"{fallback:.0f}" if m else "–", errs, "–" if oc is None else f"{oc:.2f}" + (" †" if disturbed(r) else ""))


def fmt_n(v, digits=1):
    if v is None:
        return "–"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def ratio(rls, peer, digits=2):
    """rls / peer; none when the peer's figure shows as 0 (Redis work in
    scenario (b), where both servers answer from their local cache)."""
    if rls is None or peer is None or round(peer, digits) == 0:
        return None
    return rls / peer


def fmt_ratio(r):
    return "–" if r is None else f"{r:.2f}×"


# A run during which other processes used more than this many cores (of the
# machine's) is marked disturbed: its decisions/s and latency are not the
# servers' alone.
DISTURBED_CORES = 0.3


def other_cores(r):
    return (r.get("host_cpu") or {}).get("other_cores")


def disturbed(r):
    o = other_cores(r)
    return o is not None and o > DISTURBED_CORES


def med(vals):
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else None


# Side-by-side metrics: label, how to read one run, digits, unit. Lower is
# better for all but decisions/s.
def _red(r, k):
    return (r.get("redis") or {}).get(k)


def _keys(r, k):
    return ((r.get("redis") or {}).get("keys") or {}).get(k)


def _mem_delta(r):
    # used_memory's change over few keys is the clients' buffers, not keys.
    n = _keys(r, "dbsize")
    return _keys(r, "used_memory_delta_per_key") if n and n >= 500 else None


# Distinct descriptor values each scenario rate-limits (keys × descriptors).
ACTIVE = {"a_one_key": 1, "b_over_limit": 1, "c_1000_keys": 1000, "d_two_descriptors": 2000, "e_fixed_5000": 1000,
          "f_hot_40000": 1, "g_hot_over_5000": 1, "h_5000_keys_5000": 5000}


def _mem_per_active(r, key):
    b, a = _keys(r, "used_memory_before"), _keys(r, "used_memory_after")
    if b is None or a is None or ACTIVE[key] < 500:
        return None
    return (a - b) / ACTIVE[key]


def _admitted(r):
    # Requests answered OK per second of the measured phase.
    e = r.get("elapsed_seconds")
    return r["ok"] / e if e else None


METRICS = [
    ("decisions/s", lambda r: r["decisions_per_second"], 0),
    ("admitted/s (answered OK)", _admitted, 0),
    ("server CPU µs/decision", lambda r: (r.get("server") or {}).get("cpu_us_per_decision"), 1),
    ("Redis CPU µs/decision", lambda r: _red(r, "cpu_us_per_decision"), 1),
    ("Redis commands/decision (INFO commandstats, all commands)", lambda r: _red(r, "commandstats_calls_per_decision"), 2),
    ("latency p50 µs", lambda r: r["latency_us"]["p50"], 0),
    ("latency p99 µs", lambda r: r["latency_us"]["p99"], 0),
    ("Redis memory per active key, B (MEMORY USAGE, mean of ≤1,000 SCANned keys)", lambda r: _keys(r, "memory_usage_mean_bytes"), 0),
    ("keys in Redis after the run (DBSIZE)", lambda r: _keys(r, "dbsize"), 0),
    ("used_memory change per key, B (≥500 keys only)", _mem_delta, 0),
    ("used_memory change per rate-limited descriptor value, B (the scenario's 1,000 or 2,000; all its keys together)", None, 0),
    ("generator CPU µs/decision", lambda r: (r.get("client_cpu") or {}).get("cpu_us_per_decision"), 1),
    ("other processes' CPU during the run, cores (machine busy − server − Redis − generator; 2 in all)", lambda r: (r.get("host_cpu") or {}).get("other_cores"), 2),
]

# The targets against the peer (bounds on rls / peer): metric label,
# scenarios, comparison, bound.
TARGETS = [
    # The one-path round's (issue 39), on the default algorithm.
    ("Redis CPU µs/decision", ["a_one_key"], "<=", 0.1),
    ("server CPU µs/decision", ["a_one_key"], "<=", 0.5),
    ("decisions/s", ["a_one_key"], ">=", 1.5),
    ("Redis CPU µs/decision", ["c_1000_keys", "d_two_descriptors"], "<=", 0.3),
    ("server CPU µs/decision", ["c_1000_keys", "d_two_descriptors"], "<=", 0.5),
    ("decisions/s", ["c_1000_keys", "d_two_descriptors"], ">=", 1.5),
    ("Redis CPU µs/decision", ["e_fixed_5000"], "<=", 0.5),
    ("server CPU µs/decision", ["e_fixed_5000"], "<=", 0.6),
    ("Redis CPU µs/decision", ["f_hot_40000"], "<=", 0.1),
    ("server CPU µs/decision", ["f_hot_40000"], "<=", 0.5),
    ("decisions/s", ["f_hot_40000"], ">=", 1.5),
    ("latency p99 µs", ["f_hot_40000"], "<=", 0.7),
    ("Redis CPU µs/decision", ["g_hot_over_5000"], "<=", 1.0),
    ("decisions/s", ["g_hot_over_5000"], ">=", 1.0),
    ("Redis CPU µs/decision", ["h_5000_keys_5000"], "<=", 1.0),
    ("server CPU µs/decision", ["h_5000_keys_5000"], "<=", 0.9),
    # Earlier rounds'.
    ("decisions/s", ["b_over_limit"], ">=", 2.0),
    ("latency p99 µs", ["e_fixed_5000"], "<=", 0.3),
    ("Redis memory per active key, B (MEMORY USAGE, mean of ≤1,000 SCANned keys)", ["c_1000_keys", "d_two_descriptors"], "<=", 1.0),
]
# Absolute bounds: metric label, scenarios, bound (rls's median at most this).
LIMITS = [("admitted/s (answered OK)", ["g_hot_over_5000"], 5000)]
SHORT = {"decisions/s": "decisions/s", "server CPU µs/decision": "server CPU per decision",
         "Redis CPU µs/decision": "Redis CPU per decision", "latency p99 µs": "p99 latency",
         "Redis memory per active key, B (MEMORY USAGE, mean of ≤1,000 SCANned keys)": "Redis memory per active key"}


def side_by_side(out_dir, meta):
    """The single-Redis section: rls and the peer, medians and ratios."""
    runs = {}
    for key, _ in SCEN:
        for srv in ("peer", "rls"):
            files = sorted(glob.glob(os.path.join(out_dir, f"redis-{key}-*-{srv}.json")),
                           key=lambda f: int(re.search(r"-(\d+)-" + srv + r"\.json$", f).group(1)))
            runs[key, srv] = [(os.path.basename(f), r) for f in files if (r := load(f))]
    if not any(runs.values()):
        return [], []
    out = []
    out.append("### Redis, single node: rls and envoyproxy/ratelimit side by side")
    out.append("")
    if meta:
        quick = " **Quick run** (`BENCH_QUICK=1`): short runs, one round; indicative only." if meta.get("quick") else ""
        out.append(f"Taken {meta['date']} at commit `{meta['commit']}` by `{meta['command']}`.{quick}")
        out.append(f"Per scenario {meta['rounds']} ABBA round(s) (peer, rls, rls, peer), {meta['duration']} measured per run after "
                   f"a {meta['warmup']} warm-up; before every run Redis is flushed (FLUSHALL) and the server started afresh, "
                   "and it is stopped after the run: the two servers never run at once and neither inherits state. "
                   "Same Redis, same generator (`rls-bench -c 50 -connections 1`, grpc-go's client), same config files.")
        out.append("")
        out.append(f"- peer: `{PEER_MOD}@{meta['peer_version']}` (`go install {PEER_MOD}/src/service_cmd@{meta['peer_version']}` "
                   "into the bench cache, not into go.mod), started with `env -i` and only "
                   f"`{meta['peer_env']}{(' ' + meta['peer_extra_env']) if meta.get('peer_extra_env') else ''}` "
                   "plus `REDIS_URL=127.0.0.1:<port>` and `GRPC_HOST`/`HOST`/`DEBUG_HOST=127.0.0.1` with free `GRPC_PORT`/`PORT`/`DEBUG_PORT`; "
                   "everything else at its defaults (`REDIS_TYPE=SINGLE`, `REDIS_POOL_SIZE=10`, `REDIS_PIPELINE_WINDOW=0`, "
                   "`EXPIRATION_JITTER_MAX_SECONDS=300`, `NEAR_LIMIT_RATIO=0.8`, stats flushed every 10 s to a logging sink, GOGC 100). "
                   "Its local over-limit cache is on (64 MiB).")
        out.append("- rls: `bin/rls serve --store redis --redis-url redis://127.0.0.1:<port> --log-level warn --debug-addr '' --admin-addr ''` "
                   "built from this worktree, "
                   + (f"with `{meta['rls_extra_args']}`, " if meta.get('rls_extra_args') else "")
                   + "every other flag at its default.")
        out.append("- Every figure of this section comes from this run: none is compared with a figure of another day.")
        out.append("")
    # Targets table: the summary is this and what comes before it.
    out.append("#### The targets against the peer, measured")
    out.append("")
    out.append(f"| target (rls / peer) | scenario | peer | rls | rls / peer | met? | disturbed runs, peer / rls |")
    out.append("|---|---|---|---|---|---|---|")
    label = dict(SCEN)
    mfun = {m[0]: (m[1], m[2]) for m in METRICS}
    for metric, keys, op, bound in TARGETS:
        f, digits = mfun[metric]
        for key in keys:
            p = med(f(r) for _, r in runs[key, "peer"])
            q = med(f(r) for _, r in runs[key, "rls"])
            rt = ratio(q, p, digits)
            met = "–" if rt is None else ("**met**" if (rt >= bound if op == ">=" else rt <= bound) else "not met")
            dp = sum(disturbed(r) for _, r in runs[key, "peer"])
            dq = sum(disturbed(r) for _, r in runs[key, "rls"])
            out.append(f"| {SHORT[metric]} {'≥' if op == '>=' else '≤'} {bound:g}× | {label[key]} | {fmt_n(p, digits)} | "
                       f"{fmt_n(q, digits)} | {fmt_ratio(rt)} | {met} | {dp} / {dq} |")
    for metric, keys, bound in LIMITS:
        f, digits = mfun[metric]
        for key in keys:
            if not runs[key, "rls"]:
                continue
            p = med(f(r) for _, r in runs[key, "peer"])
            q = med(f(r) for _, r in runs[key, "rls"])
            met = "–" if q is None else ("**met**" if q <= bound else "not met")
            dp = sum(disturbed(r) for _, r in runs[key, "peer"])
            dq = sum(disturbed(r) for _, r in runs[key, "rls"])
            out.append(f"| {metric} ≤ {bound:,} (rls) | {label[key]} | {fmt_n(p, digits)} | {fmt_n(q, digits)} | "
                       f"{fmt_ratio(ratio(q, p, digits))} | {met} | {dp} / {dq} |")
    out.append("")
    allruns = [r for v in runs.values() for _, r in v]
    nd = sum(disturbed(r) for r in allruns)
    out.append(f"A run is *disturbed* (†) when other processes used more than {DISTURBED_CORES} core of the machine during it "
               f"(`host_cpu.other_cores`; † marks its decisions/s and latency in the per-scenario tables): {nd} of {len(allruns)} runs here. Its decisions/s and latency are not the servers' "
               "alone, and one disturbed run of two moves a median a long way; CPU, commands and memory per decision or key "
               "hardly move. A target judged on disturbed runs wants `BENCH_ROUNDS=2` or more on a quieter machine before it is believed.")
    out.append("")
    summary = list(out)
    # Per scenario.
    for key, lab in SCEN:
        peer, rls = runs[key, "peer"], runs[key, "rls"]
        if not peer and not rls:
            continue
        out.append(f"#### {lab}")
        out.append("")
        out.append(f"| metric | peer (median of {len(peer)}) | rls (median of {len(rls)}) | rls / peer | peer, each run | rls, each run |")
        out.append("|---|---|---|---|---|---|")
        for name, f, digits in METRICS:
            if f is None:
                f = lambda r, key=key: _mem_per_active(r, key)  # noqa: E731
            pv = [f(r) for _, r in peer]
            qv = [f(r) for _, r in rls]
            if all(v is None for v in pv + qv):
                continue
            p, q = med(pv), med(qv)
            mark = name.startswith(("decisions/s", "latency", "other processes"))

            def each(vals, rs):
                return " / ".join(fmt_n(v, digits) + ("†" if mark and disturbed(r) else "") for v, (_, r) in zip(vals, rs))
            out.append(f"| {name} | {fmt_n(p, digits)} | {fmt_n(q, digits)} | {fmt_ratio(ratio(q, p, digits))} | "
                       f"{each(pv, peer)} | {each(qv, rls)} |")
        # Commands by name, per decision (median over runs).
        for srv, rs in (("peer", peer), ("rls", rls)):
            cmds = sorted({c for _, r in rs for c in ((r.get("redis") or {}).get("calls") or {})})
            per = []
            for c in cmds:
                v = med(((r.get("redis") or {}).get("calls") or {}).get(c, 0) / r["decisions"] for _, r in rs if r["decisions"])
                if v is not None and v >= 0.0005:
                    per.append(f"{c} {v:.3f}")
            errs = sum(sum((r.get("errors") or {}).values()) for _, r in rs)
            ok = sum(r["ok"] for _, r in rs)
            over = sum(r["over_limit"] for _, r in rs)
            fb = sum((r.get("server_metrics") or {}).get("rls_fallback_decisions_total", 0) for _, r in rs)
            extra = f"; fallback decisions {fb:.0f}" if srv == "rls" else ""
            out.append(f"| {srv}: Redis commands per decision by name | {', '.join(per) or '–'} | | | "
                       f"OK {ok:,} / OVER_LIMIT {over:,} / errors {errs}{extra} | |")
        out.append("")
        out.append("Raw: " + ", ".join(f"`{n}`" for n, _ in sorted(peer + rls, key=lambda x: int(re.search(r"-(\d+)-", x[0]).group(1)))) + ".")
        out.append("")
    return summary, out


def machine(metas):
    """The machine and Redis of the run, as its meta files recorded them
    (else this machine's: older runs did not record them)."""
    for m in metas.values():
        if m and m.get("machine"):
            return m["machine"], m.get("redis_version", "")
    cpu = ""
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    redis = ""
    try:
        redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    return f"{os.cpu_count()} vCPU ({cpu}), {platform.system()} {platform.release()}", redis


def write_between(path, lines):
    """Replace what lies between path's BEGIN and END make bench markers."""
    text = open(path).read()
    begin, end = "<!-- BEGIN make bench -->", "<!-- END make bench -->"
    i, j = text.index(begin) + len(begin), text.index(end)
    open(path, "w").write(text[:i] + "\n" + "\n".join(lines) + "\n" + text[j:])


lines = []
metas = {st: load(os.path.join(out_dir, f"meta-{st}.json")) for st, _ in STORES}
host, redis_version = machine(metas)
lines.append(f"Machine: {host}; server, Redis and load generator share it over loopback.")
if redis_version:
    lines.append("Redis: " + redis_version)
lines.append("")
head = list(lines)
summary, full = side_by_side(out_dir, metas.get("redis"))
lines.extend(full)
for store, title in STORES:
    if store == "redis":
        continue
    rows = []
    for key, label in SCEN:
        r = load(os.path.join(out_dir, f"{store}-{key}.json"))
        if not r:
            continue
        rows.append(row(label, r))
        g = load(os.path.join(out_dir, f"ghz-{store}-{key}.json"))
        if g:
            lp = {d["percentage"]: d["latency"] for d in g.get("latencyDistribution") or []}
            rows.append("| ↳ ghz, same scenario | {:,.0f} | – | {} / {} | – | – | – | – | – | {} | – |".format(
                g.get("rps", 0), fmt_us(int(lp.get(50, 0) / 1000)), fmt_us(int(lp.get(99, 0) / 1000)),
                sum((g.get("statusCodeDistribution") or {}).get(k, 0) for k in (g.get("statusCodeDistribution") or {}) if k != "OK")))
    if not rows:
        continue
    lines.append(f"### {title}: rls only")
    lines.append("")
    m = metas.get(store)
    if m:
        lines.append(f"Taken {m['date']} at commit `{m['commit']}` by `{m['command']}`, {m['duration']} per scenario after a "
                     f"{m['warmup']} warm-up, one rls serving all scenarios in turn.")
    else:
        lines.append("Taken by an earlier run (no record of when): not comparable with the other sections.")
    if store == "cluster":
        lines.append("Redis CPU and commands are those of one of the three masters.")
    lines.append("")
    lines.append("| scenario | decisions/s | OK / OVER | p50 / p99 | server CPU µs/decision | Redis CPU µs/decision | generator CPU µs/decision | Redis commands (EVALSHA)/decision | fallback decisions | errors | other processes, cores (†: disturbed) |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    lines.extend(rows)
    lines.append("")
micro = os.path.join(out_dir, "micro.txt")
if os.path.exists(micro):
    med = {}
    for l in open(micro):
        m = re.match(r"^(Benchmark\S+?)(-\d+)?\s+\d+\s+([\d.]+) ns/op\s+(\d+) B/op\s+(\d+) allocs/op", l)
        if m:
            med.setdefault(m.group(1), []).append((float(m.group(3)), int(m.group(5))))
    lines.append("#### Micro-benchmarks (median of runs)")
    lines.append("")
    lines.append("| benchmark | ns/op | allocs/op |")
    lines.append("|---|---|---|")
    for name, vals in med.items():
        ns = sorted(v[0] for v in vals)[len(vals) // 2]
        lines.append(f"| {name} | {ns:,.0f} | {vals[0][1]} |")
    lines.append("")

# The summary: the machine, the side-by-side run's how and targets, and
# when the other sections were taken.
short = head + summary
for store, title in STORES:
    m = metas.get(store)
    if store != "redis" and m:
        short.append(f"{title[0].upper() + title[1:]}, rls only: taken {m['date']} at commit `{m['commit']}` by `{m['command']}`.")
short.append("")
short.append("Every scenario's table (medians and each run, commands by name), the memory store, Redis Cluster and the "
             "micro-benchmarks: [bench/RESULTS.md](bench/RESULTS.md), written by the same run.")
write_between(doc, short)
write_between(results_doc, lines)
if os.environ.get("BENCH_REPORT_PRINT") == "1":
    print("\n".join(lines))
