#!/usr/bin/env bash
# soak.sh — SOAK_MINUTES (default 10) of mixed load against rls on Redis,
# with a Redis restart and a config reload every minute (`make soak`; not CI).
#
# It builds bin/rls and bin/rls-bench, starts redis-server and rls on free
# loopback ports (--store redis, --debug-addr on loopback), and each minute
# runs two rls-bench loads side by side (closed loop, zipf keys, 2 descriptors
# per request; open loop, uniform keys over 1M, 4 descriptors) while it kills
# Redis by PID and starts it again on the same port, and edits the config
# (a reload). After each minute it samples rls's heap and goroutines and the
# decision errors, and prints them as a table at the end. Every process it
# started is stopped by PID on exit.
#
# Environment: SOAK_MINUTES (10), SOAK_RATE (open-loop requests/s, 500),
# SOAK_CONCURRENCY (closed-loop workers, 16), SOAK_RACE (1: build rls with
# -race), SOAK_KEEP (1: keep the work directory with the logs),
# SOAK_RLS_FLAGS (extra rls serve flags, e.g. "--redis-timeout 50ms").
# Exit status: 1 when rls died, a minute's reload did not happen, or a bench
# run reported UNKNOWN codes.
set -euo pipefail

MINUTES=${SOAK_MINUTES:-10}
RATE=${SOAK_RATE:-500}
CONC=${SOAK_CONCURRENCY:-16}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
GO=${GO:-go}

for tool in redis-server redis-cli curl; do
	command -v "$tool" >/dev/null || { echo "soak: $tool not found (make deps)" >&2; exit 1; }
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rls-soak.XXXXXX")
REDIS_PID=""
RLS_PID=""
BENCH_PIDS=()

stop_pid() { # stop_pid PID: SIGTERM, then SIGKILL after 10 s
	local pid=$1 i
	[ -n "$pid" ] || return 0
	kill -0 "$pid" 2>/dev/null || return 0
	kill "$pid" 2>/dev/null || true
	for i in $(seq 100); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL "$pid" 2>/dev/null || true
}

cleanup() {
	local pid
	for pid in "${BENCH_PIDS[@]}"; do stop_pid "$pid"; done
	stop_pid "$RLS_PID"
	stop_pid "$REDIS_PID"
	wait 2>/dev/null || true
	if [ "${SOAK_KEEP:-0}" = 1 ]; then
		echo "soak: logs kept in $WORK"
	else
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port prints a loopback TCP port nothing listens on.
free_port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
}

REDIS_PORT=$(free_port)
GRPC_PORT=$(free_port)
HTTP_PORT=$(free_port)
DEBUG_PORT=$(free_port)
METRICS="http://127.0.0.1:$HTTP_PORT/metrics"

start_redis() {
	redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
		--dir "$WORK" --logfile "$WORK/redis.log" &
	REDIS_PID=$!
	local i
	for i in $(seq 100); do
		redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0
		sleep 0.05
	done
	echo "soak: redis-server did not answer on port $REDIS_PORT" >&2
	exit 1
}

# metric NAME [LABEL]: the sum of the samples of NAME in /metrics whose
# labels contain LABEL (0 when absent).
metric() {
	curl -fsS "$METRICS" 2>/dev/null | awk -v n="$1" -v l="${2:-}" '
		($1 == n || index($1, n "{") == 1) && index($1, l) { s += $NF }
		END { printf "%.0f", s }'
}

# write_config N: the config, with limits that change with N.
write_config() {
	cat >"$WORK/config/soak.yaml.tmp" <<EOF
# soak config, version $1
domain: soak
descriptors:
  - key: api_key
    rate_limit: {name: per-key, unit: minute, requests_per_unit: $((100 + $1))}
    descriptors:
      - key: route
        rate_limit: {name: per-route, unit: second, requests_per_unit: $((5 + $1 % 3)), algorithm: token_bucket, burst: 10}
  - key: remote_address
    rate_limit: {name: per-ip, unit: second, requests_per_unit: 50, algorithm: fixed_window}
  - key: generic_key
    value: login
    rate_limit: {name: login, unit: second, requests_per_unit: $((200 + $1))}
EOF
	mv "$WORK/config/soak.yaml.tmp" "$WORK/config/soak.yaml"
}

echo "soak: building bin/rls and bin/rls-bench"
mkdir -p bin "$WORK/config"
race=()
[ "${SOAK_RACE:-0}" = 1 ] && race=(-race)
"$GO" build "${race[@]}" -o bin/rls ./cmd/rls
(cd bench && "$GO" build -o ../bin/rls-bench .)

write_config 0
start_redis
# shellcheck disable=SC2086 # SOAK_RLS_FLAGS is split into flags on purpose
bin/rls serve --config-dir "$WORK/config" --store redis \
	--redis-url "redis://127.0.0.1:$REDIS_PORT" \
	--grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" \
	--debug-addr "127.0.0.1:$DEBUG_PORT" ${SOAK_RLS_FLAGS:-} >"$WORK/rls.log" 2>&1 &
