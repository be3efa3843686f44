#!/usr/bin/env python3
"""CPU training throughput on small mixture-of-experts models: `qlora bench` against transformers +
peft (tools/peers/hf_moe_bench.py) on the same machine, the same shapes and thread count.

    bench/cpu_moe_bench.py [--qlora build/qlora] [--python /opt/fixenv/bin/python] [--threads N]
                           [--out bench/results/cpu_moe_<host>.json] [--quick]

Models: bench/moe_configs/ (config.json only; both sides draw random weights and tokens):
  qwen3_moe_small: Qwen3-MoE layout, 8 layers, hidden 512, 32 experts of 384, 4 per token;
  mixtral_small: Mixtral layout, 8 layers, hidden 512, 8 experts of 1536, 2 per token;
  gpt_oss_small: gpt-oss layout, 8 layers, hidden 512, 32 experts of 512, 4 per token (sinks,
    biases, clamped SwiGLU, windows of 128 on alternate layers; fp32 experts on both sides).
Both: fp32 base, LoRA r=16 alpha 32 on q/k/v/o, and with --expert-lora on the stacked experts too
(PEFT's target_parameters mlp.experts.gate_up_proj and down_proj, one pair per expert), AdamW,
clipping at 1.0, no checkpointing, T=512 x micro-batch 2. The peer uses transformers' default
experts implementation (the JSON names it: grouped_mm where torch has it).

Each side runs --repeat times per case (default 2) and the fastest run is reported (the same rule
for both; every run's tokens/s is kept). Writes one JSON (machine, commit, commands, both sides'
outputs, ratios) and prints a markdown table. Speed numbers come from these files only.
"""
import argparse
import datetime
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_train_bench import cpu_model, git_sha, run_json  # noqa: E402  (as the SFT bench runs and records them)

CASES = ["qwen3_moe_small", "mixtral_small", "gpt_oss_small"]
TARGETS = "q_proj,k_proj,v_proj,o_proj"
EXPERT_PARAMETERS = "mlp.experts.gate_up_proj,mlp.experts.down_proj"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qlora", default="build/qlora")
    ap.add_argument("--python", default="/opt/fixenv/bin/python", help="interpreter with torch, transformers, peft")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed steps, each side")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="first case, 1 timed step, one run (a smoke run)")
    ap.add_argument("--expert-lora", action="store_true", help="LoRA on the experts too (target_parameters)")
    ap.add_argument("--cases", default="", help="comma-separated subset of " + ",".join(CASES))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c] or CASES
    if any(c not in CASES for c in cases):
        raise SystemExit(f"--cases: expected some of {', '.join(CASES)}")
    cases = cases[:1] if a.quick else cases
    steps, repeat = (1, 1) if a.quick else (a.steps, max(1, a.repeat))
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))

    def best_of(cmd):
        runs = [run_json(cmd, env) for _ in range(repeat)]
        best = max(runs, key=lambda r: r["tokens_per_second"])
        best["all_runs_tokens_per_second"] = [r["tokens_per_second"] for r in runs]
        return best

    out = {"tool": "bench/cpu_moe_bench.py", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "git_sha": git_sha(), "device": f"CPU: {cpu_model()}, {a.threads} threads",
           "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": a.threads, "platform": platform.platform()},
           "command": " ".join(sys.argv), "cases": []}
    for name in cases:
        cfg = f"bench/moe_configs/{name}"
        shape = ["--seq-len", str(a.seq_len), "--micro-batch", str(a.micro_batch)]
        ours_cmd = [a.qlora, "bench", "--model", cfg, *shape, "--base-precision", "fp32", "--target-modules", TARGETS,
                    "--device", "cpu", "--threads", str(a.threads), "--steps", str(steps), "--warmup-steps", "1", "--json"]
        peer_cmd = [a.python, "tools/peers/hf_moe_bench.py", "--config", cfg, *shape, "--threads", str(a.threads),
                    "--steps", str(steps), "--warmup-steps", "1"]
        if a.expert_lora:
            ours_cmd[ours_cmd.index("--device"):ours_cmd.index("--device")] = ["--target-parameters", EXPERT_PARAMETERS]
            peer_cmd += ["--target-parameters", EXPERT_PARAMETERS]
        case = {"name": name, "expert_lora": a.expert_lora,
                "commands": {"ours": " ".join(ours_cmd), "peer": " ".join(peer_cmd)}}
        case["ours"] = best_of(ours_cmd)
        case["peer"] = best_of(peer_cmd)
        if case["ours"]["trainable_params"] != case["peer"]["trainable_params"]:
            raise SystemExit(f"{name}: trainable parameters differ: {case['ours']['trainable_params']} vs "
                             f"{case['peer']['trainable_params']}")
        case["ratio_tokens_per_second"] = case["ours"]["tokens_per_second"] / case["peer"]["tokens_per_second"]
        case["ratio_peak_rss"] = case["ours"]["peak_memory_bytes"] / case["peer"]["peak_memory_bytes"]
        out["cases"].append(case)

    path = a.out or f"bench/results/cpu_moe_{platform.node() or 'host'}.json"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"wrote {path}", file=sys.stderr)
    gib = float(1 << 30)
    print("| model | qlora tok/s | peer tok/s (experts impl.) | ratio | qlora GFLOP/s | peak RSS qlora / peer |")
    print("|---|---:|---:|---:|---:|---:|")
    for c in out["cases"]:
        o, p = c["ours"], c["peer"]
        print(f"| {c['name']} | {o['tokens_per_second']:.0f} ({', '.join('%.0f' % x for x in o['all_runs_tokens_per_second'])}) | "
              f"{p['tokens_per_second']:.0f} ({', '.join('%.0f' % x for x in p['all_runs_tokens_per_second'])}; "
              f"{p['experts_implementation']}) | **{c['ratio_tokens_per_second']:.2f}x** | {o['achieved_flops'] / 1e9:.0f} | "
              f"{o['peak_memory_bytes'] / gib:.2f} / {p['peak_memory_bytes'] / gib:.2f} GiB |")


if __name__ == "__main__":
    main()
