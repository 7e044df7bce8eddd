#!/usr/bin/env python3
"""Render make bench's raw results (rls-bench and ghz JSON) into the
generated part of docs/BENCHMARKS.md, between the BEGIN/END markers."""
import glob
import json
import os
import platform
import re
import subprocess
import sys

out_dir, doc = sys.argv[1], sys.argv[2]
STORES = [("memory", "memory store"), ("redis", "Redis, single node"), ("cluster", "Redis Cluster, 3 masters")]
SCEN = [
    ("a_one_key", "(a) one key, under the limit"),
    ("b_over_limit", "(b) one key over its limit (local cache)"),
    ("c_1000_keys", "(c) 1,000 keys round-robin"),
    ("d_two_descriptors", "(d) two descriptors"),
    ("e_fixed_5000", "fixed 5,000/s (open loop)"),
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
    return "| {} | {:,.0f} | {} / {} | {} / {} | {} | {} | {} | {} | {} | {} |".format(
        label, r["decisions_per_second"], r["ok"], r["over_limit"],
        fmt_us(lat["p50"]), fmt_us(lat["p99"]),
        f'{srv.get("cpu_us_per_decision", 0):.1f}' if srv else "–",
        f'{red.get("cpu_us_per_decision", 0):.1f}' if red else "–",
        f'{cli.get("cpu_us_per_decision", 0):.1f}' if cli else "–",
        f'{red.get("evalsha_per_decision", 0):.4f}' if red else "–",
        f"{fallback:.0f}" if m else "–", errs)


lines = []
cpu = ""
try:
    cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
except (OSError, IndexError):
    pass
lines.append(f"Machine: {os.cpu_count()} vCPU ({cpu}), {platform.system()} {platform.release()}; "
             f"server, Redis and load generator share it over loopback.")
try:
    lines.append("Redis: " + subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip())
except OSError:
    pass
lines.append("")
for store, title in STORES:
    rows = []
    for key, label in SCEN:
        r = load(os.path.join(out_dir, f"{store}-{key}.json"))
        if not r:
            continue
        rows.append(row(label, r))
        g = load(os.path.join(out_dir, f"ghz-{store}-{key}.json"))
        if g:
            lp = {d["percentage"]: d["latency"] for d in g.get("latencyDistribution") or []}
            rows.append("| ↳ ghz, same scenario | {:,.0f} | – | {} / {} | – | – | – | – | – | {} |".format(
                g.get("rps", 0), fmt_us(int(lp.get(50, 0) / 1000)), fmt_us(int(lp.get(99, 0) / 1000)),
                sum((g.get("statusCodeDistribution") or {}).get(k, 0) for k in (g.get("statusCodeDistribution") or {}) if k != "OK")))
    if not rows:
        continue
    lines.append(f"#### {title}")
    lines.append("")
    lines.append("| scenario | decisions/s | OK / OVER | p50 / p99 | server CPU µs/decision | Redis CPU µs/decision | generator CPU µs/decision | EVALSHA/decision | fallback decisions | errors |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
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

text = open(doc).read()
begin, end = "<!-- BEGIN make bench -->", "<!-- END make bench -->"
i, j = text.index(begin) + len(begin), text.index(end)
open(doc, "w").write(text[:i] + "\n" + "\n".join(lines) + "\n" + text[j:])
