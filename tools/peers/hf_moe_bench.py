#!/usr/bin/env python3
"""The peer of bench/cpu_moe_bench.py: LoRA training of a mixture-of-experts model with
transformers + peft on the CPU, fp32, from a config.json (random weights, random tokens).

    hf_moe_bench.py --config DIR --seq-len 512 --micro-batch 2 --steps 3 --warmup-steps 1 --threads 2

As `qlora bench` runs it: the model built from the config with random weights (std 0.02),
attn_implementation "sdpa" (gpt-oss: "eager": transformers has no sdpa path for its sinks), its default experts
implementation (both recorded in the JSON),
LoRA r=16 alpha 32 on the attention's four projections (PEFT's all-linear would also wrap the
router), and with --target-parameters on the stacked experts too (PEFT's lora.ParamWrapper, one pair
per expert), no dropout, AdamW (lr 2e-4,
not fused), clipping at 1.0, labels = the tokens. One JSON object on stdout: tokens/s over the
timed steps, the step times and the peak RSS.
"""
import argparse
import json
import resource
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="directory with config.json")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup-steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--lora-alpha", type=float, default=32.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-parameters", default="", help="comma list, e.g. mlp.experts.gate_up_proj,mlp.experts.down_proj")
    a = ap.parse_args()

    import torch
    import transformers
    import peft
    from transformers import AutoConfig, AutoModelForCausalLM

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = AutoConfig.from_pretrained(a.config)
    # gpt-oss has no sdpa path in transformers (its sinks): eager, its default.
    attn = "eager" if cfg.model_type == "gpt_oss" else "sdpa"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    target_parameters = [t for t in a.target_parameters.split(",") if t] or None
    lcfg = peft.LoraConfig(r=a.r, lora_alpha=a.lora_alpha, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0,
                           bias="none", task_type="CAUSAL_LM", target_parameters=target_parameters)
    model = peft.get_peft_model(model, lcfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0, foreach=False)
    gen = torch.Generator().manual_seed(a.seed)
    times, losses = [], []
    for step in range(a.warmup_steps + a.steps):
        ids = torch.randint(0, cfg.vocab_size, (a.micro_batch, a.seq_len), generator=gen)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if step >= a.warmup_steps:
            times.append(dt)
    tokens = a.micro_batch * a.seq_len
    out = {
        "tool": "tools/peers/hf_moe_bench.py",
        "model_type": cfg.model_type,
        "experts_implementation": getattr(model.base_model.model.config, "_experts_implementation", None),
        "attn_implementation": attn,
        "seq_len": a.seq_len, "micro_batch": a.micro_batch, "threads": torch.get_num_threads(),
        "steps": a.steps, "step_times_s": times,
        "tokens_per_second": tokens * len(times) / sum(times),
        "trainable_params": sum(p.numel() for p in params),
        "loss_first": losses[0], "loss_last": losses[-1],
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "peak_memory_kind": "host_rss",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
