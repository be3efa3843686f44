#!/usr/bin/env python3
"""Generates tests/fixtures/export/quant_ref.gguf: reference encodings by gguf-py's numpy quantizers
(gguf==0.19.0, gguf.quants.quantize) for the GGUF writer's tests.

Tensor `input` (f32, 8 rows of 64) holds the values; `q8_0`, `q4_0`, `f16`, `bf16` hold
gguf.quants.quantize(input, type) as raw bytes. The values include the edge cases of the
quantizers: an all-zero block, ties at .5 after scaling, blocks whose largest magnitude is negative
or appears twice with opposite signs, values beyond the f16 range for F16, tiny subnormals.

Run:  /opt/fixenv/bin/python tools/make_gguf_quant_fixtures.py   (any venv with gguf==0.19.0 + numpy)
"""
import os

import gguf
import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "export", "quant_ref.gguf")


def values():
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    x[0, :32] = 0.0                                   # all-zero block: d = 0
    x[1, :32] = np.arange(32, dtype=np.float32) - 15.5  # steps of 1 around 0, halves after scaling
    x[1, 32:] = np.linspace(-127, 127, 32, dtype=np.float32) / 3.0
    x[2, :32] *= 0.001
    x[2, 5] = -4.0                                    # negative largest magnitude (Q4_0 d > 0)
    x[2, 32:] = rng.standard_normal(32).astype(np.float32)
    x[2, 40], x[2, 41] = 3.0, -3.0                    # tie in |x|: the first one sets Q4_0's sign
    x[3, :] *= 1e4                                    # beyond f16 range in F16 (inf), fine in BF16
    x[4, :] *= 1e-6                                   # f16 subnormals
    x[5, 7] = 1e-30
    x[6, :] = np.round(x[6, :] * 8) / 8               # exact multiples: ties in Q8_0 rounding
    return x


def main():
    x = values()
    w = gguf.GGUFWriter(OUT, "export-quant-ref")
    w.add_tensor("input", x)
    T = gguf.GGMLQuantizationType
    for name, t in (("q8_0", T.Q8_0), ("q4_0", T.Q4_0), ("f16", T.F16), ("bf16", T.BF16)):
        with np.errstate(over="ignore"):
            q = gguf.quants.quantize(x, t)
        w.add_tensor(name, q, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", OUT)


if __name__ == "__main__":
    main()
