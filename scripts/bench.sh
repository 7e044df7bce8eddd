#!/usr/bin/env bash
# make bench: Go micro-benchmarks, then the end-to-end scenarios, measured
# with the repository's load generator (rls-bench, its own module in bench/,
# calling through grpc-go's client):
#   - memory store and a 3-master Redis Cluster: rls alone;
#   - a single Redis node: rls and envoyproxy/ratelimit (the peer)
#     side by side, on the same Redis with the same generator, each run on a
#     freshly started server and a flushed Redis, in ABBA rounds
#     (peer, rls, rls, peer), never both servers at once.
# The peer is installed with `go install` into a cache directory (not into
# go.mod) the first time. Everything runs on 127.0.0.1 and stops by itself;
# every process started is stopped by PID. Raw results go to $BENCH_OUT
# (docs/bench), the summary to $BENCH_DOC (docs/BENCHMARKS.md) and every
# table to $BENCH_RESULTS (docs/bench/RESULTS.md), each between its
# BEGIN/END markers.
#
#   scripts/bench.sh --report-only   # render both from $BENCH_OUT's JSON again, measuring nothing
#   BENCH_DURATION=10s BENCH_ROUNDS=1 BENCH_STORES="memory redis cluster" BENCH_MICRO_COUNT=5 make bench
#   BENCH_QUICK=1 make bench      # = make bench-quick: 3 s runs, one round, single Redis only, into bin/bench-quick/
#   BENCH_PEER_ENV="REDIS_PIPELINE_WINDOW=150us" make bench   # extra env for the peer, recorded in the report
#   BENCH_RLS_ARGS="--default-algorithm fixed_window" make bench   # extra rls flags (here the peer's algorithm), recorded too
#   BENCH_STORES=redis BENCH_SCENARIOS="a c d e f g" make bench   # some scenarios only
set -euo pipefail
cd "$(dirname "$0")/.."
# write_config DIR: the YAML both servers load (rls from --config-dir, the
# peer from its runtime directory), one file per domain.
write_config() {
  mkdir -p "$1"
  cat > "$1/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: route
        rate_limit: {name: per-route, unit: second, requests_per_unit: 1000000000}
YAML
  cat > "$1/blocked.yaml" <<'YAML'
domain: blocked
descriptors:
  - key: api_key
    rate_limit: {name: tiny, unit: hour, requests_per_unit: 1}
YAML
  # (g): one hot key sent 5,000/s against a limit of 2,500/s.
  cat > "$1/hot.yaml" <<'YAML'
domain: hot
descriptors:
  - key: api_key
    rate_limit: {name: hot, unit: second, requests_per_unit: 2500}
YAML
}
# scripts/bench.sh --print-config DIR writes the config alone (scripts/redis_profile.sh uses it).
if [ "${1:-}" = --print-config ]; then write_config "$2"; exit 0; fi
QUICK=${BENCH_QUICK:-0}
if [ "$QUICK" = 1 ]; then
  DUR=${BENCH_DURATION:-3s}; WARMUP=${BENCH_WARMUP:-1s}; ROUNDS=${BENCH_ROUNDS:-1}
  STORES=${BENCH_STORES:-redis}; MICRO_COUNT=${BENCH_MICRO_COUNT:-0}
  OUT=${BENCH_OUT:-bin/bench-quick}; DOC=${BENCH_DOC:-$OUT/BENCHMARKS.md}; RESULTS=${BENCH_RESULTS:-$OUT/RESULTS.md}
else
  DUR=${BENCH_DURATION:-10s}; WARMUP=${BENCH_WARMUP:-2s}; ROUNDS=${BENCH_ROUNDS:-1}
  STORES=${BENCH_STORES:-memory redis cluster}; MICRO_COUNT=${BENCH_MICRO_COUNT:-5}
  OUT=${BENCH_OUT:-docs/bench}; DOC=${BENCH_DOC:-docs/BENCHMARKS.md}; RESULTS=${BENCH_RESULTS:-docs/bench/RESULTS.md}
