#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora under fuzz/seeds/<target>/ from the test fixtures.

Seeds are kept small (a few KB each) so that libFuzzer spends its executions on mutations rather
than on parsing large files: big fixtures are cut down (a GGUF with the tiny model's metadata and
two small tensors, tokenizers with their first 300 ids, one quantized weight of the bnb model).
Standard library only. Run from anywhere: python3 tools/make_fuzz_seeds.py
"""
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(ROOT, "fuzz", "seeds")


def target_dir(name):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def copy(src, dst_dir, name=None):
    shutil.copy(os.path.join(FIX, src), os.path.join(dst_dir, name or os.path.basename(src)))


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    return header, data[8 + n:]


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def safetensors_seeds():
    d = target_dir("safetensors")
    copy("io/py_single.safetensors", d)
    for name in sorted(os.listdir(os.path.join(FIX, "io", "sharded"))):
        if name.endswith(".safetensors"):
            copy(os.path.join("io", "sharded", name), d)
    write_safetensors(os.path.join(d, "dtypes.safetensors"), [
        ("f32", "F32", [2, 2], struct.pack("<4f", 1, -2, 3.5, 0)),
        ("bf16", "BF16", [3], bytes([0x80, 0x3f, 0x00, 0xc0, 0x49, 0x40])),
        ("f16", "F16", [1, 2], struct.pack("<2e", 0.5, -1)),
        ("scalar", "F32", [], struct.pack("<f", 7)),
        ("u8", "U8", [4], bytes([1, 2, 3, 4])),
        ("empty", "F32", [0, 3], b""),
    ], {"format": "pt"})


def bnb_seeds():
    d = target_dir("bnb")
    header, data = read_safetensors(os.path.join(FIX, "qlora", "llama_gqa_bnb_nf4", "model.safetensors"))
    prefix = "model.layers.0.self_attn.q_proj.weight"
    keep = []
    for name, info in header.items():
        if name.startswith(prefix):
            a, b = info["data_offsets"]
            keep.append((name, info["dtype"], info["shape"], data[a:b]))
    write_safetensors(os.path.join(d, "q_proj_nf4_double_quant.safetensors"), sorted(keep))


def gguf_seeds():
    d = target_dir("gguf")
    for name in ("meta.gguf", "bad/valid.gguf", "bad/misaligned_offset.gguf", "bad/offset_out_of_range.gguf",
                 "spm_vocab.gguf"):
        copy(os.path.join("gguf", name), d, name.replace("/", "_"))
    # The tiny Llama's metadata (architecture, sizes, gpt2 tokenizer) with two small tensors.
    raw = open(os.path.join(FIX, "gguf", "tiny_llama.gguf"), "rb").read()
    _, _, n_tensors, n_kv = struct.unpack_from("<4sIQQ", raw, 0)
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_value(t, o):
        if t == 8:
            return o + 8 + struct.unpack_from("<Q", raw, o)[0]
        if t == 9:
            et, n = struct.unpack_from("<IQ", raw, o)
            o += 12
            for _ in range(n):
                o = skip_value(et, o)
            return o
        return o + sizes[t]

    o = 24
    for _ in range(n_kv):
        o += 8 + struct.unpack_from("<Q", raw, o)[0]
        (t,) = struct.unpack_from("<I", raw, o)
        o = skip_value(t, o + 4)
    kv = raw[24:o]

    def name(s):
        return struct.pack("<Q", len(s)) + s.encode()

    norm = struct.pack("<64f", *[1.0 + i / 64 for i in range(64)])
    # Q8_0 blocks: f16 scale then 32 int8 values; 64x64 -> 128 blocks of 34 bytes.
    q8 = b"".join(struct.pack("<e", 0.01) + bytes((i * 7 + j) % 256 for j in range(32)) for i in range(128))
    infos = name("output_norm.weight") + struct.pack("<I", 1) + struct.pack("<Q", 64) + struct.pack("<IQ", 0, 0)
    q8_off = 256
    infos += name("blk.0.attn_q.weight") + struct.pack("<I", 2) + struct.pack("<QQ", 64, 64) + struct.pack("<IQ", 8, q8_off)
    head = b"GGUF" + struct.pack("<IQQ", 3, 2, n_kv) + kv + infos
    head += b"\0" * (-len(head) % 32)
    body = norm + b"\0" * (q8_off - len(norm)) + q8
    open(os.path.join(d, "tiny_llama_small.gguf"), "wb").write(head + body)


def tokenizer_seeds():
    d = target_dir("tokenizer")
    tok_dir = os.path.join(FIX, "text", "tok")
    for name in sorted(os.listdir(tok_dir)):
        p = os.path.join(tok_dir, name, "tokenizer.json")
        if not os.path.exists(p) or name == "smollm2":
            continue
        t = json.load(open(p, encoding="utf-8"))
        model = t.get("model", {})
        if isinstance(model.get("vocab"), dict):
            vocab = {k: v for k, v in model["vocab"].items() if v < 300}
            model["vocab"] = vocab
            merges = []
            for m in model.get("merges", []):
                a, b = m.split(" ", 1) if isinstance(m, str) else m
                if a in vocab and b in vocab and a + b in vocab:
                    merges.append(m)
            model["merges"] = merges
        t["added_tokens"] = [a for a in t.get("added_tokens", []) if a.get("id", 0) < 300]
        with open(os.path.join(d, name + ".json"), "w", encoding="utf-8") as f:
            json.dump(t, f, ensure_ascii=False, separators=(",", ":"))


def jinja_seeds():
    d = target_dir("jinja")
    src = os.path.join(FIX, "text", "chat_templates")
    for name in sorted(os.listdir(src)):
        if name.endswith(".jinja"):
            copy(os.path.join("text", "chat_templates", name), d)


def dataset_seeds():
    d = target_dir("dataset")
    src = os.path.join(FIX, "text", "datasets")
    for name in sorted(os.listdir(src)):
        if not name.endswith(".jsonl"):
            continue
        lines = open(os.path.join(src, name), "rb").read().splitlines(keepends=True)[:4]
        # First byte: the options (0 = auto format, truncate_right, no skipping); then the file.
        open(os.path.join(d, name), "wb").write(bytes([0x10]) + b"".join(lines))


def config_seeds():
    d = target_dir("config")
    for p in ("examples/tiny.yaml", "examples/smollm2/demo.yaml"):
        shutil.copy(os.path.join(ROOT, p), os.path.join(d, p.replace("/", "_")))


def hf_config_seeds():
    d = target_dir("hf_config")
    for name in sorted(os.listdir(os.path.join(FIX, "io", "hf_configs"))):
        if name != "n_params.json":
            copy(os.path.join("io", "hf_configs", name), d)
    copy("qlora/llama_gqa_bnb_nf4/config.json", d, "bnb_nf4.json")


if __name__ == "__main__":
    for f in (safetensors_seeds, bnb_seeds, gguf_seeds, tokenizer_seeds, jinja_seeds, dataset_seeds,
              config_seeds, hf_config_seeds):
        f()
    for name in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, name))
        size = sum(os.path.getsize(os.path.join(OUT, name, f)) for f in files)
        print(f"{name}: {len(files)} seeds, {size} bytes")
