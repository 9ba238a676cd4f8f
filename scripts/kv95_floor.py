#!/usr/bin/env python3
"""KV95 beside its floors: the bench on the shared table (mode 0) and on
the stand-ins of `STATEDB_BENCH_FLOOR` (1: objects alone, a cache line
each, written in place; 2: the same plus one lock and one version word per
write that every read loads; 3: part's tree of the objects published
through an `ArcSwap`, without the database), in rotation for SECONDS, each `-- 0.3 3`.
Pairs are split by where the two CPUs were (the bench's `CPUs N ns apart`,
100 ns and over counting as far). Per mode and placement it prints the
median 1 -> 2 thread scaling, the one-thread time per operation and what a
second thread adds to it, and for the shared table the scaling it would
have if a second thread added only what floor 2 adds:
2 * T1 / (T1 + extra of floor 2), the most any table that publishes one
version per write can reach at this one-thread speed.

    cargo bench -p statedb --bench kv95 --no-run      # prints the binary's path
    scripts/kv95_floor.py target/release/deps/kv95-HASH [SECONDS]
"""
import os
import re
import statistics as st
import subprocess
import sys
import time

ONE = re.compile(r"KV95 1 thread :\s+(\d+) ops/s")
TWO = re.compile(r"KV95 2 threads:\s+(\d+) ops/s")
PAIR = re.compile(r"KV95 scaling 1 -> 2 threads \(pair \d+\): ([\d.]+)x wall.*CPUs (\d+) ns apart")
FAR_NS = 100
MODES = (0, 1, 2, 3)


def pairs(text, mode):
    out, cur = [], {}
    for line in text.splitlines():
        if m := ONE.search(line):
            cur = {"one": float(m[1])}
        elif m := TWO.search(line):
            cur["two"] = float(m[1])
        elif (m := PAIR.search(line)) and "two" in cur:
            cur.update(mode=mode, scaling=float(m[1]), far=int(m[2]) >= FAR_NS)
            out.append(cur)
            cur = {}
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    try:
        seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 300.0
    except ValueError:
        sys.exit(f"SECONDS must be a number, not {sys.argv[2]!r}")
    rows, end = [], time.time() + seconds
    while time.time() < end:
        for mode in MODES:
            env = dict(os.environ)
            env.pop("STATEDB_BENCH_FLOOR", None)
            if mode:
                env["STATEDB_BENCH_FLOOR"] = str(mode)
            run = subprocess.run([binary, "0.3", "3"], env=env, capture_output=True, text=True, check=True)
            rows += pairs(run.stdout, mode)
    names = {0: "shared table", 1: "floor 1 (objects alone)", 2: "floor 2 (+ one version)", 3: "floor 3 (part + ArcSwap)"}
    for far in (False, True):
        place = "far" if far else "near"
        stats = {}
        for mode in MODES:
            r = [x for x in rows if x["mode"] == mode and x["far"] == far]
            if not r:
                continue
            t1 = st.median(1e9 / x["one"] for x in r)
            extra = st.median(2e9 / x["two"] - 1e9 / x["one"] for x in r)
            stats[mode] = (t1, extra)
            print(
                f"{place}: {names[mode]:<24} {len(r):>3} pairs, scaling {st.median(x['scaling'] for x in r):.2f}x, "
                f"one thread {t1:.0f} ns/op, a second thread adds {extra:.0f} ns/op"
            )
        if 0 in stats and 2 in stats:
            t1, extra = stats[0][0], stats[2][1]
            print(f"{place}: the shared table at floor 2's cost would scale {2 * t1 / (t1 + max(extra, 0)):.2f}x")


if __name__ == "__main__":
    main()
