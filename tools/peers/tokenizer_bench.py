"""Peer of bench/tokenizer/bench_tokenizer.cpp: Hugging Face `tokenizers` encode throughput on the
same tokenizer and corpus, single thread, same JSON shape on stdout.

Times `Tokenizer.encode(line, add_special_tokens=False)` line by line (the main metric, what
bench_tokenizer measures) and, separately, `encode_batch(lines, add_special_tokens=False)` with
Rayon limited to one thread. Passes repeat until --min-seconds have passed; --rounds rounds, the
best one is reported. With --expect-hash/--expect-tokens (from bench_tokenizer's output) it exits 1
when the ids differ.

  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
  /opt/fixenv/bin/python tools/peers/tokenizer_bench.py --tokenizer DIR|FILE --corpus FILE
"""
import os

# Single thread: must be set before tokenizers (and its Rayon pool) is loaded.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["RAYON_RS_NUM_CPUS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import tokenizers  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

FNV_OFFSET, FNV_PRIME, MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def load_corpus(path):
    """A JSON array of strings, or text with one entry per line (empty lines skipped), exactly as
    bench_tokenizer reads it (split on '\\n' only, bytes kept)."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".json"):
        return json.loads(data.decode("utf-8"))
    return [line.decode("utf-8", errors="replace") for line in data.split(b"\n") if line]


def ids_hash(all_ids):
    h = FNV_OFFSET
    for ids in all_ids:
        for i in ids:
            h = ((h ^ i) * FNV_PRIME) & MASK
        h = ((h ^ 0xFFFFFFFF) * FNV_PRIME) & MASK
    return "%016x" % h


def timed(fn, min_seconds, rounds, before=None):
    """(passes, seconds) per round, each round repeating fn() until min_seconds of fn() time;
    before() (untimed) runs ahead of each pass."""
    out = []
    for _ in range(rounds):
        passes, el = 0, 0.0
        while True:
            if before:
                before()
            t0 = time.perf_counter()
            fn()
            el += time.perf_counter() - t0
            passes += 1
            if el >= min_seconds:
                break
        out.append((passes, el))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--min-seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="")
    ap.add_argument("--no-batch", action="store_true", help="skip the encode_batch metric")
    ap.add_argument("--expect-hash", default="")
    ap.add_argument("--expect-tokens", type=int, default=-1)
    a = ap.parse_args()

    path = a.tokenizer
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    t0 = time.perf_counter()
    tok = Tokenizer.from_file(path)
    load_s = time.perf_counter() - t0
    lines = load_corpus(a.corpus)
    nbytes = sum(len(s.encode("utf-8")) for s in lines)

    # Warm-up pass (fills the BPE cache) + ids hash and count.
    all_ids = [tok.encode(s, add_special_tokens=False).ids for s in lines]
    ntok = sum(len(x) for x in all_ids)
    h = ids_hash(all_ids)
    del all_ids

    enc = tok.encode

    def one_pass():
        for s in lines:
            enc(s, add_special_tokens=False)

    def rounds_json(rs):
        return [{"passes": p, "seconds": el, "bytes_per_second": p / el * nbytes,
                 "tokens_per_second": p / el * ntok} for p, el in rs]

    # warm: passes back to back (BPE cache kept); cold: cache emptied before each pass (untimed).
    rs = timed(one_pass, a.min_seconds, a.rounds)
    best = max(p / el for p, el in rs)
    rc = timed(one_pass, a.min_seconds, a.rounds, before=tok.model._clear_cache)
    best_cold = max(p / el for p, el in rc)
    res = {
        "name": a.name or f"{a.tokenizer} @ {a.corpus}",
        "impl": f"tokenizers {tokenizers.__version__} Tokenizer.encode",
        "peer": f"tokenizers {tokenizers.__version__}",
        "tokenizer": a.tokenizer,
        "corpus": a.corpus,
        "lines": len(lines),
        "bytes": nbytes,
        "tokens": ntok,
        "ids_hash": h,
        "load_seconds": load_s,
        "metric": "best of rounds",
        "bytes_per_second": best * nbytes,
        "tokens_per_second": best * ntok,
        "rounds": rounds_json(rs),
        "cold": {"bytes_per_second": best_cold * nbytes, "tokens_per_second": best_cold * ntok,
                 "rounds": rounds_json(rc)},
        "threads": os.environ["RAYON_NUM_THREADS"],
    }
    if not a.no_batch:
        batch_ids = tok.encode_batch(lines, add_special_tokens=False)
        assert sum(len(e.ids) for e in batch_ids) == ntok
        del batch_ids
        rb = timed(lambda: tok.encode_batch(lines, add_special_tokens=False), a.min_seconds, a.rounds)
        bb = max(p / el for p, el in rb)
        res["encode_batch"] = {"bytes_per_second": bb * nbytes, "tokens_per_second": bb * ntok,
                               "rounds": rounds_json(rb)}
    ok = True
    if a.expect_hash and a.expect_hash != h:
        ok = False
    if a.expect_tokens >= 0 and a.expect_tokens != ntok:
        ok = False
    res["ids_match"] = ok if (a.expect_hash or a.expect_tokens >= 0) else None
    print(json.dumps(res))
    if not ok:
        print(f"tokenizer_bench.py: ids differ from ours: tokens {ntok} vs {a.expect_tokens}, "
              f"hash {h} vs {a.expect_hash}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
