#!/usr/bin/env python3
"""The hottest SASS lines of one kernel from `ncu --import R --page source --print-source sass --csv`
(s52-next.sh writes it as ncu_sass.csv): the rows sorted by the stall-sampling column (any column
whose name holds "Sampling" and "All"; else the first with "Sampling"), each with its share of all
samples, address and instruction, and the total per opcode. Column names differ between ncu
versions, so they are found by substring; the header row is the first that has a "Source" column.
  python3 bench/pending/s52-ncu-top.py ncu_sass.csv [N]"""
import csv
import sys
from collections import Counter


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(sys.argv[1], newline="", errors="replace") as f:
        rows = list(csv.reader(f))
    hi = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), None)
    if hi is None:
        sys.exit("no header row with a Source column")
    head = [c.strip() for c in rows[hi]]
    src = head.index("Source")
    samp = [i for i, c in enumerate(head) if "Sampling" in c and "All" in c] or \
           [i for i, c in enumerate(head) if "Sampling" in c]
    if not samp:
        sys.exit("no sampling column among: " + ", ".join(head))
    sc = samp[0]
    addr = next((i for i, c in enumerate(head) if c.startswith("Address")), None)

    def num(s):
        try:
            return float(s.replace(",", ""))
        except ValueError:
            return 0.0

    body = [r for r in rows[hi + 1:] if len(r) > max(src, sc)]
    tot = sum(num(r[sc]) for r in body) or 1.0
    print(f"{len(body)} SASS lines, {tot:.0f} samples in '{head[sc]}'")
    for r in sorted(body, key=lambda r: -num(r[sc]))[:n]:
        a = r[addr] if addr is not None else ""
        print(f"{100 * num(r[sc]) / tot:6.2f}%  {a:>8}  {r[src].strip()}")
    ops = Counter()
    for r in body:
        op = r[src].strip().split()
        if op:
            o = op[0] if not op[0].startswith("@") or len(op) < 2 else op[1]
            ops[o.split(".")[0]] += num(r[sc])
    print("by opcode:", ", ".join(f"{o} {100 * v / tot:.1f}%" for o, v in ops.most_common(12)))


if __name__ == "__main__":
    main()
