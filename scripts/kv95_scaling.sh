#!/usr/bin/env bash
# KV95 thread scaling for a machine with more cores than this one (the
# 16-core device machine): alternating 1/2-thread pairs, then 4, 8 and 16
# threads alone, each on a fresh 100k-object table, from a kv95 bench binary
# built here (the device machine reaches no registry, so it cannot build):
#
#   cargo bench -p statedb --bench kv95 --no-run     # prints the binary's path
#   scripts/kv95_scaling.sh target/release/deps/kv95-HASH [SECONDS] [PAIRS]
#
# On the device machine, carry that one file (`run` with
# carry=["target/release/deps/kv95-HASH"]).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: scripts/kv95_scaling.sh KV95_BINARY [SECONDS] [PAIRS]}
secs=${2:-1}
pairs=${3:-3}
echo "# $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
"$bin" "$secs" "$pairs"
for n in 4 8 16; do
  if [ "$n" -le "$(nproc)" ]; then
    STATEDB_BENCH_ONLY=$n "$bin" "$secs" 1
  fi
done
