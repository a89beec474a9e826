#!/usr/bin/env python3
"""Compares every tensor of GGUF files, dequantized by `glm5-shard inspect FILE --dump`, with
gguf-py's dequantization, bit for bit. A developer check (needs `pip install gguf numpy`), not
part of `make test`: tests/test_quant.c checks the same against the committed fixture.

usage: scripts/check_gguf_py.py [--bin build/bin/glm5-shard] FILE.gguf ...
Prints per file and type: tensors, values, mismatches; exits 1 on any mismatch."""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import quants


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin/glm5-shard")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    bad_total = 0
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "t.f32")
        for f in a.files:
            r = gguf.GGUFReader(f)
            per = {}
            for t in r.tensors:
                subprocess.run([a.bin, "inspect", f, "--dump", t.name, "-o", out], check=True,
                               stdout=subprocess.DEVNULL)
                ours = np.fromfile(out, dtype="<u4")
                ref = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
                ref = ref.reshape(-1).view(np.uint32)
                bad = int(np.count_nonzero(ours != ref)) if ours.size == ref.size else max(ours.size, ref.size)
                s = per.setdefault(t.tensor_type.name, [0, 0, 0])
                s[0] += 1
                s[1] += ref.size
                s[2] += bad
            for name, (n, v, b) in sorted(per.items()):
                print(f"{os.path.basename(f)}: {name}: {n} tensors, {v} values, {b} differ")
                bad_total += b
    print("all bit-identical" if bad_total == 0 else f"{bad_total} values differ")
    return 1 if bad_total else 0


if __name__ == "__main__":
    sys.exit(main())
