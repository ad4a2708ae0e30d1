#!/usr/bin/env python3
"""Summarises an ncu source page (`ncu -i R --page source --csv --print-source sass`): warp-state
samples by opcode and stall reason, and the hottest instructions with their first stall reasons.
Usage: ncu_source_summary.py SOURCE.csv [top]"""
import collections
import csv
import sys


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    cols = rows[head]
    idx = {c: i for i, c in enumerate(cols)}
    stalls = [c for c in cols if c.startswith("stall_") and "Not Issued" not in c]
    recs = []
    for r in rows[head + 1:]:
        if len(r) != len(cols):
            continue
        try:
            samples = int(r[idx["Warp Stall Sampling (All Samples)"]] or 0)
            executed = int(r[idx["Instructions Executed"]] or 0)
        except ValueError:
            continue
        sass = r[idx["Source"]].strip()
        per = {s: int(r[idx[s]] or 0) for s in stalls}
        recs.append((r[idx["Address"]], sass, samples, executed, per))
    total = sum(x[2] for x in recs) or 1
    executed = sum(x[3] for x in recs)
    print(f"{path}: {len(recs)} instructions, {total} samples, {executed} warp instructions executed")
    by_stall = collections.Counter()
    by_op = collections.Counter()
    exec_op = collections.Counter()
    for _, sass, s, e, per in recs:
        op = sass.split()[0] if sass else "?"
        if op.startswith("@"):
            op = sass.split()[1]
        op = op.split(".")[0]
        by_op[op] += s
        exec_op[op] += e
        by_stall.update(per)
    print("stall reasons (% of samples): " + ", ".join(f"{k[6:]} {100 * v / total:.1f}" for k, v in by_stall.most_common(10)))
    print("opcodes (% of samples / executed): " + ", ".join(
        f"{k} {100 * v / total:.1f}/{exec_op[k]}" for k, v in by_op.most_common(16)))
    print(f"hottest {top} instructions:")
    for i, (addr, sass, s, e, per) in enumerate(sorted(recs, key=lambda x: -x[2])[:top]):
        reasons = ", ".join(f"{k[6:]} {v}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])[:3] if v)
        order = next(j for j, x in enumerate(recs) if x[0] == addr)
        print(f"  #{order:5d} {100 * s / total:5.1f}%  exec {e:7d}  {sass[:60]:60s} {reasons}")


if __name__ == "__main__":
    main()
