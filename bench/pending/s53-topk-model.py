#!/usr/bin/env python3
"""A model of bench/pending/topkbench.cu's k_topk_cmp (session 53): pick_wide lane for lane, the sweeps
at block level, against a sort (lowest positions first among equal keys), on 35 rows: 2049-32768
keys of random scores, all equal, four values, mostly zero, normal, a ramp, five values with
+0 / -0. Prints one line per row and exits 1 on any difference. Run: python3 s53-topk-model.py"""
import random, struct, sys
def key_of(f):
    if f == 0.0: u = 0
    else: u = struct.unpack('<I', struct.pack('<f', f))[0]
    return (~u) & 0xFFFFFFFF if u & 0x80000000 else u | 0x80000000
def ref(keys, K):
    order = sorted(range(len(keys)), key=lambda i: (-keys[i], i))[:K]
    return sorted(order)
def pick(h, rem):  # largest b with S(b) >= rem; S(b+1)
    S = 0; 
    for b in range(len(h)-1, -1, -1):
        if S + h[b] >= rem: return b, S
        S += h[b]
    return 0, S - h[0]
def pick_wide(h, rem):
    # emulate lanes
    own = [sum(h[64*l:64*l+64]) for l in range(32)]
    suf = [sum(own[l:]) for l in range(32)]
    L = max([l for l in range(32) if suf[l] >= rem], default=-1)
    if L < 0: L = 0
    beyond = suf[L] - own[L]
    pairs = [h[64*L+2*j] + h[64*L+2*j+1] for j in range(32)]
    best = -1; ab = 0; abs_ = {}
    for j in range(32):
        sp = sum(pairs[j:]); v0 = h[64*L+2*j]; v1 = h[64*L+2*j+1]
        S0 = beyond + sp; S1 = S0 - v0
        mine = -1; a = 0
        if S0 >= rem: mine, a = 64*L+2*j, S1
        if S1 >= rem: mine, a = 64*L+2*j+1, S1 - v1
        abs_[j] = a
        best = max(best, mine)
    if best < 0: best = 0
    return best, abs_[(best - 64*L) >> 1]
def cmp(keys, K, CAP=4096):
    cnt = len(keys); W = 32
    chunk = (cnt + W*32 - 1)//(W*32)*32
    kmin, kmax = min(keys), max(keys)
    d = kmin ^ kmax
    bits = d.bit_length()
    prefix = 0 if bits == 32 else kmax & ((0xFFFFFFFF << bits) & 0xFFFFFFFF)
    rem = K; counted = False
    wgt = [0]*W; weq = [0]*W
    if bits > 0:
        w1 = min(11, bits); sh1 = bits - w1; m1 = (1 << w1) - 1
        h = [0]*2048
        for k in keys: h[(k >> sh1) & m1] += 1
        b, above = pick_wide(h, K)
        assert (b, above) == pick(h, K), ((b, above), pick(h, K))
        prefix |= b << sh1; rem = K - above; bits = sh1
        if bits > 0:
            B = b; cand = []
            for w in range(W):
                c0 = min(cnt, w*chunk); c1 = min(cnt, c0+chunk)
                for s in range(c0, c1):
                    bn = (keys[s] >> sh1) & m1
                    if bn > B: wgt[w] += 1
                    if bn == B: cand.append(s)
            random.shuffle(cand)
            src = cand if len(cand) <= CAP else list(range(cnt))
            while bits > 0:
                w = min(8, bits); sh = bits - w
                hi = (0xFFFFFFFF << (sh + w)) & 0xFFFFFFFF
                h = [0]*256
                for s in src:
                    if keys[s] & hi == prefix & hi: h[(keys[s] >> sh) & 0xFF] += 1
                b, above = pick(h, rem)
                prefix |= b << sh; rem -= above; bits -= w
            if len(cand) <= CAP:
                for s in cand:
                    if keys[s] > prefix: wgt[s // chunk] += 1
                    elif keys[s] == prefix: weq[s // chunk] += 1
                counted = True
    thr = prefix; need = rem
    if not counted:
        wgt = [0]*W; weq = [0]*W
        for w in range(W):
            c0 = min(cnt, w*chunk); c1 = min(cnt, c0+chunk)
            for s in range(c0, c1):
                wgt[w] += keys[s] > thr; weq[w] += keys[s] == thr
    out = [None]*K
    tk = 0; es = 0
    for w in range(W):
        c0 = min(cnt, w*chunk); c1 = min(cnt, c0+chunk)
        taken = tk + min(es, need); eqs = es
        for s in range(c0, c1):
            if keys[s] > thr or (keys[s] == thr and eqs < need):
                out[taken] = s; taken += 1
            if keys[s] == thr: eqs += 1
        tk += wgt[w]; es += weq[w]
    return out
random.seed(1)
bad = 0
for cnt in [2049, 3000, 4096, 16400, 32768]:
    for kind in range(7):
        if kind == 0: v = [sum(max(0, random.gauss(0,3))*random.random() for _ in range(8)) + 16 for _ in range(cnt)]
        elif kind == 1: v = [1.0]*cnt
        elif kind == 2: v = [float(random.randint(0,3)) for _ in range(cnt)]
        elif kind == 3: v = [0.0 if random.random() < 0.9 else random.random() for _ in range(cnt)]
        elif kind == 4: v = [random.gauss(0,1) for _ in range(cnt)]
        elif kind == 5: v = [(i % 5000)*0.25 - 100 for i in range(cnt)]
        else: v = [random.choice([1.0, 1.0000001, 2.0, -0.0, 0.0]) for _ in range(cnt)]
        v = [struct.unpack('<f', struct.pack('<f', x))[0] for x in v]
        keys = [key_of(x) for x in v]
        r = ref(keys, 2048); o = cmp(keys, 2048)
        print(cnt, kind, "OK" if r == o else "FAIL")
        bad += r != o
sys.exit(1 if bad else 0)
