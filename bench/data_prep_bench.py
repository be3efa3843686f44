#!/usr/bin/env python3
"""Data preparation at scale: `qlora data` against the Hugging Face pipeline, first and cached runs.

For each size (default 100k and 1M rows) a multi-turn chat set is generated (1-4 turns, a system
prompt in 30% of rows, words drawn with a fixed seed) and prepared for training with
SmolLM2-135M-Instruct's tokenizer and chat template (.cache/qlora/SmolLM2-135M-Instruct-f32, made by
tools/peers/trl_dpo_bench.py --export-hf), max_length 2048, packing on:

  ours  `qlora data CONFIG --json`: read, template, tokenize, mask on the machine's threads, stream
        into the prepared-data cache (a fresh dataset_prepared_path), pack; the cached run maps it.
  peer  tools/peers/hf_data_prep.py: datasets.load_dataset("json") + Dataset.map(num_proc=2) with
        apply_chat_template + TRL's pack_dataset, through a fresh `datasets` cache folder; the
        cached run reuses its Arrow files. Imports are included, as a user waits for them.

Each run is its own process; wall time is measured around it and the peak RSS is the largest sum of
the RSS of the process and all its children, sampled every 20 ms (the peer runs num_proc workers).
Both sides must count the same tokens (the check that they prepared the same conversations).

  python3 bench/data_prep_bench.py [--rows 100000 1000000] [--out bench/results/data_prep.json]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from cpu_train_bench import cpu_model, git_sha  # noqa: E402

WORDS = ("harbor river quick lazy fox dog alpha beta gamma delta coast eager define meaning word the a of to "
         "in is was for on with as by at from this that it be are or an not but have has which their more "
         "cafe naive tokyo zebra über über-fast 42 3.14 (parens) don't can't").split()


def make_chat_set(path, n):
    rng = random.Random(1)
    with open(path, "w") as f:
        for _ in range(n):
            msgs = []
            if rng.random() < 0.3:
                msgs.append({"role": "system", "content": " ".join(rng.choices(WORDS, k=8))})
            for _ in range(rng.randint(1, 4)):
                msgs.append({"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randint(5, 40)))})
                msgs.append({"role": "assistant", "content": " ".join(rng.choices(WORDS, k=rng.randint(10, 80)))})
            f.write(json.dumps({"messages": msgs}) + "\n")


def tree_rss(pid):
    """RSS bytes of pid and all its descendants, from /proc (0 for a process that is gone)."""
    total, todo, page = 0, [pid], os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass
    return total


def run_measured(cmd, env, log_path):
    """Runs cmd; returns (stdout, wall seconds, peak RSS bytes summed over its process tree)."""
    t0 = time.perf_counter()
    with open(log_path, "w") as err:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        peak = [0]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], tree_rss(p.pid))
                time.sleep(0.02)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        out, _ = p.communicate()
        done.set()
        th.join()
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"data_prep_bench: {' '.join(cmd)} failed ({p.returncode}); see {log_path}")
    return out, wall, peak[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[100000, 1000000])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/data_prep.json"))
    ap.add_argument("--work", default="/tmp/qlora_data_prep_bench")
    ap.add_argument("--qlora", default=os.path.join(ROOT, "build/qlora"))
    ap.add_argument("--python", default=os.environ.get("QLORA_PEER_PYTHON", "/opt/fixenv/bin/python"))
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, ".cache/qlora/SmolLM2-135M-Instruct-f32"))
    a = ap.parse_args()
    if not os.access(a.qlora, os.X_OK):
        sys.exit(f"data_prep_bench: {a.qlora} not built (make build)")
    if not os.path.isfile(os.path.join(a.tokenizer, "tokenizer.json")):
        sys.exit(f"data_prep_bench: {a.tokenizer} missing (tools/peers/trl_dpo_bench.py --export-hf makes it)")
    os.makedirs(a.work, exist_ok=True)
    threads = os.cpu_count()
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1")
    cases = []
    for n in a.rows:
        data = os.path.join(a.work, f"chat_{n}.jsonl")
        if not os.path.exists(data):
            print(f"data_prep_bench: generating {n} rows", file=sys.stderr)
            make_chat_set(data, n)
        ours_cache, peer_cache = os.path.join(a.work, f"qlora_cache_{n}"), os.path.join(a.work, f"hf_cache_{n}")
        shutil.rmtree(ours_cache, ignore_errors=True)
        shutil.rmtree(peer_cache, ignore_errors=True)
        cfg = os.path.join(a.work, f"data_{n}.yaml")
        with open(cfg, "w") as f:
            f.write(f"model_name_or_path: {a.tokenizer}\ntrain_file: {data}\nmax_length: 2048\npacking: true\n"
                    f"dataset_prepared_path: {ours_cache}\n")
        ours_cmd = [a.qlora, "data", cfg, "--json"]
        peer_cmd = [a.python, os.path.join(ROOT, "tools/peers/hf_data_prep.py"), "--data", data, "--tokenizer",
                    a.tokenizer, "--cache-dir", peer_cache, "--num-proc", "2", "--max-length", "2048"]
        for run in ("first", "cached"):
            print(f"data_prep_bench: {n} rows, {run} run: qlora", file=sys.stderr)
            out, wall, rss = run_measured(ours_cmd, env, os.path.join(a.work, f"ours_{n}_{run}.log"))
            o = json.loads(out)
            assert o["cache"]["reused"] == (run == "cached"), o["cache"]
            print(f"data_prep_bench: {n} rows, {run} run: Hugging Face", file=sys.stderr)
            pout, pwall, prss = run_measured(peer_cmd, env, os.path.join(a.work, f"peer_{n}_{run}.log"))
            p = json.loads(pout.strip().splitlines()[-1])
            if p["tokens"] != o["tokens"]:
                sys.exit(f"data_prep_bench: token counts differ (qlora {o['tokens']}, peer {p['tokens']})")
            ours = {"command": " ".join(ours_cmd), "wall_seconds": wall, "peak_rss_bytes": rss,
                    "tokens_per_second": o["tokens"] / wall, "threads": o["threads"],
                    "prepare_seconds": o["prepare_seconds"], "pack_seconds": o["pack_seconds"],
                    "cache_write_seconds": o["cache"]["write_seconds"], "cache_load_seconds": o["cache"]["load_seconds"],
                    "cache_bytes": o["cache"]["bytes"], "packed_rows": o["packing"]["rows"]}
            peer = {"command": " ".join(peer_cmd), "wall_seconds": pwall, "peak_rss_bytes": prss,
                    "tokens_per_second": p["tokens"] / pwall, "stages": {k: p[k] for k in p if k.endswith("_seconds")},
                    "packed_rows": p["packed_rows"], "num_proc": p["num_proc"], "versions": p["versions"]}
            cases.append({"rows": n, "run": run, "tokens": o["tokens"], "ours": ours, "peer": peer,
                          "speedup": pwall / wall, "rss_ratio_peer_over_ours": prss / rss})
            c = cases[-1]
            print(f"  {n} rows {run}: qlora {wall:.2f} s ({rss / 2**20:.0f} MiB), peer {pwall:.2f} s "
                  f"({prss / 2**20:.0f} MiB): {c['speedup']:.2f}x", file=sys.stderr)
        shutil.rmtree(ours_cache, ignore_errors=True)
        shutil.rmtree(peer_cache, ignore_errors=True)
    result = {"command": "python3 bench/data_prep_bench.py --rows " + " ".join(map(str, a.rows)), "git_sha": git_sha(),
              "cpu": cpu_model(), "threads": threads, "tokenizer": "SmolLM2-135M-Instruct (tokenizer.json + chat template)",
              "max_length": 2048, "packing": True, "cases": cases}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print("| rows | run | qlora | peer | speed-up | qlora peak RSS | peer peak RSS |\n|---|---|---|---|---|---|---|")
    for c in cases:
        print(f"| {c['rows']:,} | {c['run']} | {c['ours']['wall_seconds']:.2f} s | {c['peer']['wall_seconds']:.2f} s | "
              f"{c['speedup']:.1f}x | {c['ours']['peak_rss_bytes'] / 2**20:.0f} MiB | {c['peer']['peak_rss_bytes'] / 2**20:.0f} MiB |")


if __name__ == "__main__":
    main()
