#!/usr/bin/env bash
# The cost of tracing in process, for docs/bench/HISTORY.md's
# "Tracing": pkg/service's BenchmarkHandler at BASE (default 8e491a3, main
# before tracing) against this tree with tracing off, and this tree's
# BenchmarkHandlerTracing (every call sampled; every call sampled out), in
# alternated runs (the order reversed every other round), ROUNDS rounds of N
# calls per case. Prints per case the medians of wall ns/op and of CPU per
# call (user+sys of the whole test process over N calls: GC and the span
# processor's goroutine included, and less disturbed than wall time by the
# other jobs of a shared machine), and allocs/op.
#
#   scripts/bench-tracing.sh [BASE]        # ROUNDS=10 N=200000 by default
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:-8e491a3}
ROUNDS=${ROUNDS:-10}
N=${N:-200000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/base"
git archive "$BASE" | tar -x -C "$tmp/base"
(cd "$tmp/base" && go test -c -o "$tmp/base.test" ./pkg/service)
go test -c -o "$tmp/new.test" ./pkg/service

results=$tmp/results.txt
for i in $(seq 1 "$ROUNDS"); do
  for c in one_key 1000_keys two_descriptors; do
    runs=("base ^BenchmarkHandler\$/^$c\$" "new ^BenchmarkHandler\$/^$c\$"
      "new ^BenchmarkHandlerTracing\$/^sampled\$/^$c\$" "new ^BenchmarkHandlerTracing\$/^sampled_out\$/^$c\$")
    if [ $((i % 2)) = 0 ]; then runs=("${runs[3]}" "${runs[2]}" "${runs[1]}" "${runs[0]}"); fi
    for r in "${runs[@]}"; do
      set -- $r
      TIMEFORMAT='%U %S'
      { time "$tmp/$1.test" -test.run '^$' -test.bench "$2" -test.benchmem -test.benchtime "${N}x" -test.count 1 \
          | grep '^Benchmark' | sed "s|^|$1 |" >>"$results"; } 2>"$tmp/time"
      read -r user sys < <(tail -n 1 "$tmp/time")
      echo "cpu $1 $2 $user $sys" >>"$results"
    done
  done
done

python3 - "$results" "$N" <<'EOF'
import collections, re, statistics, sys
path, n = sys.argv[1], int(sys.argv[2])
wall, cpu, allocs = collections.defaultdict(list), collections.defaultdict(list), {}
last = None
for line in open(path):
    f = line.split()
    if f[0] == "cpu":
        cpu[last].append((float(f[3]) + float(f[4])) * 1e9 / n)
        continue
    last = (f[0], re.sub(r"-\d+$", "", f[1]))
    wall[last].append(float(f[3]))
    allocs[last] = f[7]
print(f"{'tree':4} {'benchmark':52} {'wall ns/op':>10} {'CPU ns/call':>11} {'allocs/op':>9}")
for k in sorted(wall, key=lambda k: (k[1].rsplit("/", 1)[-1], k[1], k[0] != "base")):
    print(f"{k[0]:4} {k[1]:52} {statistics.median(wall[k]):10.0f} {statistics.median(cpu[k]):11.0f} {allocs[k]:>9}")
print(f"medians of {len(wall[k])} alternated runs of {n} calls")
EOF
