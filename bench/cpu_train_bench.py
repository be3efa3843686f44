#!/usr/bin/env python3
"""CPU training throughput: `qlora bench` against transformers + peft (+ bitsandbytes for the NF4
base) on the same machine, the same shapes and the same thread count, one run after the other.

    bench/cpu_train_bench.py [--qlora build/qlora] [--python /opt/fixenv/bin/python] [--threads N]
                             [--out bench/results/cpu_train_<host>.json] [--quick]

Cases: SmolLM2-135M shape, LoRA r=16 on all linear layers, random weights and tokens, AdamW:
  fp32 base at T=512 x micro-batch 2 and T=2048 x micro-batch 1; NF4 (double quant) base at both.
The peer is tools/peers/hf_peft_bench.py (fp32: no autocast; NF4: bitsandbytes Linear4bit with
bf16 compute and bf16 autocast, the stock QLoRA recipe, which runs on the CPU).

OpenBLAS: the environment may force a core type (OPENBLAS_CORETYPE, e.g. Haswell on machines whose
OpenBLAS build predates the CPU). Ours runs twice per case: with the environment as it is and with
OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset (OpenBLAS picks its own kernels); the JSON names the core
each run used (`host.blas`). torch does not use OpenBLAS, so the peer runs once.

Each run of ours recalibrates the planner's CPU rates first (`--recalibrate`), so the planned step
time it reports was predicted from the machine as it was during that run.

Each side runs --repeat times per case (default 2) and the run with the highest tokens/s is kept,
the same rule for both sides (the others' tokens/s are kept in `all_runs_tokens_per_second`): the
benchmark machine is a shared VM whose speed drifts by 10-20% between minutes.

Writes one JSON (machine, commit, commands, both sides' full outputs, ratios) and prints a markdown
table. Speed numbers come from these files only; nothing here is a test.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

CASES = [
    {"name": "fp32 T=512 mb=2", "precision": "fp32", "seq_len": 512, "micro_batch": 2},
    {"name": "fp32 T=2048 mb=1", "precision": "fp32", "seq_len": 2048, "micro_batch": 1},
    {"name": "nf4 T=512 mb=2", "precision": "nf4", "seq_len": 512, "micro_batch": 2},
    {"name": "nf4 T=2048 mb=1", "precision": "nf4", "seq_len": 2048, "micro_batch": 1},
]


def run_json(cmd, env):
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise SystemExit(f"command failed ({p.returncode}): {' '.join(cmd)}")
    return json.loads(p.stdout)


def git_sha():
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
    except Exception:
        return None


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qlora", default="build/qlora")
    ap.add_argument("--python", default="/opt/fixenv/bin/python", help="interpreter with torch, transformers, peft, bitsandbytes")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=4, help="timed steps, ours")
    ap.add_argument("--peer-steps", type=int, default=3, help="timed steps, peer")
    ap.add_argument("--repeat", type=int, default=2, help="runs per side and case; the best is reported (the same rule for both)")
    ap.add_argument("--quick", action="store_true", help="first case only, 2 steps, one run (a smoke run)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    cases = CASES[:1] if a.quick else CASES
    steps, peer_steps = (2, 2) if a.quick else (a.steps, a.peer_steps)
    repeat = 1 if a.quick else max(1, a.repeat)

    def best_of(cmd, env):
        runs = [run_json(cmd, env) for _ in range(repeat)]
        best = max(runs, key=lambda r: r["tokens_per_second"])
        best["all_runs_tokens_per_second"] = [r["tokens_per_second"] for r in runs]
        return best

    base_env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), QLORA_GIT_SHA=git_sha() or "")
    auto_env = {k: v for k, v in base_env.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    env_core = os.environ.get("OPENBLAS_CORETYPE")
    variants = [("blas_auto", auto_env)] + ([("blas_env", base_env)] if env_core else [])

    out = {"tool": "bench/cpu_train_bench.py", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "git_sha": git_sha(), "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": a.threads,
           "platform": platform.platform(), "OPENBLAS_CORETYPE": env_core}, "command": " ".join(sys.argv), "cases": []}
    for c in cases:
        common = ["--model", "smollm2-135m", "--seq-len", str(c["seq_len"]), "--micro-batch", str(c["micro_batch"])]
        ours_cmd = [a.qlora, "bench", *common, "--base-precision", c["precision"], "--device", "cpu",
                    "--threads", str(a.threads), "--steps", str(steps), "--warmup-steps", "1", "--recalibrate", "--json"]
        peer_cmd = [a.python, "tools/peers/hf_peft_bench.py", "--device", "cpu", *common,
                    "--method", "qlora" if c["precision"] == "nf4" else "lora", "--base-precision", c["precision"],
                    "--steps", str(peer_steps), "--warmup-steps", "1", "--json"]
        case = {"name": c["name"], "ours": {}, "peer": None, "commands": {"ours": " ".join(ours_cmd), "peer": " ".join(peer_cmd)}}
        for tag, env in variants:
            case["ours"][tag] = best_of(ours_cmd, env)
        case["peer"] = best_of(peer_cmd, base_env)
        peer = case["peer"]
        for tag in case["ours"]:
            o = case["ours"][tag]
            case.setdefault("ratio_tokens_per_second", {})[tag] = o["tokens_per_second"] / peer["tokens_per_second"]
            case.setdefault("ratio_peak_rss", {})[tag] = o["peak_memory_bytes"] / peer["peak_memory_bytes"]
        out["cases"].append(case)

    path = a.out or f"bench/results/cpu_train_{platform.node() or 'host'}.json"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"wrote {path}", file=sys.stderr)

    gib = float(1 << 30)
    print("| case | BLAS kernels (ours) | qlora tok/s | peer tok/s | ratio | qlora GFLOP/s (% of sgemm) | planned step error | qlora peak RSS | peer peak RSS |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for case in out["cases"]:
        p = case["peer"]
        for tag, o in case["ours"].items():
            core = o.get("host", {}).get("blas", "").rsplit("core ", 1)[-1].rstrip(")")
            print(f"| {case['name']} | {core} | {o['tokens_per_second']:.1f} | {p['tokens_per_second']:.1f} | "
                  f"**{case['ratio_tokens_per_second'][tag]:.2f}x** | {o['achieved_flops'] / 1e9:.0f} "
                  f"({100 * o.get('achieved_fraction_of_sgemm', 0):.0f}%) | {100 * (o.get('planned_step_error') or 0):+.1f}% | "
                  f"{o['peak_memory_bytes'] / gib:.2f} GiB | {p['peak_memory_bytes'] / gib:.2f} GiB |")


if __name__ == "__main__":
    main()
