#!/usr/bin/env bash
# What this machine allows two KV95 threads that share nothing, beside the
# shared table: TRIALS pairs of the kv95 bench with STATEDB_BENCH_CEILING,
# each also running a database per thread and two one-thread processes at
# once, their clocks lined up (the bench's own code; until session 36 this
# script started the two processes itself, unsynchronised, and printed one
# line per trial).
#
#   cargo bench -p statedb --bench kv95 --no-run     # prints the binary's path
#   scripts/kv95_ceiling.sh target/release/deps/kv95-HASH [SECONDS] [TRIALS]
set -euo pipefail
bin=${1:?usage: scripts/kv95_ceiling.sh KV95_BINARY [SECONDS] [TRIALS]}
STATEDB_BENCH_CEILING=1 exec "$bin" "${2:-1}" "${3:-6}"
