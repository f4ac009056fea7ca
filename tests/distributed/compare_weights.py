#!/usr/bin/python3
"""Compares safetensors files written by the trainer (numpy only, no safetensors package).

  compare_weights.py close A B REL     max over all tensors of |a - b| <= REL * max over all tensors of |a|
                                       (the issue's criterion; prints per-tensor figures too)
  compare_weights.py update A B INIT REL   every tensor: ||a - b||_2 <= REL * ||a - init||_2 (B strays
                                       from A by at most REL of the distance A travelled from INIT)
  compare_weights.py expect A NAME ATOL V1 V2 ...   tensor NAME (flattened) equals V1 V2 ... within ATOL
  compare_weights.py show A            prints every tensor's name, shape and first values

Format: 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the raw little-endian data.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def main(argv):
    mode = argv[1]
    if mode == "close":
        a, b, rel = load(argv[2]), load(argv[3]), float(argv[4])
        if sorted(a) != sorted(b):
            print(f"tensor names differ: {sorted(a)} vs {sorted(b)}")
            return 1
        worst_diff, scale = 0.0, 0.0
        for name in sorted(a):
            x, y = a[name].astype(np.float64), b[name].astype(np.float64)
            if x.shape != y.shape:
                print(f"{name}: shape {x.shape} vs {y.shape}")
                return 1
            diff, size = float(np.max(np.abs(x - y))), float(np.max(np.abs(x)))
            print(f"  {name}: max|diff| {diff:.3e}, max|w| {size:.3e}")
            worst_diff, scale = max(worst_diff, diff), max(scale, size)
        ratio = worst_diff / scale if scale > 0 else (0.0 if worst_diff == 0 else float("inf"))
        ok = ratio <= rel
        print(f"  max|diff| {worst_diff:.3e} / max|w| {scale:.3e} = {ratio:.3e} ({'ok' if ok else 'TOO FAR'}, limit {rel:g})")
        return 0 if ok else 1
    if mode == "update":
        a, b, init, rel = load(argv[2]), load(argv[3]), load(argv[4]), float(argv[5])
        ok, worst = True, 0.0
        for name in sorted(a):
            x, y, z = (t[name].astype(np.float64) for t in (a, b, init))
            travelled = float(np.linalg.norm(x - z))
            stray = float(np.linalg.norm(x - y))
            ratio = stray / travelled if travelled > 0 else (0.0 if stray == 0 else float("inf"))
            worst = max(worst, ratio)
            flag = "ok" if ratio <= rel else "TOO FAR"
            print(f"  {name}: ||a - b|| {stray:.3e}, ||a - init|| {travelled:.3e}, ratio {ratio:.3e} ({flag}, limit {rel:g})")
            ok &= ratio <= rel
        print(f"  worst ratio {worst:.3e}")
        return 0 if ok else 1
    if mode == "expect":
        a, name, atol = load(argv[2]), argv[3], float(argv[4])
        want = np.array([float(v) for v in argv[5:]])
        got = a[name].astype(np.float64).ravel()
        print(f"  {name} = {np.array2string(got, precision=6)}, expected {want} within {atol:g}")
        return 0 if got.shape == want.shape and np.all(np.abs(got - want) <= atol) else 1
    if mode == "show":
        for name, t in sorted(load(argv[2]).items()):
            print(f"  {name} {list(t.shape)} {t.ravel()[:6]}")
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
