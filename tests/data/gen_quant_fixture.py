#!/usr/bin/env python3
"""Writes tests/data/quant_fixture.bin: random blocks of every ggml type gguf-py dequantizes,
with the float32 values gguf-py's quants module gives for them (an implementation we did not
write), for tests/test_quant.c to compare bit for bit.

Each type gets N random blocks (scales sanitized to finite halves) followed by blocks whose
scales are extreme: the largest and smallest normal and subnormal halves, zero, negative zero,
negative, and for MXFP4/NVFP4 the edge exponents (0, 1, 254, 255; 0x00, 0x7F, 0x7E, 0xFF).

Layout (little-endian): "G5QFIX1\\0", u32 n_cases, then per case u32 type, u32 n_blocks,
n_blocks * type_size bytes of blocks, n_blocks * block_size float32 values.
Run: python3 tests/data/gen_quant_fixture.py > tests/data/quant_fixture.bin  (pip install gguf)
"""
import struct
import sys

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

# Offsets of the fp16 fields of each block (ggml-common.h layouts).
HALVES = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0],
    T.IQ4_NL: [0], T.IQ4_XS: [0], T.TQ1_0: [52], T.TQ2_0: [64],
}
EXTREME_HALVES = [0x7BFF, 0xFBFF, 0x0400, 0x0001, 0x03FF, 0x0000, 0x8000, 0x3C00, 0xBC00]
EXTREME_E8M0 = [0, 1, 2, 127, 254, 255]
EXTREME_UE4M3 = [0x00, 0x01, 0x7F, 0x7E, 0xFF, 0x80, 0x08, 0x38]


def finite(h):
    return h & ~0x4000 if (h & 0x7C00) == 0x7C00 else h


def iq1m_get(b):
    w = [int(b[48 + 2 * k]) | int(b[49 + 2 * k]) << 8 for k in range(4)]
    return (w[0] >> 12) | ((w[1] >> 8) & 0xF0) | ((w[2] >> 4) & 0xF00) | (w[3] & 0xF000)


def iq1m_set(b, h):
    for k in range(4):
        w = (int(b[48 + 2 * k]) | int(b[49 + 2 * k]) << 8) & 0x0FFF
        w |= ((h >> (4 * k)) & 0xF) << 12
        b[48 + 2 * k], b[49 + 2 * k] = w & 0xFF, w >> 8


def put_half(b, off, h):
    b[off], b[off + 1] = h & 0xFF, h >> 8


def blocks_for(rng, t, n_rand):
    bs, ts = GGML_QUANT_SIZES[t]
    if t in (T.F16, T.BF16):
        n = 64
        raw = rng.integers(0, 256, size=(n, 2), dtype=np.uint8)
        for b in raw:  # finite values only, plus the extremes
            h = int(b[0]) | int(b[1]) << 8
            h = finite(h) if t == T.F16 else (h & ~0x4000 if (h & 0x7F80) == 0x7F80 else h)
            put_half(b, 0, h)
        ext = [0x7BFF, 0x0001, 0x8000, 0x0400] if t == T.F16 else [0x7F7F, 0x0001, 0x8000, 0x0080]
        for i, h in enumerate(ext):
            put_half(raw[i], 0, h)
        return raw
    raw = rng.integers(0, 256, size=(n_rand, ts), dtype=np.uint8)
    if t == T.MXFP4:
        n_ext = len(EXTREME_E8M0)
    elif t == T.NVFP4:
        n_ext = len(EXTREME_UE4M3)
    else:
        n_ext = len(EXTREME_HALVES)
    ext = rng.integers(0, 256, size=(n_ext, ts), dtype=np.uint8)
    out = np.concatenate([raw, ext])
    for i, b in enumerate(out):
        k = i - n_rand  # >= 0: an extreme block
        if t == T.IQ1_M:
            iq1m_set(b, EXTREME_HALVES[k] if k >= 0 else finite(iq1m_get(b)))
        elif t == T.MXFP4:
            if k >= 0:
                b[0] = EXTREME_E8M0[k]
        elif t == T.NVFP4:
            if k >= 0:
                b[:4] = EXTREME_UE4M3[k]
        else:
            for j, off in enumerate(HALVES[t]):
                h = int(b[off]) | int(b[off + 1]) << 8
                put_half(b, off, EXTREME_HALVES[(k + j) % len(EXTREME_HALVES)] if k >= 0 else finite(h))
    return out


def main():
    rng = np.random.default_rng(20261201)
    types = [T.F16] + sorted(quants._type_traits, key=lambda t: t.value)
    cases = []
    for t in types:
        bs, ts = GGML_QUANT_SIZES[t]
        n_rand = 6 if bs >= 256 else (8 if bs == 64 else 24)
        blocks = blocks_for(rng, t, n_rand)
        with np.errstate(all="ignore"):
            vals = quants.dequantize(blocks.reshape(-1), t) if t != T.F16 else \
                blocks.reshape(-1).view(np.float16).astype(np.float32)
        vals = np.asarray(vals, dtype=np.float32).reshape(-1)
        assert vals.size == blocks.shape[0] * bs, t.name
        cases.append((int(t.value), blocks.shape[0], blocks.tobytes(), vals.astype("<f4").tobytes()))
    out = sys.stdout.buffer
    out.write(b"G5QFIX1\0" + struct.pack("<I", len(cases)))
    for tid, n, raw, vals in cases:
        out.write(struct.pack("<II", tid, n) + raw + vals)


if __name__ == "__main__":
    main()
