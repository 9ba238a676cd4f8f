#!/usr/bin/env bash
# Dynamo's own Mooncake harness, `mooncake_bench` from crates.io
# `dynamo-bench` 1.6.1 (feature `mooncake`), fetched into target/ on first
# use, built with its own Cargo.lock and run with the arguments given
# (relative paths of existing files are made absolute: cargo runs benches
# from the package's directory).
#
#   benches-peers/mooncake-bench/run.sh TRACE.jsonl --num-unique-inference-workers 128 \
#     --trace-duplication-factor 4 --trace-length-factor 1 --block-size 128 \
#     --trace-block-size 512 --num-event-workers 2 --benchmark-duration-ms 2000
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=1.6.1
src=$here/target/dynamo-bench-$version
if [ ! -f "$src/Cargo.toml" ]; then
  mkdir -p "$here/target"
  curl -fsSL "https://static.crates.io/crates/dynamo-bench/dynamo-bench-$version.crate" |
    tar xz -C "$here/target"
fi
args=()
for a in "$@"; do
  if [ -f "$a" ]; then a=$(realpath "$a"); fi
  args+=("$a")
done
cd "$src"
cargo bench --locked --no-default-features --features mooncake --bench mooncake_bench -- "${args[@]}"
