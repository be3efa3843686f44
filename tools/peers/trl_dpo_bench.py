#!/usr/bin/env python3
"""TRL peer of a `qlora train` DPO run (bench/cpu_dpo_bench.py): TRL's DPOTrainer + peft on the
CPU, same model, data, shapes and LoRA, timing each optimizer step.

    trl_dpo_bench.py --model DIR --data pairs.jsonl --steps 12 --batch 4 --max-length 256 \
        --r 16 --alpha 32 --lr 2e-4 --threads 2 --out peer.json
    trl_dpo_bench.py --export-hf OUT_DIR --gguf FILE.gguf     # GGUF -> fp32 safetensors + tokenizer

What it runs: AutoModelForCausalLM (fp32, attn_implementation="sdpa") wrapped by DPOTrainer with a
peft LoraConfig(r, lora_alpha, all linear projections, lora_dropout 0); the reference is the model
with the adapter disabled (TRL's default for a fresh peft adapter: no second copy), computed in the
step (precompute_ref_log_probs false); beta 0.1, loss sigmoid, AdamW, constant learning rate, no
gradient checkpointing, no clipping effects (max_grad_norm 1.0 as ours), fp32 (use_cpu, no
autocast). Step times come from a callback (on_step_begin -> on_step_end); the first --warmup
steps are not counted.
"""
import argparse
import json
import os
import sys
import time


def export_hf(out, gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.dirname(os.path.abspath(gguf)), os.path.basename(gguf)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype="float32")
    os.makedirs(out, exist_ok=True)
    # transformers will not save a model it loaded from GGUF: write its (dequantized, fp32) tensors
    # and a config without the GGUF quantization entry ourselves.
    from safetensors.torch import save_file
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cfg.save_pretrained(out)
    tok.save_pretrained(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--export-hf", default="")
    ap.add_argument("--gguf", default="")
    ap.add_argument("--model", default="")
    ap.add_argument("--data", default="")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--r", type=int, default=16)
    ap.add_argument("--alpha", type=float, default=32)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.export_hf:
        export_hf(a.export_hf, a.gguf)
        return

    import torch
    torch.set_num_threads(a.threads)
    import datasets
    import peft
    import transformers
    import trl
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa")
    ds = datasets.load_dataset("json", data_files=a.data, split="train")

    times = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    logged = []

    class Logs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            if logs:
                logged.append(dict(logs, step=state.global_step))
    cfg = DPOConfig(output_dir=os.path.join(os.path.dirname(a.out) or ".", "trl_dpo_out"), use_cpu=True, bf16=False,
                    fp16=False, per_device_train_batch_size=a.batch, gradient_accumulation_steps=1,
                    max_steps=a.steps, learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0,
                    weight_decay=0.0, max_grad_norm=1.0, beta=a.beta, loss_type=["sigmoid"],
                    max_length=a.max_length, logging_steps=1, report_to="none", save_strategy="no",
                    gradient_checkpointing=False, seed=42, dataloader_num_workers=0, disable_tqdm=True,
                    precompute_ref_log_probs=False)
    lora = LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    trainer = DPOTrainer(model=model, args=cfg, train_dataset=ds, processing_class=tok, peft_config=lora,
                         callbacks=[StepTimer(), Logs()])
    trainer.train()
    timed = times[a.warmup:]
    timed_sorted = sorted(timed)
    out = {
        "peer": "trl DPOTrainer + peft",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
                     "trl": trl.__version__, "datasets": datasets.__version__},
        "threads": a.threads,
        "step_seconds": times,
        "median_step_seconds": timed_sorted[len(timed_sorted) // 2] if timed else None,
        "logs": logged,
    }
    text = json.dumps(out, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)


if __name__ == "__main__":
    main()
