#!/usr/bin/env bash
# Index write capacity under the system allocator, mimalloc and jemalloc:
# `arbor kv replay --stress` with a 1 ms window (every entry is late, so the
# lanes run flat out and the achieved rate is the capacity), our index and the
# reference, 1 and 2 event lanes, ROUNDS interleaved rounds; prints medians.
#
#   scripts/alloc_compare.sh [ROUNDS] [extra arbor flags, e.g. --trace FILE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
shift || true
out=$(mktemp -d)
for a in system mimalloc jemalloc; do
  if [ "$a" = system ]; then
    cargo build --release -q -p arbor
  else
    cargo build --release -q -p arbor --features "$a"
  fi
  cp target/release/arbor "$out/arbor-$a"
done
cargo build --release -q -p arbor # leave the default binary in place
for r in $(seq 1 "$rounds"); do
  for a in system mimalloc jemalloc; do
    "$out/arbor-$a" kv replay --stress --window-ms 1 --event-lanes 1,2 \
      --impls ours,reference --no-progress --json "$out/$a-$r.json" "$@" >/dev/null
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for a in ["system", "mimalloc", "jemalloc"]:
    for r in range(1, rounds + 1):
        for s in json.load(open(f"{out}/{a}-{r}.json"))["stress"]:
            rows.setdefault((s["index"], s["event_lanes"], a), []).append(s["achieved_ops_per_s"])
print(f"median of {rounds} rounds, block ops/s at overload (1 ms window)")
print(f"{'index':10} {'lanes':>5} {'system':>10} {'mimalloc':>10} {'jemalloc':>10} {'mi/sys':>7} {'je/sys':>7}")
for idx in ["ours", "reference"]:
    for lanes in [1, 2]:
        m = {a: statistics.median(rows[(idx, lanes, a)]) for a in ["system", "mimalloc", "jemalloc"]}
        print(f"{idx:10} {lanes:>5} {m['system']/1e6:>9.2f}M {m['mimalloc']/1e6:>9.2f}M {m['jemalloc']/1e6:>9.2f}M "
              f"{m['mimalloc']/m['system']:>6.2f}x {m['jemalloc']/m['system']:>6.2f}x")
PY
