#!/usr/bin/env python3
"""bench/ab.sh's round lines as the markdown tables of bench/RESULTS.md, here, from a fetched ab.log.

    python3 bench/ab_table.py AB.LOG [BASE]

Peer rounds ("round R TREE: tg16 @ 512: 328.6 tok/s, 3.043 ms;...") give ms a step per measure,
decode rounds ("decode round R TREE: decode fast graph on ctx 1024: step 8.723 ms, ratio 4.39 ...")
ms a step per context. Each cell lists the rounds in order, then the mean's difference from the
BASE tree's mean (default: the tree named "head" where there is one, else the first) in ms.
The working tree's lines carry its folder's name (the device's checkout: often "main").
"""
import re
import sys


def parse(path):
    peer, dec, order = {}, {}, []
    for line in open(path, encoding="utf-8", errors="replace"):
        m = re.match(r"^(decode )?round (\d+) (\S+): (.*)$", line.rstrip("\n"))
        if not m:
            continue
        tree = m.group(3)
        if tree.startswith("ab-"):
            tree = tree[3:]
        if tree not in order:
            order.append(tree)
        if m.group(1):
            for part in m.group(4).split(";"):
                d = re.search(r"ctx\s+(\d+): step ([0-9.]+) ms", part)
                if d:
                    dec.setdefault(tree, {}).setdefault("ctx " + d.group(1), []).append(float(d.group(2)))
        else:
            for part in m.group(4).split(";"):
                p = re.match(r"\s*(.+? @ \d+): [0-9.]+ tok/s, ([0-9.]+) ms", part)
                if p:
                    peer.setdefault(tree, {}).setdefault(p.group(1), []).append(float(p.group(2)))
    return peer, dec, order


def table(title, data, order, base):
    if not data:
        return
    cols = []
    for tree in order:
        for c in data.get(tree, {}):
            if c not in cols:
                cols.append(c)
    b = data.get(base, {})
    print(f"{title} (ms a step; rounds, then the mean's difference from {base})\n")
    print("| tree | " + " | ".join(cols) + " |")
    print("| --- |" + " --- |" * len(cols))
    for tree in order:
        if tree not in data:
            continue
        cells = []
        for c in cols:
            v = data[tree].get(c, [])
            if not v:
                cells.append("")
                continue
            cell = ", ".join(f"{x:.3f}" for x in v)
            if tree != base and b.get(c):
                d = sum(v) / len(v) - sum(b[c]) / len(b[c])
                cell += f" ({d:+.3f})"
            cells.append(cell)
        print(f"| {tree} | " + " | ".join(cells) + " |")
    print()


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    peer, dec, order = parse(sys.argv[1])
    if not order:
        print(f"ab_table: no round lines in {sys.argv[1]}", file=sys.stderr)
        return 1
    base = sys.argv[2] if len(sys.argv) > 2 else ("head" if "head" in order else order[0])
    table("Peer model (bench_peer, TP 1)", peer, order, base)
    table("One TP 8 rank (bench_decode)", dec, order, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
