#!/usr/bin/env bash
# Dynamo's mooncake_bench beside `arbor kv replay --stress` on one trace with
# matching parameters, N alternating runs each in overload (every deadline
# within 1 ms: capacity) and at the trace replayed over 1 s (a rate both keep
# up with: lookup latency); prints each run's achieved block ops/s, lookup
# service p50/p99 and queue p99.
#
#   benches-peers/mooncake-bench/compare.sh TRACE.jsonl LENGTH_FACTOR [N] [WORKERS] [DUPLICATION]
#
# Expects target/release/arbor (cargo build --release -p arbor).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
trace=$(realpath "$1")
lf=$2
n=${3:-5}
workers=${4:-128}
dup=${5:-4}
common=(--trace-duplication-factor "$dup" --trace-length-factor "$lf" --block-size 128 --trace-block-size 512)
out=$(mktemp -d)
for i in $(seq "$n"); do
  for ms in 1 1000; do
    "$root/benches-peers/mooncake-bench/run.sh" "$trace" --num-unique-inference-workers "$workers" "${common[@]}" \
      --num-event-workers 2 --benchmark-duration-ms "$ms" --result-json-output "$out/mb.json" 2>/dev/null |
      awk -v i="$i" -v ms="$ms" '/Offered block/ {a=$(NF-2)} /Query service/ {s=$4; q=$(NF-1)} /kept_up/ {k=$2}
        END {printf "run %s %4s ms  mooncake_bench  achieved %6.2fM block ops/s  service p50/p99 %s us  queue p99 %s us  %s\n", i, ms, a/1e6, s, q, k}'
    "$root/target/release/arbor" kv replay --trace "$trace" --workers "$workers" "${common[@]}" --kv-blocks 16384 \
      --stress --impls ours --event-lanes 2 --window-ms "$ms" --no-progress 2>/dev/null |
      awk -v i="$i" -v ms="$ms" '$1 == "ours" {printf "run %s %4s ms  arbor stress    achieved %7s block ops/s  service p50/p99 %s us  queue p99 %s us  kept_up=%s\n", i, ms, $6, $8, $10, $7}'
  done
done
rm -rf "$out"
