#!/usr/bin/env python3
"""Locked instructions (`lock`-prefixed, and `xchg` with memory) executed per
operation, from two callgrind profiles of one binary that differ only in
how many operations they ran. Callgrind counts instructions, and a locked
one is one instruction there but costs several nanoseconds (each is also a
full barrier): this turns the profiles into a count that does not depend
on the host's speed.

usage: lockops.py BINARY SMALL.callgrind LARGE.callgrind OPS [SITES]
  OPS: how many more operations LARGE ran than SMALL
  SITES: how many of the busiest sites to list (default 25)

Take the profiles with `--dump-instr=yes`, e.g. for single-row writes:
  valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=/tmp/cg.20000 \\
      target/release/examples/single_writes 20000 1000 seq
  (and 40000), then: lockops.py target/release/examples/single_writes \\
      /tmp/cg.20000 /tmp/cg.40000 20000
"""
import collections
import os
import re
import signal
import subprocess
import sys


def locked_sites(binary):
    """Address -> (function, mnemonic) of every locked instruction."""
    out = subprocess.run(
        ["objdump", "-d", "-C", "--no-show-raw-insn", binary],
        capture_output=True, text=True, check=True,
    ).stdout
    sites, fn = {}, None
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.*)>:$", line)
        if m:
            fn = m.group(2)
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(\S*)", line)
        if not m:
            continue
        op, args = m.group(2), m.group(3)
        if op == "lock" or (op.startswith("xchg") and "(" in args):
            mnemonic = f"{op} {args.split(',')[0]}" if op == "lock" else op
            sites[int(m.group(1), 16)] = (fn, mnemonic)
    return sites


def self_costs(profile, binary):
    """Instruction address (in the binary's own numbering) -> times run,
    for the binary's own code (callgrind's compressed positions undone;
    call lines' inclusive costs skipped)."""
    name = os.path.basename(binary)
    ids = set()
    with open(profile) as f:
        for line in f:
            m = re.match(r"^c?ob=\((\d+)\)\s*(\S*)", line)
            if m and m.group(2) and os.path.basename(m.group(2)) == name:
                ids.add(m.group(1))
    counts = collections.Counter()
    last = [0, 0]
    ours = skip = False

    def pos(tok, i):
        if tok == "*":
            return last[i]
        if tok[0] in "+-":
            return last[i] + int(tok, 0)
        return int(tok, 0)

    with open(profile) as f:
        for line in f:
            if not line.strip():
                continue
            c = line[0]
            if c.isalpha():
                if line.startswith("calls="):
                    skip = True
                elif line.startswith("ob="):
                    m = re.match(r"^ob=\((\d+)\)", line)
                    ours = bool(m) and m.group(1) in ids
                continue
            if c not in "0123456789+-*":
                continue
            parts = line.split()
            if len(parts) < 2:
                continue
            # Positions update even on a line without a cost.
            last[0], last[1] = pos(parts[0], 0), pos(parts[1], 1)
            if skip:
                skip = False
                continue
            if ours and len(parts) > 2:
                counts[last[0]] += int(parts[-1])
    return counts


def main():
    # Quiet when piped into `head`.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    binary, small, large, ops = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    top = int(sys.argv[5]) if len(sys.argv) > 5 else 25
    sites = locked_sites(binary)
    a, b = self_costs(small, binary), self_costs(large, binary)
    per = {s: (b.get(s, 0) - a.get(s, 0)) / ops for s in sites}
    print(f"locked instructions per operation: {sum(per.values()):.2f}")
    by_fn = collections.Counter()
    for s, v in per.items():
        by_fn[sites[s][0]] += v
    print("\nby function:")
    for fn, v in by_fn.most_common(top):
        if v >= 0.01:
            print(f"{v:7.2f}  {fn}")
    busiest = [s for s, v in sorted(per.items(), key=lambda x: -x[1])[:top] if v >= 0.01]
    print("\nby site (the innermost source line outside the standard library and registry crates):")
    for s in busiest:
        chain = subprocess.run(
            ["addr2line", "-i", "-e", binary, hex(s)], capture_output=True, text=True
        ).stdout.splitlines()
        own = [l for l in chain if not l.startswith("/rustc/") and "/.cargo/registry/" not in l]
        where = (own or chain or ["?"])[0]
        print(f"{per[s]:7.2f}  {hex(s)}  {sites[s][1]:14}  {where}")


if __name__ == "__main__":
    main()
