#!/usr/bin/env python3
"""The Hugging Face data pipeline a TRL user runs, as the peer of `qlora data` (bench/data_prep_bench.py).

datasets.load_dataset("json") -> Dataset.map(num_proc=N) with the tokenizer's apply_chat_template
-> TRL's pack_dataset (best-fit decreasing, seq_length = max_length). Every stage goes through the
`datasets` cache under --cache-dir, so a second run with the same inputs reuses the Arrow files
instead of tokenizing again (that is the peer's "cached run").

Prints one JSON object: rows, tokens (the sum of the templated conversations' lengths), packed_rows,
and the seconds of each stage (imports, load, map, pack) and in all.

  python tools/peers/hf_data_prep.py --data chat.jsonl --tokenizer DIR --cache-dir DIR [--num-proc 2] [--max-length 2048]
"""
import argparse
import json
import time

T0 = time.perf_counter()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json and the chat template")
    ap.add_argument("--cache-dir", required=True)
    ap.add_argument("--num-proc", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=2048)
    a = ap.parse_args()

    import datasets
    import pyarrow.compute as pc
    from transformers import AutoTokenizer
    from trl import pack_dataset

    t_import = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=a.data, split="train", cache_dir=a.cache_dir)
    t_load = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(a.tokenizer)

    def template(batch):
        return {"input_ids": [tok.apply_chat_template(m, tokenize=True)["input_ids"] for m in batch["messages"]]}

    ids = ds.map(template, batched=True, num_proc=a.num_proc, remove_columns=ds.column_names, desc="template")
    t_map = time.perf_counter()
    packed = pack_dataset(ids, seq_length=a.max_length, strategy="bfd", map_kwargs={"num_proc": a.num_proc})
    t_pack = time.perf_counter()
    tokens = pc.sum(pc.list_value_length(ids.data.column("input_ids"))).as_py()
    print(json.dumps({"rows": len(ds), "tokens": tokens, "packed_rows": len(packed), "num_proc": a.num_proc,
                      "import_seconds": t_import - T0, "load_seconds": t_load - t_import,
                      "map_seconds": t_map - t_load, "pack_seconds": t_pack - t_map,
                      "seconds": time.perf_counter() - T0,
                      "versions": {"datasets": datasets.__version__, "transformers": __import__("transformers").__version__,
                                   "trl": __import__("trl").__version__}}))


if __name__ == "__main__":
    main()