fi
if [ "${1:-}" = --report-only ]; then
  python3 scripts/bench_report.py "$OUT" "$DOC" "$RESULTS"
  echo "== wrote $DOC and $RESULTS from $OUT"; exit 0
fi
PEER_ENV=${BENCH_PEER_ENV:-}
read -r -a RLS_ARGS <<<"${BENCH_RLS_ARGS:-}"
# envoyproxy/ratelimit's main branch at 3fb7025 (2026-01-22), the version
# the side-by-side figures compare with; its binary is the service_cmd package.
PEER_MOD=github.com/envoyproxy/ratelimit
PEER_VERSION=${BENCH_PEER_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}
CACHE=${BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rls-bench}
PEER_BIN=$CACHE/ratelimit@$PEER_VERSION/service_cmd
GOBIN=$(go env GOPATH)/bin
export PATH="$GOBIN:$PATH"
START=$(date +%s)
# The command as given, for the report: the BENCH_ variables set, then make's target.
CMD=$({ env | grep -E '^BENCH_[A-Z_]+=' | grep -v '^BENCH_REPORT_PRINT=' || true; } | sort | sed -E "s/^([A-Z_]+)=(.*)$/\1='\2'/" | tr '\n' ' ')
CMD="${CMD}make bench"

command -v redis-server >/dev/null || { echo "redis-server missing: run make deps"; exit 1; }
go build -o bin/rls ./cmd/rls
(cd bench && go build -o ../bin/rls-bench .)
mkdir -p "$OUT"
# A quick run renders into copies of the documents: its short runs never replace the committed figures.
if [ "$QUICK" = 1 ] && [ -z "${BENCH_DOC:-}" ]; then cp docs/BENCHMARKS.md "$DOC"; fi
if [ "$QUICK" = 1 ] && [ -z "${BENCH_RESULTS:-}" ]; then cp docs/bench/RESULTS.md "$RESULTS"; fi
if [[ " $STORES " == *" redis "* ]] && [ ! -x "$PEER_BIN" ]; then
  echo "== installing $PEER_MOD@$PEER_VERSION into $(dirname "$PEER_BIN") (once)"
  mkdir -p "$(dirname "$PEER_BIN")"
  GOBIN=$(cd "$(dirname "$PEER_BIN")" && pwd) GOFLAGS= go install "$PEER_MOD/src/service_cmd@$PEER_VERSION"
fi
# This run's stores are measured again: their old results go, so that no
# figure of another run is rendered as one of this run (with BENCH_SCENARIOS,
# those of the scenarios it runs).
for st in $STORES; do
  if [ -n "${BENCH_SCENARIOS:-}" ]; then
    for l in $BENCH_SCENARIOS; do rm -f "$OUT/$st-${l}_"*.json "$OUT/ghz-$st-${l}_"*.json; done
  else
    rm -f "$OUT/$st"-*.json "$OUT/ghz-$st"-*.json
  fi
  rm -f "$OUT/meta-$st.json"
