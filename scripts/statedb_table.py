#!/usr/bin/env python3
"""Turns the output of `cargo bench -p statedb --bench statedb` (mimalloc) and
`--bench statedb_sysalloc` into BENCHMARKS.md's statedb table: median
throughput of each benchmark beside Go statedb's published figure.

usage: statedb_table.py MIMALLOC_LOG[,LOG...] SYSALLOC_LOG[,LOG...]
(several comma-separated logs: each figure is the median over the runs)
"""
import re
import statistics
import sys

# Go statedb's published figures (Intel i5-10210U), objects/s. Changes_Baseline
# and Changes compare with its DeleteTracker_Baseline / DeleteTracker.
GO = {
    "WriteTxn_1": 323e3, "WriteTxn_10": 749e3, "WriteTxn_100": 930e3,
    "WriteTxn_1000": 792e3, "WriteTxn_100_SecondaryIndex": 571e3,
    "RandomInsert": 1.34e6, "RandomReplace": 441e3, "SequentialInsert": 791e3,
    "Changes_Baseline": 789e3, "Changes": 423e3, "RandomLookup": 12.1e6,
    "SequentialLookup": 12.9e6, "FullIteration_All": 82e6,
    "FullIteration_Get": 71.2e6, "Nibbles/WriteTxn_1": 323e3,
    "Nibbles/WriteTxn_100": 930e3, "Nibbles/RandomLookup": 12.1e6,
}
# The same benchmarks written as Go writes them (the suite's `GoShape/` rows:
# ids 0..batch rewritten by every transaction, one tag per object, one
# table committed across iterations), beside the same anchors.
for _n in ["WriteTxn_1", "WriteTxn_10", "WriteTxn_100", "WriteTxn_100_SecondaryIndex",
           "RandomInsert", "RandomReplace", "SequentialInsert"]:
    GO["GoShape/" + _n] = GO[_n]
# The second anchor set: Go statedb on a newer arm64 machine, ns per
# object, as objects/s.
ARM64 = {"WriteTxn_1": 1e9 / 1211, "WriteTxn_100": 1e9 / 385,
         "GoShape/WriteTxn_1": 1e9 / 1211, "GoShape/WriteTxn_100": 1e9 / 385}
UNIT = {"elem/s": 1.0, "Kelem/s": 1e3, "Melem/s": 1e6, "Gelem/s": 1e9}


def medians(path):
    """benchmark name -> median elements/s (criterion's middle estimate)."""
    out, name = {}, None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^(statedb[\w-]*)/(\S+)", line)
        if m:
            name = m.group(2)
        m = re.search(r"thrpt:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
        if m and name and name not in out:
            out[name] = float(m.group(1)) * UNIT[m.group(2)]
    return out


def medians_runs(arg):
    """`medians` over comma-separated logs: each benchmark's median run."""
    runs = [medians(p) for p in arg.split(",")]
    names = {k for r in runs for k in r}
    return {k: statistics.median(r[k] for r in runs if k in r) for k in names}


def fmt(v):
    return f"{v / 1e6:.3f}M" if v >= 1e6 else f"{v / 1e3:.1f}k"


def main():
    mi, sy = medians_runs(sys.argv[1]), medians_runs(sys.argv[2])
    print("| benchmark (objects/s) | ours, mimalloc | ours, system alloc | Go statedb "
          "| ours ÷ Go (mimalloc) | ours ÷ Go (system) |")
    print("|---|---|---|---|---|---|")
    rows = [(name, name.replace("FullIteration_All", "FullIteration_All (100k)")
             .replace("FullIteration_Get", "FullIteration_Get (100k)"), go)
            for name, go in GO.items()]
    rows += [(name, f"{name} (arm64 anchor)", go) for name, go in ARM64.items()]
    for name, label, go in rows:
        if name not in mi:
            continue
        a, b = mi[name], sy.get(name)
        print(f"| {label} | {fmt(a)} | {fmt(b) if b else ''} | {fmt(go)} | {a / go:.2f}× "
              f"| {f'{b / go:.2f}×' if b else ''} |")

if __name__ == "__main__":
    main()
