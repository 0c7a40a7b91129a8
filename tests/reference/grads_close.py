#!/usr/bin/python3
"""grads_close.py A B TOL — two safetensors files of the same tensors (gradients dumped with
--dump-grads and converted with `pipelm convert --to hf`): every tensor of A within TOL of the
largest magnitude of the same tensor of B (max |a - b| <= TOL max |b|). Plain Python (struct,
json, array): no numpy. Prints the worst tensor; exit 0 if every one is close, 1 otherwise.
"""
import array
import json
import struct
import sys


def tensors(path):
    """name -> array of floats (F32 only)."""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {t['dtype']}, not F32")
        lo, hi = t["data_offsets"]
        a = array.array("f")
        a.frombytes(b[8 + n + lo:8 + n + hi])
        if sys.byteorder != "little":
            a.byteswap()
        out[name] = a
    return out


def main():
    a, b, tol = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[3])
    if set(a) != set(b):
        print(f"different tensors: {sorted(set(a) ^ set(b))[:5]}")
        return 1
    worst, wname, bad = 0.0, "", 0
    for name in sorted(a):
        x, y = a[name], b[name]
        if len(x) != len(y):
            print(f"{name}: {len(x)} against {len(y)} floats")
            return 1
        big = max((abs(v) for v in y), default=0.0)
        diff = max((abs(p - q) for p, q in zip(x, y)), default=0.0)
        rel = diff / big if big > 0 else (0.0 if diff == 0 else float("inf"))
        if rel > worst:
            worst, wname = rel, name
        bad += rel > tol
    print(f"{len(a)} tensors, worst {wname} at {worst:.3g} of its max (tolerance {tol:g})")
    return 1 if bad else 0


sys.exit(main())
