#!/usr/bin/env bash
# What this machine allows two KV95 threads that share nothing: a lone
# one-thread run, then two one-thread processes at once, TRIALS times; prints
# each trial's (sum of the two) / (lone) and the median. Compare with the
# bench's own 1 -> 2 thread scaling (one shared table).
#
#   cargo bench -p statedb --bench kv95 --no-run     # prints the binary's path
#   scripts/kv95_ceiling.sh target/release/deps/kv95-HASH [SECONDS] [TRIALS]
set -euo pipefail
bin=${1:?usage: scripts/kv95_ceiling.sh KV95_BINARY [SECONDS] [TRIALS]}
secs=${2:-1}
trials=${3:-6}
rate() { STATEDB_BENCH_ONLY=1 "$bin" "$secs" 1 | awk '/only:/ {print $5}'; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ratios=()
for i in $(seq "$trials"); do
  alone=$(rate)
  rate > "$tmp/a" &
  rate > "$tmp/b"
  wait
  r=$(awk -v x="$alone" -v a="$(cat "$tmp/a")" -v b="$(cat "$tmp/b")" 'BEGIN {printf "%.2f", (a + b) / x}')
  echo "trial $i: alone $alone ops/s, two processes $(cat "$tmp/a") + $(cat "$tmp/b") ops/s: ${r}x"
  ratios+=("$r")
done
printf '%s\n' "${ratios[@]}" | sort -n | awk '{v[NR] = $1} END {print "median of " NR " trials: " v[int(NR / 2) + 1] "x"}'
