#!/usr/bin/env bash
# make bench: Go micro-benchmarks, then issue 7's end-to-end scenarios on the
# memory store, a single Redis node and a 3-master Redis Cluster, measured
# with the repository's load generator (rls-bench, its own module in bench/,
# calling through grpc-go's client) and, when installed, ghz.
# Everything runs on 127.0.0.1 and stops by itself; every process started is
# stopped by PID. Raw results go to $BENCH_OUT (docs/bench), the summary to
# $BENCH_DOC (docs/BENCHMARKS.md, the part between the BEGIN/END markers).
#
#   BENCH_DURATION=15s BENCH_STORES="memory redis cluster" BENCH_MICRO_COUNT=5 make bench
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${BENCH_DURATION:-15s}
STORES=${BENCH_STORES:-memory redis cluster}
OUT=${BENCH_OUT:-docs/bench}
MICRO_COUNT=${BENCH_MICRO_COUNT:-5}
DOC=${BENCH_DOC:-docs/BENCHMARKS.md}
GOBIN=$(go env GOPATH)/bin
export PATH="$GOBIN:$PATH"

command -v redis-server >/dev/null || { echo "redis-server missing: run make deps"; exit 1; }
go build -o bin/rls ./cmd/rls
(cd bench && go build -o ../bin/rls-bench .)
mkdir -p "$OUT"
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

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
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

echo "== micro-benchmarks (count $MICRO_COUNT)"
go test -run '^$' -bench 'BenchmarkMatch|BenchmarkAppendKey' -benchmem -count "$MICRO_COUNT" ./pkg/descriptors/ | tee "$OUT/micro.txt"
go test -run '^$' -bench 'BenchmarkMemoryDecide$' -benchmem -count "$MICRO_COUNT" ./pkg/store/memory/ | tee -a "$OUT/micro.txt"
go test -run '^$' -bench 'BenchmarkDecision|BenchmarkHandler' -benchmem -count "$MICRO_COUNT" ./pkg/service/ | tee -a "$OUT/micro.txt"
go test -run '^$' -bench 'BenchmarkCachedDenial' -benchmem -count "$MICRO_COUNT" ./pkg/limiter/ | tee -a "$OUT/micro.txt"

mkdir -p "$WORK/config"
cat > "$WORK/config/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: route
        rate_limit: {name: per-route, unit: second, requests_per_unit: 1000000000}
YAML
cat > "$WORK/config/blocked.yaml" <<'YAML'
domain: blocked
descriptors:
  - key: api_key
    rate_limit: {name: tiny, unit: hour, requests_per_unit: 1}
YAML

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
  REDIS_ADDR=${addrs[0]}; REDIS_ARGS=(--store redis --redis-mode cluster --redis-url "$seeds")
}
start_rls() {
  GRPC=$(free_port); HTTP=$(free_port)
  bin/rls serve --config-dir "$WORK/config" --grpc-addr "127.0.0.1:$GRPC" --http-addr "127.0.0.1:$HTTP" \
    --debug-addr '' --log-level warn "$@" > "$WORK/rls-$GRPC.log" 2>&1 &
  RLS=$!; PIDS+=($RLS); wait_port "$GRPC"; sleep 0.5
}
stop_pids() { for p in "$@"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }

# scenario name | rls-bench flags | ghz data
scenarios=(
  "a_one_key|-domain bench -dist one -keys 1|{\"domain\":\"bench\",\"descriptors\":[{\"entries\":[{\"key\":\"api_key\",\"value\":\"k0\"}]}]}"
  "b_over_limit|-domain blocked -dist one -keys 1|{\"domain\":\"blocked\",\"descriptors\":[{\"entries\":[{\"key\":\"api_key\",\"value\":\"k0\"}]}]}"
  "c_1000_keys|-domain bench -dist roundrobin -keys 1000|{\"domain\":\"bench\",\"descriptors\":[{\"entries\":[{\"key\":\"api_key\",\"value\":\"k{{randomInt 0 1000}}\"}]}]}"
  "d_two_descriptors|-domain bench -dist roundrobin -keys 1000 -descriptors 2|{\"domain\":\"bench\",\"descriptors\":[{\"entries\":[{\"key\":\"api_key\",\"value\":\"k{{.RequestNumber}}\"}]},{\"entries\":[{\"key\":\"api_key\",\"value\":\"k{{.RequestNumber}}\"},{\"key\":\"route\",\"value\":\"/v1/search\"}]}]}"
  "e_fixed_5000|-domain bench -dist roundrobin -keys 1000 -rate 5000|"
)

for st in $STORES; do
  echo "== store: $st"
  REDIS_PIDS=(); REDIS_ADDR=""; REDIS_ARGS=()
  case $st in
    memory) ;;
    redis) start_redis_single ;;
    cluster) start_redis_cluster ;;
  esac
  start_rls "${REDIS_ARGS[@]}"
  for sc in "${scenarios[@]}"; do
    IFS='|' read -r name flags data <<<"$sc"
    extra=(-server-pid "$RLS" -metrics-url "http://127.0.0.1:$HTTP/metrics")
    [ -n "$REDIS_ADDR" ] && extra+=(-redis-addr "$REDIS_ADDR")
    # shellcheck disable=SC2086
    bin/rls-bench -addr "127.0.0.1:$GRPC" -c 50 -connections 1 -duration "$DUR" -warmup 2s $flags "${extra[@]}" -json \
      > "$OUT/$st-$name.json"
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], round(r["decisions_per_second"]), "dec/s p99", r["latency_us"]["p99"], "us")' "$OUT/$st-$name.json" "$name"
    if command -v ghz >/dev/null && [ -n "$data" ]; then
      ghz --insecure --call envoy.service.ratelimit.v3.RateLimitService.ShouldRateLimit -c 50 --connections 1 \
        -z "$DUR" -d "$data" --format json "127.0.0.1:$GRPC" 2>/dev/null \
        | python3 -c 'import json,sys; d=json.load(sys.stdin); d.pop("details", None); json.dump(d, sys.stdout, indent=1)' \
        > "$OUT/ghz-$st-$name.json" || echo "ghz $name failed"
    fi
  done
  stop_pids "$RLS" "${REDIS_PIDS[@]}"
done

python3 scripts/bench_report.py "$OUT" "$DOC"
echo "== wrote $DOC"
