#!/usr/bin/env python3
"""Long context on the CPU: one `qlora train` step of SmolLM2-135M-Instruct QLoRA (NF4, double
quant, r=16 on all linear layers, full checkpointing with the MLP in tiles) on a single document of
exactly T tokens, with the process's measured peak RSS beside `qlora plan`'s memory figure and the
measured step time beside the planner's prediction for this machine.

    bench/cpu_long_context_bench.py [--qlora build/qlora] [--seq-len 32768 --seq-len 65536]
                                    [--out bench/results/cpu_long_context.json]

The model is the Quickstart's GGUF (examples/smollm2/fetch_model.sh). The document is the
repository's own Markdown, repeated until it is longer than T tokens; `truncation: truncate_right`
cuts it to T, so the one row holds T tokens and every position is trained. SmolLM2 was pre-trained
to 8,192 positions: the loss at these lengths says nothing about quality; the run measures memory
and time, which do not depend on the RoPE frequencies.

The machine should be otherwise idle: the step time is wall time, and the process's CPU seconds
(`process_cpu_seconds`, user + system) show when it was not (about 2 x the step on 2 idle cores).

Peak RSS is the kernel's high-water mark of the `qlora train` process (os.wait4's ru_maxrss): the
model, the tokenizer, the data pipeline, the arena, OpenBLAS's buffers and everything else the
process touched. The plan's figure is `qlora plan -c <the same config> --gpu cpu --json`'s total.
Nothing here is a test; the JSON is the record.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cpu_train_bench import cpu_model, git_sha  # noqa: E402

CONFIG = """model_name_or_path: {model}
train_file: {data}
output_dir: {out}
dataset_format: text
dataset_text_field: text
max_length: {seq_len}
truncation: truncate_right
packing: false
per_device_train_batch_size: 1
gradient_accumulation_steps: 1
max_steps: 1
load_in_4bit: true
bnb_4bit_quant_type: nf4
bnb_4bit_use_double_quant: true
r: 16
lora_alpha: 32
lora_dropout: 0.0
target_modules: all-linear
gradient_checkpointing: full
learning_rate: 1.0e-4
logging_steps: 1
dataset_prepared_path: none
seed: 42
"""


def long_text(min_chars):
    parts = [open(p, encoding="utf-8").read() for p in sorted(glob.glob("docs/*.md")) + ["README.md"]]
    text = "\n\n".join(parts)
    return (text + "\n\n") * (min_chars // len(text) + 1)


def run_child(cmd):
    """Runs cmd, returns (returncode, seconds, peak RSS bytes, CPU seconds of that process)."""
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, time.monotonic() - t0, ru.ru_maxrss * 1024, ru.ru_utime + ru.ru_stime


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qlora", default="build/qlora")
    ap.add_argument("--model", default=".cache/qlora/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--seq-len", type=int, action="append", help="tokens (repeatable; default 32768 and 65536)")
    ap.add_argument("--out", default="bench/results/cpu_long_context.json")
    a = ap.parse_args()
    seq_lens = a.seq_len or [32768, 65536]
    if not os.path.exists(a.model):
        subprocess.run(["./examples/smollm2/fetch_model.sh"], check=True, stdout=subprocess.DEVNULL)

    out = {"tool": "bench/cpu_long_context_bench.py",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "git_sha": git_sha(), "device": "cpu",
           "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                       "mem_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")},
           "command": " ".join(sys.argv), "model": a.model, "cases": []}
    if os.path.exists(a.out):  # keep the cases of other lengths measured earlier
        prev = json.load(open(a.out))
        out["cases"] = [c for c in prev.get("cases", []) if c["seq_len"] not in seq_lens]

    with tempfile.TemporaryDirectory(prefix="qlora-longctx-") as tmp:
        data = os.path.join(tmp, "doc.jsonl")
        with open(data, "w") as f:
            f.write(json.dumps({"text": long_text(6 * max(seq_lens))}) + "\n")
        for t in seq_lens:
            run_dir = os.path.join(tmp, f"run{t}")
            cfg = os.path.join(tmp, f"long{t}.yaml")
            with open(cfg, "w") as f:
                f.write(CONFIG.format(model=a.model, data=data, out=run_dir, seq_len=t))
            plan_cmd = [a.qlora, "plan", "-c", cfg, "--gpu", "cpu", "--json"]
            print("+ " + " ".join(plan_cmd), file=sys.stderr, flush=True)
            plan = json.loads(subprocess.run(plan_cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)
            train_cmd = [a.qlora, "train", cfg]
            rc, wall, rss, cpu = run_child(train_cmd)
            if rc != 0:
                raise SystemExit(f"qlora train failed ({rc}) at {t} tokens")
            rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if l.strip()]
            step = next(r for r in rows if "step_seconds" in r)
            planned_total = plan["total_bytes"]
            planned_step = plan["step_time_s"]
            out["cases"].append({
                "name": f"SmolLM2-135M QLoRA T={t}", "seq_len": t, "config": open(cfg).read(),
                "commands": {"plan": " ".join(plan_cmd), "train": " ".join(train_cmd)},
                "ours": {"peak_rss_bytes": rss, "step_seconds": step["step_seconds"], "loss": step.get("loss"),
                         "process_wall_seconds": wall, "process_cpu_seconds": cpu, "metrics": step},
                "plan": {"total_bytes": planned_total, "step_time_s": planned_step, "categories": plan["categories"],
                         "time_s": plan["time_s"], "warnings": plan["warnings"]},
                "peer": None,
                "rss_over_plan": rss / planned_total, "step_over_plan": step["step_seconds"] / planned_step})
            out["cases"].sort(key=lambda c: c["seq_len"])
            os.makedirs(os.path.dirname(a.out), exist_ok=True)
            with open(a.out + ".tmp", "w") as f:
                json.dump(out, f, indent=1)
                f.write("\n")
            os.replace(a.out + ".tmp", a.out)
            print(f"wrote {a.out}", file=sys.stderr)

    gib = float(1 << 30)
    print("| tokens | planned memory | peak RSS | RSS / plan | planned step | measured step | measured / planned |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for c in out["cases"]:
        print(f"| {c['seq_len']:,} | {c['plan']['total_bytes'] / gib:.2f} GiB | {c['ours']['peak_rss_bytes'] / gib:.2f} GiB | "
              f"{c['rss_over_plan']:.3f} | {c['plan']['step_time_s']:.0f} s | {c['ours']['step_seconds']:.0f} s | "
              f"{c['step_over_plan']:.3f} |")


if __name__ == "__main__":
    main()
