#!/usr/bin/env python3
"""Generates tests/fixtures/quant/block_scale_layout.json: cuBLASLt's tiled layout of 1D block
scaling factors (MXFP8/MXFP4 per 32, NVFP4 per 16 along K), written here from NVIDIA's description
and not from the engine's C++, so the C++ tests check quant/block_scale_layout.h against an
independent implementation.

Sources:
  - cuBLAS documentation, "1D Block Scaling Factors Layout"
    (https://docs.nvidia.com/cuda/cublas/index.html#d-block-scaling-factors-layout): the scales of
    an (outer x inner-blocks) matrix are padded to multiples of 128 x 4 and stored tile by tile,
    the tiles of one 128-row band next to each other along K; a 128 x 4 tile is 512 bytes holding
    its rows as 4 groups of 32, element (row, block) of the tile at
    [row % 32][row / 32][block] of a [32][4][4] array.
  - nvmath-python's documentation of get_block_scale_offset, whose worked example (NVFP4 operand
    of 128 x 128: block (5, 2) at offset 82, block (5, 5) at offset 593) the script asserts.

The layout is expressed as array reshapes (pad, split into tiles, reorder the tile's rows), not as
an offset formula. Needs numpy only:  python3 tools/make_block_scale_fixtures.py
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "quant",
                   "block_scale_layout.json")


def tiled(scales):
    """Row-major (outer, k_blocks) uint8 scales -> the flat cuBLASLt layout (zero padding)."""
    outer, kb = scales.shape
    rows = -(-outer // 128) * 128
    cols = -(-kb // 4) * 4
    padded = np.zeros((rows, cols), dtype=np.uint8)
    padded[:outer, :kb] = scales
    # (row band, row in band, tile along K, block in tile) -> bands, then tiles along K.
    t = padded.reshape(rows // 128, 128, cols // 4, 4).transpose(0, 2, 1, 3)
    # Row in band = 32 * quarter + r32; the tile stores [r32][quarter][block].
    t = t.reshape(rows // 128, cols // 4, 4, 32, 4).transpose(0, 1, 3, 2, 4)
    return t.reshape(-1)


def offset_of(outer, kb, row, block):
    """Where (row, block) lands, found by tiling an array of distinct markers."""
    marks = np.zeros((outer, kb), dtype=np.int64)
    marks[row, block] = 1
    flat = tiled(marks.astype(np.uint8))
    return int(np.flatnonzero(flat)[0])


def main():
    # nvmath-python's worked example: NVFP4 A of 128 x 128 has 8 blocks of 16 per row.
    assert offset_of(128, 8, 5, 2) == 82
    assert offset_of(128, 8, 5, 5) == 593
    cases = []
    for outer, kb in [(128, 4), (128, 8), (130, 3), (200, 7), (256, 9), (5, 2), (384, 12)]:
        s = ((np.arange(outer * kb) % 251) + 1).astype(np.uint8).reshape(outer, kb)
        cases.append({"outer": outer, "k_blocks": kb, "tiled": tiled(s).tolist()})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"input": "scale[r][b] = 1 + (r * k_blocks + b) % 251", "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