RLS_PID=$!
for i in $(seq 200); do
	curl -fsS "http://127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null 2>&1 && break
	kill -0 "$RLS_PID" 2>/dev/null || { echo "soak: rls exited:"; cat "$WORK/rls.log"; exit 1; }
	sleep 0.1
done
echo "soak: rls pid $RLS_PID (gRPC 127.0.0.1:$GRPC_PORT, HTTP :$HTTP_PORT, debug :$DEBUG_PORT), redis pid $REDIS_PID (:$REDIS_PORT), $MINUTES minutes"

# json_num FILE FIELD: a top-level number of a bench JSON report (0 when absent).
json_num() {
	local v
	v=$(sed -n "s/^  \"$2\": *\([0-9]*\).*/\1/p" "$1" | head -1)
	echo "${v:-0}"
}

# json_errors FILE: the sum of the report's errors by gRPC code (0 when none).
json_errors() {
	tr -d '\n' <"$1" | sed -n 's/.*"errors": *{\([^}]*\)}.*/\1/p' | tr ',' '\n' |
		sed -n 's/.*: *\([0-9][0-9]*\).*/\1/p' | awk '{ s += $1 } END { printf "%d", s }'
}

rows=()
status=0
prev_store_err=$(metric rls_store_errors_total)
prev_fallback=$(metric rls_fallback_decisions_total)
prev_reloads=$(metric rls_config_reloads_total 'result="success"')
start=$(date +%s)
for m in $(seq "$MINUTES"); do
	BENCH_PIDS=()
	bin/rls-bench -addr "127.0.0.1:$GRPC_PORT" -domain soak -descriptors 2 -dist zipf -keys 100000 \
		-c "$CONC" -connections 2 -duration 60s -warmup 0 -seed "$m" -json \
		-metrics-url "$METRICS" >"$WORK/bench-closed-$m.json" 2>"$WORK/bench-closed-$m.err" &
	BENCH_PIDS+=($!)
	bin/rls-bench -addr "127.0.0.1:$GRPC_PORT" -domain soak -descriptors 4 -dist uniform -keys 1000000 \
		-rate "$RATE" -c 32 -duration 60s -warmup 0 -seed "$((m + 1000))" -json \
		>"$WORK/bench-open-$m.json" 2>"$WORK/bench-open-$m.err" &
	BENCH_PIDS+=($!)

	sleep 20
	# Redis restart: kill by PID, start again on the same port.
	t0=$(date +%s.%N)
	kill -KILL "$REDIS_PID"
	wait "$REDIS_PID" 2>/dev/null || true
	start_redis
	down=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')

	sleep 10
	write_config "$m" # a reload (file event, and the 10 s poll)

	for pid in "${BENCH_PIDS[@]}"; do wait "$pid" || true; done
	BENCH_PIDS=()
	if ! kill -0 "$RLS_PID" 2>/dev/null; then
		echo "soak: rls died in minute $m" >&2
		status=1
		break
	fi

	heap=$(metric go_memstats_heap_inuse_bytes)
	gor=$(metric go_goroutines)
	store_err=$(metric rls_store_errors_total)
	fallback=$(metric rls_fallback_decisions_total)
	reloads=$(metric rls_config_reloads_total 'result="success"')
	decisions=0 grpc_err=0 unknown=0
	for kind in closed open; do
		f="$WORK/bench-$kind-$m.json"
		if [ ! -s "$f" ]; then
			echo "soak: minute $m: rls-bench ($kind) wrote no report:" >&2
			cat "$WORK/bench-$kind-$m.err" >&2
			status=1
			continue
		fi
		decisions=$((decisions + $(json_num "$f" decisions)))
		grpc_err=$((grpc_err + $(json_errors "$f")))
		unknown=$((unknown + $(json_num "$f" unknown)))
	done
	if [ "$unknown" -gt 0 ]; then status=1; fi
	if [ "$reloads" -le "$prev_reloads" ]; then
		echo "soak: minute $m: no config reload" >&2
		status=1
	fi
	rows+=("$(printf '%6d %9.1f %10d %10d %9d %10d %11d %9d %8s' "$m" \
		"$(awk -v h="$heap" 'BEGIN { print h / 1048576 }')" "$gor" "$decisions" "$grpc_err" \
		"$((store_err - prev_store_err))" "$((fallback - prev_fallback))" "$((reloads - prev_reloads))" "${down}s")")
	echo "soak: ${rows[-1]}"
	prev_store_err=$store_err prev_fallback=$fallback prev_reloads=$reloads
done

echo
echo "soak: $MINUTES minute(s) in $(($(date +%s) - start)) s; rls pid $RLS_PID; one Redis restart (SIGKILL) and one config reload per minute"
printf '%6s %9s %10s %10s %9s %10s %11s %9s %8s\n' minute heap_MiB goroutines decisions rpc_errors store_errs fallback_dec reloads redis_down
for r in "${rows[@]}"; do echo "$r"; done
echo "(heap = go_memstats_heap_inuse_bytes, goroutines = go_goroutines at the end of the minute; decisions and rpc_errors from rls-bench;"
echo " store_errs, fallback_dec and reloads are the minute's increase of rls_store_errors_total, rls_fallback_decisions_total, rls_config_reloads_total)"
exit "$status"