done
# grpc-*.json were the rows of grpc-go's client when the generator's default
# was a hand-written HTTP/2 client; there is one client now, and leftovers
# would be rendered as rows of this run.
rm -f "$OUT"/grpc-*.json
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { free_ports 1; }
# free_ports N: N distinct free ports (all held open together while chosen).
free_ports() { python3 -c '
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"; }
# A cluster node also listens on its port + 10000 (the cluster bus), so its
# port must be below 55536 with that one free too.
free_cluster_port() { python3 -c '
import random, socket
for _ in range(1000):
    p = random.randint(20000, 55000)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
    except OSError:
        continue
    print(p); break
'; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not up"; exit 1; }
# wait_server PID PORT LOG: the server's gRPC port, or its log and the end of
# the run. The server must still be alive half a second after the port
# answers: a server that failed to bind exits, and the port is someone else's.
wait_server() {
  local ok=""
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null && { ok=1; break; }; sleep 0.05; done
  sleep 0.5
  if [ -n "$ok" ] && kill -0 "$1" 2>/dev/null; then
    # The peer listens with SO_REUSEPORT: another process on the same port
    # would silently take half the connections. Only ours may listen there.
    if command -v ss >/dev/null && [ "$(ss -Hltnp "sport = :$2" | grep -o 'pid=[0-9]*' | sort -u | tr '\n' ' ')" != "pid=$1 " ]; then
      echo "port $2 is not the server's (pid $1) alone:"; ss -ltnp "sport = :$2"; exit 1
    fi
    return 0
  fi
  echo "server (pid $1) not up on port $2; its log:"; tail -n 30 "$3"; exit 1
}

if [ "$MICRO_COUNT" -gt 0 ]; then
echo "== micro-benchmarks (count $MICRO_COUNT)"
go test -run '^$' -bench 'BenchmarkMatch|BenchmarkAppendKey' -benchmem -count "$MICRO_COUNT" ./pkg/descriptors/ | tee "$OUT/micro.txt"
go test -run '^$' -bench 'BenchmarkMemoryDecide$' -benchmem -count "$MICRO_COUNT" ./pkg/store/memory/ | tee -a "$OUT/micro.txt"
go test -run '^$' -bench 'BenchmarkDecision|BenchmarkHandler' -benchmem -count "$MICRO_COUNT" ./pkg/service/ | tee -a "$OUT/micro.txt"
go test -run '^$' -bench 'BenchmarkCachedDenial' -benchmem -count "$MICRO_COUNT" ./pkg/limiter/ | tee -a "$OUT/micro.txt"
fi

write_config "$WORK/config"
# The peer reads the same files: with RUNTIME_WATCH_ROOT=false it loads
# $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config/*.yaml.
mkdir -p "$WORK/peer/ratelimit/config"
cp "$WORK"/config/*.yaml "$WORK/peer/ratelimit/config/"

start_redis_single() {
  local port; port=$(free_port)
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" --logfile "$WORK/redis-$port.log" &
  PIDS+=($!); REDIS_PIDS=($!); wait_port "$port"
  REDIS_ADDR=127.0.0.1:$port; REDIS_ARGS=(--store redis --redis-url "redis://127.0.0.1:$port")
}
start_redis_cluster() {
  local ports=() addrs=() seeds="" p
  REDIS_PIDS=()
  for _ in 1 2 3; do
    p=$(free_cluster_port); mkdir -p "$WORK/c$p"
    redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK/c$p" \
      --cluster-enabled yes --cluster-config-file "$WORK/c$p/nodes.conf" --logfile "$WORK/c$p/log" &
    PIDS+=($!); REDIS_PIDS+=($!); wait_port "$p"; ports+=("$p"); addrs+=("127.0.0.1:$p")
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
  for _ in $(seq 100); do redis-cli -p "${ports[0]}" cluster info | grep -q 'cluster_state:ok' && break; sleep 0.1; done
  seeds="redis://${addrs[0]}?addr=${addrs[1]}&addr=${addrs[2]}"
  # rls-bench measures one node's INFO: the one owning the scenarios' keys
  # differs per key, so Redis cost is reported for the first node only.
  REDIS_ADDR=${addrs[0]}; REDIS_ARGS=(--store redis-cluster --redis-url "$seeds")
}
start_rls() {
  read -r GRPC HTTP <<<"$(free_ports 2)"
  bin/rls serve --config-dir "$WORK/config" --grpc-addr "127.0.0.1:$GRPC" --http-addr "127.0.0.1:$HTTP" \
    --debug-addr '' --admin-addr '' --log-level warn "$@" "${RLS_ARGS[@]}" > "$WORK/rls-$GRPC.log" 2>&1 &
  RLS=$!; PIDS+=($RLS); wait_server "$RLS" "$GRPC" "$WORK/rls-$GRPC.log"
}
# start_peer REDIS_PORT: envoyproxy/ratelimit on the single Redis, its local
# over-limit cache on (64 MiB), everything else at its defaults (pool of 10
# connections, REDIS_PIPELINE_WINDOW 0, 300 s of expiry jitter, stats
# flushed to a logging sink every 10 s, GOGC 100).
# env -i: nothing from the caller's environment reaches it but PATH, HOME and
# BENCH_PEER_ENV.
PEER_FIXED_ENV=(USE_STATSD=false LOG_LEVEL=warn
  RUNTIME_ROOT="$WORK/peer" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false RUNTIME_IGNOREDOTFILES=true
  REDIS_SOCKET_TYPE=tcp LOCAL_CACHE_SIZE_IN_BYTES=67108864)
start_peer() {
  local dbg; read -r GRPC HTTP dbg <<<"$(free_ports 3)"
  # shellcheck disable=SC2086
  env -i PATH="$PATH" HOME="$HOME" "${PEER_FIXED_ENV[@]}" REDIS_URL="127.0.0.1:$1" \
    HOST=127.0.0.1 PORT="$HTTP" DEBUG_HOST=127.0.0.1 DEBUG_PORT="$dbg" GRPC_HOST=127.0.0.1 GRPC_PORT="$GRPC" \
    $PEER_ENV "$PEER_BIN" > "$WORK/peer-$GRPC.log" 2>&1 &
  SRV=$!; PIDS+=($SRV); wait_server "$SRV" "$GRPC" "$WORK/peer-$GRPC.log"
}
# stop_pids PID...: stop and reap them, and forget them, so that the exit trap
# never signals a PID the system may since have given to another process.
stop_pids() {
  local p q keep=()
  for p in "$@"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for q in "${PIDS[@]:-}"; do [[ -n "$q" && " $* " != *" $q "* ]] && keep+=("$q"); done
  PIDS=("${keep[@]:-}")
}

# scenario name | rls-bench flags | ghz data
scenarios=(
  "a_one_key|-domain bench -dist one -keys 1|{\"domain\":\"bench\",\"descriptors\":[{\"entries\":[{\"key\":\"api_key\",\"value\":\"k0\"}]}]}"
  "b_over_limit|-domain blocked -dist one -keys 1|{\"domain\":\"blocked\",\"descriptors\":[{\"entries\":[{\"key\":\"api_key\",\"value\":\"k0\"}]}]}"
  "c_1000_keys|-domain bench -dist roundrobin -keys 1000|{\"domain\":\"bench\",\"descriptors\":[{\"entries\":[{\"key\":\"api_key\",\"value\":\"k{{randomInt 0 1000}}\"}]}]}"
  "d_two_descriptors|-domain bench -dist roundrobin -keys 1000 -descriptors 2|{\"domain\":\"bench\",\"descriptors\":[{\"entries\":[{\"key\":\"api_key\",\"value\":\"k{{.RequestNumber}}\"}]},{\"entries\":[{\"key\":\"api_key\",\"value\":\"k{{.RequestNumber}}\"},{\"key\":\"route\",\"value\":\"/v1/search\"}]}]}"
  "e_fixed_5000|-domain bench -dist roundrobin -keys 1000 -rate 5000|"
  "f_hot_40000|-domain bench -dist one -keys 1 -rate 40000|"
  "g_hot_over_5000|-domain hot -dist one -keys 1 -rate 5000|"
  "h_5000_keys_5000|-domain bench -dist roundrobin -keys 5000 -rate 5000|"
)
# BENCH_SCENARIOS: run only these scenarios (their names' letters, e.g. "c e f g"; all when empty).
ONLY=${BENCH_SCENARIOS:-}

# meta STORE: how this store's results were taken, and on what, for the report.
meta() {
  python3 - "$OUT/meta-$1.json" "$1" "$DUR" "$WARMUP" "$ROUNDS" "$QUICK" "$PEER_VERSION" "$PEER_ENV" \
    "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo +changes)" "$CMD" "${PEER_FIXED_ENV[*]//"$WORK"/\$WORK}" \
    "${RLS_ARGS[*]}" "$(redis-server --version)" <<'PY'
import json, os, platform, sys, time
f, store, dur, warm, rounds, quick, pv, penv, commit, cmd, fixed, rargs, redis = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
json.dump({"store": store, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "duration": dur, "warmup": warm,
           "rounds": int(rounds), "quick": quick == "1", "commit": commit, "command": cmd, "peer_version": pv,
           "peer_env": fixed, "peer_extra_env": penv, "rls_extra_args": rargs,
           "machine": f"{os.cpu_count()} vCPU ({cpu}), {platform.system()} {platform.release()}", "redis_version": redis},
          open(f, "w"), indent=1)
PY
}
bench_run() { # OUTFILE ARGS...: one measured run, its one-line summary on stdout
  local f=$1; shift
  bin/rls-bench -c 50 -connections 1 -duration "$DUR" -warmup "$WARMUP" "$@" -json > "$f"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); e=sum((r.get("errors") or {}).values()); h=r.get("host_cpu") or {}
print("  ", sys.argv[1].rsplit("/",1)[-1], round(r["decisions_per_second"]), "dec/s p99", r["latency_us"]["p99"], "us;",
      "other processes %.2f cores" % h.get("other_cores", float("nan")), ("errors %d" % e) if e else "")' "$f"
}

for st in $STORES; do
  echo "== store: $st"
  REDIS_PIDS=(); REDIS_ADDR=""; REDIS_ARGS=()
  case $st in
    memory) ;;
    redis) start_redis_single ;;
    cluster) start_redis_cluster ;;
    *) echo "unknown store $st"; exit 1 ;;
  esac
  if [ "$st" = redis ]; then
    # Side by side: per scenario, ROUNDS rounds of peer, rls, rls, peer; each
    # run on a flushed Redis and a server started for it alone.
    port=${REDIS_ADDR##*:}
    for sc in "${scenarios[@]}"; do
      IFS='|' read -r name flags _ <<<"$sc"
      [ -n "$ONLY" ] && [[ " $ONLY " != *" ${name%%_*} "* ]] && continue
      n=0
      for _r in $(seq "$ROUNDS"); do
        for srv in peer rls rls peer; do
          n=$((n + 1))
          redis-cli -p "$port" FLUSHALL >/dev/null
          extra=(-redis-addr "$REDIS_ADDR" -redis-key-sample 1000)
          if [ "$srv" = peer ]; then
            start_peer "$port"
          else
            start_rls "${REDIS_ARGS[@]}"; SRV=$RLS
            extra+=(-metrics-url "http://127.0.0.1:$HTTP/metrics")
          fi
          # shellcheck disable=SC2086
          bench_run "$OUT/$st-$name-$n-$srv.json" -addr "127.0.0.1:$GRPC" $flags -server-pid "$SRV" "${extra[@]}"
          stop_pids "$SRV"
        done
      done
    done
    stop_pids "${REDIS_PIDS[@]}"
    meta "$st"
    continue
  fi
  start_rls "${REDIS_ARGS[@]}"
  for sc in "${scenarios[@]}"; do
    IFS='|' read -r name flags data <<<"$sc"
    [ -n "$ONLY" ] && [[ " $ONLY " != *" ${name%%_*} "* ]] && continue
    extra=(-server-pid "$RLS" -metrics-url "http://127.0.0.1:$HTTP/metrics")
    [ -n "$REDIS_ADDR" ] && extra+=(-redis-addr "$REDIS_ADDR")
    # shellcheck disable=SC2086
    bench_run "$OUT/$st-$name.json" -addr "127.0.0.1:$GRPC" $flags "${extra[@]}"
    if command -v ghz >/dev/null && [ -n "$data" ]; then
      ghz --insecure --call envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit -c 50 --connections 1 \
        -z "$DUR" -d "$data" --format json "127.0.0.1:$GRPC" 2>/dev/null \
        | python3 -c 'import json,sys; d=json.load(sys.stdin); d.pop("details", None); json.dump(d, sys.stdout, indent=1)' \
        > "$OUT/ghz-$st-$name.json" || echo "ghz $name failed"
    fi
  done
  stop_pids "$RLS" "${REDIS_PIDS[@]}"
  meta "$st"
done

BENCH_REPORT_PRINT=${BENCH_REPORT_PRINT:-$QUICK} python3 scripts/bench_report.py "$OUT" "$DOC" "$RESULTS"
echo "== wrote $DOC and $RESULTS in $(( $(date +%s) - START )) s"
