#!/usr/bin/env python3
"""Generates the quant/ test fixtures: bitsandbytes NF4/FP4 (+ double quant) on CPU and ml_dtypes minifloats.

Run with the fixture venv:  /opt/fixenv/bin/python tools/make_quant_fixtures.py
Needs: torch, bitsandbytes (its CPU path, no GPU), ml_dtypes, safetensors, numpy.

Writes tests/fixtures/quant/{bnb4.safetensors, minifloat.safetensors}. Both are plain
safetensors files (8-byte little-endian header length, JSON header, raw little-endian data);
the C++ tests read them with a few lines of their own code, so they never need Python.
"""
import json
import os
import sys

import numpy as np
import ml_dtypes as md
import torch
import bitsandbytes as bnb
import bitsandbytes.functional as F
from safetensors.numpy import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "quant")


def weights(rows, cols, seed):
    """N(0,1) weights with a few large outliers, as float32."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    n = w.size
    idx = rng.choice(n, size=max(1, n // 500), replace=False)
    w.reshape(-1)[idx] *= np.float32(12.0)
    return w


def ties_input():
    """Each row is one 64-block whose absmax is exactly 1.0, so x * (1/absmax) == x and the
    listed values land exactly on the NF4 / FP4 decision thresholds (ties go to the lower code)."""
    nf4 = F.get_4bit_type("nf4", device="cpu").numpy()
    nf4_mid = ((nf4[:-1] + nf4[1:]) / np.float32(2)).astype(np.float32)
    fp4 = F.get_4bit_type("fp4", device="cpu").numpy()
    s = np.sort(fp4)
    fp4_mid = ((s[:-1] + s[1:]) / np.float32(2)).astype(np.float32)
    rng = np.random.default_rng(7)
    r0 = np.concatenate([[1.0], nf4_mid, -nf4_mid[::-1], rng.uniform(-1, 1, 64)]).astype(np.float32)[:64]
    tiny = np.array([1e-3, -1e-3, 2.6e-3, -2.6e-3, 0.0, -0.0, 1e-30, -1e-30], np.float32)
    r1 = np.concatenate([[-1.0], fp4_mid, tiny, rng.uniform(-1, 1, 64)]).astype(np.float32)[:64]
    return np.stack([r0, r1])


def zeros_input():
    """150 elements, blocksize 64: block 0 random, block 1 all zero (full), block 2 (22, tail) zero."""
    x = np.zeros(150, np.float32)
    x[:64] = np.random.default_rng(11).standard_normal(64).astype(np.float32)
    return x.reshape(3, 50)


def bnb_fixtures():
    t = {}
    cases = []
    shapes = {
        "7x33": weights(7, 33, 1),
        "64x100": weights(64, 100, 2),
        "3x1000": weights(3, 1000, 3),
        "24x520": weights(24, 520, 4),
        "ties2x64": ties_input(),
        "zeros3x50": zeros_input(),
    }
    for k, v in shapes.items():
        t[f"input.{k}"] = v

    def plan():
        for qt in ("nf4", "fp4"):
            for bs in (32, 64, 128, 256, 4096):
                for dq in (0, 1):
                    yield "7x33", qt, bs, dq, True
                    yield "3x1000", qt, bs, dq, bs in (64, 4096)
            for bs in (64, 128):
                for dq in (0, 1):
                    yield "64x100", qt, bs, dq, bs == 64 and dq == 1
            for bs in (32, 64):
                yield "24x520", qt, bs, 1, bs == 32 and qt == "nf4"
            yield "ties2x64", qt, 64, 0, True
            for dq in (0, 1):
                yield "zeros3x50", qt, 64, dq, True

    for shape, qt, bs, dq, keep_dq in plan():
        w = torch.from_numpy(shapes[shape].copy())
        name = f"{qt}.bs{bs}.dq{dq}.{shape}"
        # Raw per-block absmax (before double quant) from the same call path without compression.
        _, st_raw = F.quantize_4bit(w, blocksize=bs, quant_type=qt, compress_statistics=False)
        q, st = F.quantize_4bit(w, blocksize=bs, quant_type=qt, compress_statistics=bool(dq))
        assert q.dtype == torch.uint8 and q.shape[1] == 1
        t[f"{name}.packed"] = q.reshape(-1).numpy().copy()
        raw = st_raw.absmax.numpy().astype(np.float32).copy()
        t[f"{name}.absmax_raw"] = raw
        case = {"name": name, "quant_type": qt, "blocksize": bs, "double_quant": dq,
                "shape": list(shapes[shape].shape), "input": f"input.{shape}", "has_dequant": keep_dq}
        if dq:
            t[f"{name}.qabsmax"] = st.absmax.numpy().copy()
            t[f"{name}.nested_absmax"] = st.state2.absmax.numpy().astype(np.float32).copy()
            off = np.float32(st.offset.item())
            t[f"{name}.offset"] = np.array([off], np.float32)
            absmax_dq = (F.dequantize_blockwise(st.absmax, st.state2) + st.offset).numpy()
            t[f"{name}.absmax_dq"] = absmax_dq.astype(np.float32).copy()
            if "nested_code" not in t:
                t["nested_code"] = st.state2.code.numpy().astype(np.float32).copy()
        if keep_dq:
            t[f"{name}.dequant"] = F.dequantize_4bit(q, st).reshape(-1).numpy().astype(np.float32).copy()
        cases.append(case)

    t["nf4_code"] = F.get_4bit_type("nf4", device="cpu").numpy().astype(np.float32)
    t["fp4_code"] = F.get_4bit_type("fp4", device="cpu").numpy().astype(np.float32)
    meta = {"generator": "tools/make_quant_fixtures.py", "bitsandbytes": bnb.__version__,
            "torch": torch.__version__, "cases": json.dumps(cases)}
    return t, meta, cases


def minifloat_fixtures():
    types = {"e4m3": md.float8_e4m3fn, "e5m2": md.float8_e5m2, "e2m1": md.float4_e2m1fn,
             "e8m0": md.float8_e8m0fnu}
    t = {}
    # Decode tables: every code -> f32 bits.
    for k, ty in types.items():
        n = 16 if k == "e2m1" else 256
        codes = np.arange(n, dtype=np.uint8)
        t[f"decode.{k}"] = codes.view(ty).astype(np.float32).view(np.uint32)

    # Encode inputs: random magnitudes across the ranges of all types, exact ties between adjacent
    # representable values, subnormals (of f32 and of the targets), overflow, inf, NaN, signed zeros.
    rng = np.random.default_rng(5)
    parts = [
        rng.standard_normal(1500) * 10.0 ** rng.uniform(-12, 6, 1500),
        rng.uniform(-8, 8, 1000),
        rng.uniform(-600, 600, 500),
        rng.uniform(-70000, 70000, 500),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-40, -1e-40, 1e-45, 3e38, -3e38,
                  448, 464, 464.0001, 479.9, 480, 57344, 61439, 61440, 6, 7, 5, 2 ** -127, 2 ** -126]),
        # raw f32 bit patterns: random (incl. NaN payloads, inf, huge) and f32 subnormals
        rng.integers(0, 2 ** 32, 1000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        rng.integers(1, 2 ** 23, 200, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ]
    for k, ty in types.items():
        vals = t[f"decode.{k}"].view(np.float32)
        v = np.unique(vals[np.isfinite(vals)].astype(np.float64))
        mids = (v[:-1] + v[1:]) / 2  # exact ties (representable in f32 for these narrow types)
        parts += [mids, np.nextafter(mids.astype(np.float32), np.float32(np.inf)).astype(np.float64),
                  np.nextafter(mids.astype(np.float32), np.float32(-np.inf)).astype(np.float64), v, -v]
    with np.errstate(all="ignore"):
        # The ties above are exact in f32 (narrow types' midpoints need few bits).
        xs = np.concatenate([np.asarray(part).astype(np.float32) for part in parts])
        t["encode.input"] = xs
        for k, ty in types.items():
            t[f"encode.{k}"] = xs.astype(ty).view(np.uint8).copy()
    meta = {"generator": "tools/make_quant_fixtures.py", "ml_dtypes": md.__version__}
    return t, meta


def main():
    os.makedirs(OUT, exist_ok=True)
    t, meta, cases = bnb_fixtures()
    save_file(t, os.path.join(OUT, "bnb4.safetensors"), metadata=meta)
    print(f"bnb4: {len(cases)} cases")
    t2, meta2 = minifloat_fixtures()
    save_file(t2, os.path.join(OUT, "minifloat.safetensors"), metadata=meta2)
    for f in ("bnb4.safetensors", "minifloat.safetensors"):
        print(f, os.path.getsize(os.path.join(OUT, f)), "bytes")


if __name__ == "__main__":
    sys.exit(main())
