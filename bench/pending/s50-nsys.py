#!/usr/bin/env python3
"""Summarises an nsys cuda_gpu_trace CSV (nsys stats -r cuda_gpu_trace -f csv) of bench_decode's
graph steps: splits the trace into steps at host gaps (> GAP_US idle between kernels), then for
the last full step prints its wall time, the time some kernel runs (union of intervals), the idle
rest, and per kernel name: count, summed and mean duration, and the idle time just before it."""
import csv, sys, collections

GAP_US = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
rows = []
with open(sys.argv[1], newline="") as f:
    lines = [l for l in f if l.strip()]
start = next(i for i, l in enumerate(lines) if l.startswith('"Start') or l.startswith("Start"))
for r in csv.DictReader(lines[start:]):
    name = r.get("Name") or ""
    try:
        s = float(r["Start (ns)"]) / 1e3
        d = float(r["Duration (ns)"]) / 1e3
    except (KeyError, ValueError):
        continue
    if "memcpy" in name.lower() or "memset" in name.lower():
        continue
    rows.append((s, d, name, r.get("Strm", "")))
rows.sort()
steps, cur, end = [], [], None
for k in rows:
    if end is not None and k[0] - end > GAP_US and cur:
        steps.append(cur)
        cur = []
    cur.append(k)
    end = max(end or 0, k[0] + k[1])
if cur:
    steps.append(cur)
big = [s for s in steps if len(s) > 100]
print(f"{len(rows)} kernels, {len(steps)} groups split at {GAP_US} us gaps, {len(big)} of > 100 kernels")
print("last groups (kernels, first kernel):", [(len(s), s[0][2][:30]) for s in steps[-8:]])
if not big:
    sys.exit(0)
size = collections.Counter(len(s) for s in big).most_common(1)[0][0]
st = [s for s in big if len(s) == size][-1]
t0 = st[0][0]
t1 = max(s + d for s, d, _, _ in st)
busy, ce = 0.0, t0
idle_before = collections.Counter()
for s, d, name, _ in st:
    if s > ce:
        idle_before[name] += s - ce
    e = s + d
    if e > ce:
        busy += e - max(s, ce)
        ce = e
print(f"step: {len(st)} kernels, wall {t1 - t0:.1f} us, some kernel running {busy:.1f} us, idle {t1 - t0 - busy:.1f} us")
print(f"streams: {sorted(collections.Counter(k[3] for k in st).items())}")
agg = collections.defaultdict(lambda: [0, 0.0])
for s, d, name, _ in st:
    a = agg[name[:70]]
    a[0] += 1
    a[1] += d
print(f"{'kernel':72s} {'count':>6s} {'sum us':>9s} {'mean us':>8s} {'idle before':>11s}")
for name, (c, t) in sorted(agg.items(), key=lambda x: -x[1][1])[:40]:
    ib = sum(v for k, v in idle_before.items() if k[:70] == name)
    print(f"{name:72s} {c:6d} {t:9.1f} {t / c:8.2f} {ib:11.1f}")
