#!/usr/bin/env bash
# Redis's side of a decision, rls against envoyproxy/ratelimit (the peer), on
# one redis-server: per scenario, ROUNDS rounds of peer, rls, rls, peer, each
# run on a flushed Redis with its stats reset (CONFIG RESETSTAT) and a server
# started for it alone. After each run INFO gives, per decision: Redis CPU,
# commands by name with their usec_per_call, and total_reads_processed /
# total_writes_processed (one read and one write syscall each, so these count
# Redis's syscalls). No warm-up: the stats cover the whole run.
#
#   PROFILE_SCENARIOS="c e" PROFILE_DURATION=8s PROFILE_ROUNDS=1 scripts/redis_profile.sh
#
# Needs bin/rls, bin/rls-bench and the peer as scripts/bench.sh installs them
# (make bench, or bench.sh's go install line). Output: one line per run, then
# medians per server, on stdout; raw INFO in $PROFILE_OUT (bin/redis-profile).
set -euo pipefail
cd "$(dirname "$0")/.."
SCEN=${PROFILE_SCENARIOS:-c e}
DUR=${PROFILE_DURATION:-8s}
ROUNDS=${PROFILE_ROUNDS:-1}
OUT=${PROFILE_OUT:-bin/redis-profile}
PEER_VERSION=${BENCH_PEER_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
CACHE=${BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rls-bench}
PEER_BIN=$CACHE/ratelimit@$PEER_VERSION/service_cmd
[ -x "$PEER_BIN" ] || { echo "peer missing at $PEER_BIN: run make bench once"; exit 1; }
mkdir -p "$OUT"
rm -f "$OUT"/*.info "$OUT"/*.json
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
free_ports() { python3 -c '
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not up"; exit 1; }

mkdir -p "$WORK/config" "$WORK/peer/ratelimit/config"
scripts/bench.sh --print-config "$WORK/config"
cp "$WORK"/config/*.yaml "$WORK/peer/ratelimit/config/"

RPORT=$(free_ports 1)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" --logfile "$WORK/redis.log" &
PIDS+=($!); RPID=$!; wait_port "$RPORT"

flags_of() {
  case $1 in
    a) echo "-domain bench -dist one -keys 1" ;;
    c) echo "-domain bench -dist roundrobin -keys 1000" ;;
    d) echo "-domain bench -dist roundrobin -keys 1000 -descriptors 2" ;;
    e) echo "-domain bench -dist roundrobin -keys 1000 -rate 5000" ;;
    f) echo "-domain bench -dist one -keys 1 -rate 40000" ;;
    g) echo "-domain hot -dist one -keys 1 -rate 5000" ;;
    *) echo "unknown scenario $1" >&2; exit 1 ;;
  esac
}

for sc in $SCEN; do
  n=0
  for _r in $(seq "$ROUNDS"); do
    for srv in peer rls rls peer; do
      n=$((n + 1))
      read -r GRPC HTTP DBG <<<"$(free_ports 3)"
      redis-cli -p "$RPORT" FLUSHALL >/dev/null
      if [ "$srv" = peer ]; then
        env -i PATH="$PATH" HOME="$HOME" USE_STATSD=false LOG_LEVEL=warn RUNTIME_ROOT="$WORK/peer" \
          RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false RUNTIME_IGNOREDOTFILES=true REDIS_SOCKET_TYPE=tcp \
          LOCAL_CACHE_SIZE_IN_BYTES=67108864 REDIS_URL="127.0.0.1:$RPORT" HOST=127.0.0.1 PORT="$HTTP" \
          DEBUG_HOST=127.0.0.1 DEBUG_PORT="$DBG" GRPC_HOST=127.0.0.1 GRPC_PORT="$GRPC" "$PEER_BIN" > "$WORK/srv.log" 2>&1 &
      else
        bin/rls serve --config-dir "$WORK/config" --grpc-addr "127.0.0.1:$GRPC" --http-addr "127.0.0.1:$HTTP" \
          --debug-addr '' --log-level warn --store redis --redis-url "redis://127.0.0.1:$RPORT" > "$WORK/srv.log" 2>&1 &
      fi
      SRV=$!; PIDS+=($SRV); wait_port "$GRPC"; sleep 0.5
      f="$OUT/$sc-$n-$srv"
      redis-cli -p "$RPORT" INFO all > "$f.before.info"
      redis-cli -p "$RPORT" CONFIG RESETSTAT >/dev/null
      # shellcheck disable=SC2046
      bin/rls-bench -c 50 -connections 1 -duration "$DUR" -warmup 0 -addr "127.0.0.1:$GRPC" $(flags_of "$sc") -json > "$f.json"
      redis-cli -p "$RPORT" INFO all > "$f.after.info"
      kill "$SRV"; wait "$SRV" 2>/dev/null || true
    done
  done
done
kill "$RPID"; wait "$RPID" 2>/dev/null || true

python3 - "$OUT" $SCEN <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, re, statistics, sys
out, scen = sys.argv[1], sys.argv[2:]
def info(p):
    d = {}
    for line in open(p):
        k, _, v = line.strip().partition(":")
        if v: d[k] = v
    return d
def stats(base):
    r = json.load(open(base + ".json")); b, a = info(base + ".before.info"), info(base + ".after.info")
    dec = r["ok"] + r["over_limit"]
    cpu = sum(float(a[k]) - float(b[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    cmds = {}
    for k, v in a.items():
        if k.startswith("cmdstat_") and k not in ("cmdstat_info", "cmdstat_config"):
            f = dict(x.split("=") for x in v.split(","))
            cmds[k[8:]] = (int(f["calls"]) / dec, float(f["usec_per_call"]))
    return {"dec/s": r["decisions_per_second"], "admitted/s": r["ok"] / r["elapsed_seconds"] if r.get("elapsed_seconds") else None,
            "cpu_us": cpu * 1e6 / dec, "reads": int(a["total_reads_processed"]) / dec,
            "writes": int(a["total_writes_processed"]) / dec, "cmds": cmds}
for sc in scen:
    print(f"== scenario {sc}")
    per = {"peer": [], "rls": []}
    for f in sorted(glob.glob(os.path.join(out, f"{sc}-*-*.json")), key=lambda f: int(f.split("-")[-2])):
        base, srv = f[:-5], f[:-5].rsplit("-", 1)[1]
        s = stats(base); per[srv].append(s)
        c = ", ".join(f"{k} {n:.3f}×{u:.2f}us" for k, (n, u) in sorted(s["cmds"].items()))
        print(f"  {os.path.basename(base):12s} {s['dec/s']:8.0f} dec/s  redis {s['cpu_us']:5.1f} us/dec  reads {s['reads']:.3f} writes {s['writes']:.3f} /dec  {c}")
    for srv, ss in per.items():
        if ss:
            m = lambda k: statistics.median(x[k] for x in ss)
            print(f"  median {srv:4s}: redis {m('cpu_us'):.1f} us/dec, reads {m('reads'):.3f}, writes {m('writes'):.3f} per decision")
    if per["peer"] and per["rls"]:
        m = lambda srv: statistics.median(x["cpu_us"] for x in per[srv])
        print(f"  rls/peer Redis CPU per decision: {m('rls') / m('peer'):.2f}x")
PY
