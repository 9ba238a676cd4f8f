#!/usr/bin/env bash
# Go's part and ours, Delete_Random only, in alternating pairs: this VM's
# memory latency drifts within seconds, so one round of each says little;
# the median of the per-pair ratios does.
#
#   GOPART=/path/to/statedb-checkout scripts/paired_delete_random.sh PAIRS OUR_BENCH_BIN...
#
# GOPART: a checkout of Cilium statedb (its `part` package); GO: the go binary.
# OUR_BENCH_BIN: built criterion binaries of `part` / `part_mimalloc`
# (`cargo bench -p part --bench part --no-run` prints their paths).
set -euo pipefail
pairs=${1:?pairs}; shift
go=${GO:-go}
for i in $(seq 1 "$pairs"); do
  g=$(cd "$GOPART" && GOFLAGS=-mod=mod GOPROXY=off GOTOOLCHAIN=local GOTELEMETRY=off \
      "$go" test -run xxx -bench 'Benchmark_Delete_Random$' -count 1 ./part/ \
      | awk '/^Benchmark_Delete_Random/ {print $3 / 1e6}')
  line="pair $i go ${g} ms"
  for bin in "$@"; do
    ours=$("$bin" --bench --noplot 'part/Delete_Random$' 2>/dev/null \
      | awk '/^part\/Delete_Random/ && /time:/ {print $5, $6; exit}')
    ms=$(awk -v v="${ours% *}" -v u="${ours#* }" 'BEGIN {print (u == "ms") ? v : (u == "s") ? v * 1000 : v / 1000}')
    line="$line | $(basename "$bin") ${ms} ms ratio $(awk -v g="$g" -v o="$ms" 'BEGIN {printf "%.2f", g / o}')"
  done
  echo "$line"
done
