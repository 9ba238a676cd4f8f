#!/usr/bin/env python3
"""Turns the output of `cargo bench -p part --bench part` (one run under the
system allocator, one of `--bench part_mimalloc`) into BENCHMARKS.md's part table.

usage: part_table.py SYSTEM_LOG[,LOG...] MIMALLOC_LOG[,LOG...] [GO_LOG[,LOG...]]
(several comma-separated logs: each time is the median over the runs; the
allocation counts, which do not vary, come from the first). GO_LOG: output of
Go statedb part's `go test -bench ... -benchmem` run on the same machine;
the ratios then compare with its medians instead of the issue's anchors, and
a column gives Go's bytes per key.
"""
import re
import statistics
import sys

# Go statedb `part` anchors (2-core AMD EPYC, Go 1.27): (value, unit, per)
GO = {
    "Insert": (97.6, "µs", 1000),
    "Insert_RootOnlyWatch": (61.5, "µs", 1000),
    "Modify": (51.5, "µs", 1000),
    "GetInsert": (67.2, "µs", 1000),
    "Get": (15.0, "µs", 1000),
    "All": (4.46, "µs", 1000),
    "txn_1": (110, "ns", 1),
    "txn_1000": (60, "ns", 1),
    "txn_delete_1000": (44.7, "ns", 1),
    "Delete_Random": (16.6, "ms", 1),
}
UNIT = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
ORDER = ["Insert", "Insert_RootOnlyWatch", "Modify", "GetInsert", "Replace", "Get", "All",
         "All_Owned", "GetWatch", "WatchReplace", "txn_1", "txn_10", "txn_100", "txn_1000",
         "txn_delete_1", "txn_delete_10", "txn_delete_100", "txn_delete_1000", "Delete_Random"]
PEERS = ["BTreeMap", "HashMap", "imbl_OrdMap", "rpds_RedBlackTreeMapSync", "rart_Versioned"]
# Per-key benchmarks: criterion times one txn of N keys; report per key.
PER_KEY = {"txn_10": 10, "txn_100": 100, "txn_1000": 1000, "txn_delete_10": 10,
           "txn_delete_100": 100, "txn_delete_1000": 1000}


def parse(path):
    times, allocs = {}, {}
    name = None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^((?:part|peers)/\S+)", line)
        if m:
            name = m.group(1)
        m = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
        if m and name:
            times[name] = float(m.group(1)) * UNIT[m.group(2)]
            name = None
        m = re.match(r"^(\S.*?)\s{2,}(\d+\.\d+)\s+(\d+\.\d+)\s*$", line)
        if m:
            allocs[m.group(1).strip()] = (float(m.group(2)), float(m.group(3)))
    return times, allocs


def fmt(sec):
    for unit, scale in (("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if sec >= scale:
            return f"{sec / scale:.3g} {unit}"
    return f"{sec / 1e-9:.3g} ns"


# Go benchmarks whose op is one key (Go's txn_N and txn_delete_N); the
# others time 1000 keys per op (Delete_Random 100k).
GO_PER_KEY = {"txn_1", "txn_1000", "txn_delete_1000"}


def parse_go(arg):
    """Medians of Go's ns/op and its B/op over comma-separated logs."""
    ns, by = {}, {}
    for path in arg.split(","):
        for line in open(path, encoding="utf-8"):
            m = re.match(r"^Benchmark_(\S+?)-\d+\s+\d+\s+(\S+) ns/op.*?(\d+) B/op", line)
            if m:
                ns.setdefault(m.group(1), []).append(float(m.group(2)))
                by.setdefault(m.group(1), []).append(float(m.group(3)))
    return {k: (statistics.median(v) * 1e-9, statistics.median(by[k])) for k, v in ns.items()}


def parse_runs(arg):
    """`parse` over comma-separated logs: the median time of each benchmark."""
    runs = [parse(p) for p in arg.split(",")]
    names = {k for t, _ in runs for k in t}
    times = {k: statistics.median(t[k] for t, _ in runs if k in t) for k in names}
    return times, runs[0][1]


def main():
    sys_t, sys_a = parse_runs(sys.argv[1])
    mi_t, _ = parse_runs(sys.argv[2])
    measured = parse_go(sys.argv[3]) if len(sys.argv) > 3 else None
    go_col = "Go part, same machine (bytes/key)" if measured else "Go part"
    out = [f"| benchmark | ours, system alloc | ours, mimalloc | allocs/op | bytes/op | {go_col} | Go ÷ ours (system) | Go ÷ ours (mimalloc) |",
           "|---|---|---|---|---|---|---|---|"]
    for b in ORDER:
        key = f"part/{b}"
        if key not in sys_t:
            continue
        per = PER_KEY.get(b, 1)
        s, m = sys_t[key] / per, mi_t.get(key, float("nan")) / per
        label = b + (" (per key)" if per > 1 else "")
        a = sys_a.get(b)
        alloc = f"{a[0]:.2f} | {a[1]:.1f}" if a else " | "
        if measured is not None and b in GO and b in measured:
            go, gb = measured[b]
            keys = 100_000 if b == "Delete_Random" else (1 if b in GO_PER_KEY else 1000)
            out.append(f"| {label} | {fmt(s)} | {fmt(m)} | {alloc} | {fmt(go)} ({gb / keys:.1f}) | {go / s:.2f}× | {go / m:.2f}× |")
        elif b in GO:
            v, unit, _ = GO[b]
            go = v * UNIT[unit]
            out.append(f"| {label} | {fmt(s)} | {fmt(m)} | {alloc} | {v} {unit} | {go / s:.2f}× | {go / m:.2f}× |")
        else:
            out.append(f"| {label} | {fmt(s)} | {fmt(m)} | {alloc} | | | |")
    out.append("")
    out.append("| 1000 keys | part (ours) | " + " | ".join(PEERS) + " |")
    out.append("|---|---|" + "---|" * len(PEERS))
    for op in ("Insert", "Get"):
        for times, alloc in ((sys_t, "system alloc"), (mi_t, "mimalloc")):
            ours = times.get(f"part/{op}" if op == "Get" else "part/Insert_RootOnlyWatch")
            row = [fmt(ours) if ours else "?"]
            for p in PEERS:
                t = times.get(f"peers/{op}/{p}")
                row.append(fmt(t) if t else "?")
            out.append(f"| {op} ({alloc}) | " + " | ".join(row) + " |")
    out.append("")
    out.append("| allocations per op | allocs/op | bytes/op |")
    out.append("|---|---|---|")
    for k, (a, by) in sys_a.items():
        out.append(f"| {k} | {a:.2f} | {by:.1f} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
