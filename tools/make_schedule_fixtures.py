#!/usr/bin/env python3
"""Writes tests/fixtures/train/schedules.json: LRs and step counts computed by transformers itself.

For each case a real torch AdamW + transformers.get_scheduler runs; the LR recorded for optimizer
step s is param_groups[0]["lr"] just before step s (what LambdaLR gives as base_lr * lambda(s)).
Warmup comes from TrainingArguments.get_warmup_steps; total steps from Trainer.set_initial_training_values.
Run: /opt/fixenv/bin/python tools/make_schedule_fixtures.py
"""
import json
import math
import os
import types

import torch
import transformers
from transformers import Trainer, TrainingArguments, get_scheduler

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "train", "schedules.json")


def warmup_for(total, warmup_steps, warmup_ratio, tmp):
    # transformers >= 5 folds warmup_ratio into a fractional warmup_steps
    w = warmup_steps if warmup_steps > 0 else warmup_ratio
    args = TrainingArguments(output_dir=tmp, warmup_steps=w, report_to=[])
    return args.get_warmup_steps(total)


def lrs(kind, base_lr, warmup, total, n):
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p], lr=base_lr)
    sched = get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=total)
    out = []
    for _ in range(n):
        out.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones_like(p)
        opt.step()
        sched.step()
    return out


def total_steps(n_batches, ga, epochs, max_steps, tmp):
    args = TrainingArguments(output_dir=tmp, gradient_accumulation_steps=ga, num_train_epochs=epochs,
                             max_steps=max_steps, per_device_train_batch_size=1, report_to=[])
    loader = torch.utils.data.DataLoader(list(range(n_batches)), batch_size=1)
    # Trainer's own method on a stand-in for the Trainer (building a real one needs a model)
    fake = types.SimpleNamespace(get_total_train_batch_size=lambda a: a.gradient_accumulation_steps,
                                 get_sp_size=lambda: 1, num_examples=lambda dl: len(dl.dataset))
    return Trainer.set_initial_training_values(fake, args, loader)[-1]


def main():
    tmp = "/tmp/qlora_sched_fixture"
    cases = []
    for kind, base_lr, ws, wr, total in [
        ("linear", 2e-4, 10, 0.0, 100),
        ("linear", 1e-3, 0, 0.1, 37),
        ("linear", 5e-5, 1, 0.0, 5),
        ("cosine", 2e-4, 0, 0.03, 250),
        ("cosine", 3e-4, 7, 0.5, 40),   # warmup_steps wins over the ratio
        ("cosine", 1e-4, 0, 0.0, 13),
        ("constant", 2e-4, 5, 0.0, 20),
        ("constant_with_warmup", 1e-4, 0, 0.25, 30),
        ("constant_with_warmup", 2e-4, 3, 0.0, 9),
    ]:
        warmup = warmup_for(total, ws, wr, tmp)
        # a few steps past the end: HF clamps linear/cosine at 0 there
        cases.append({"type": kind, "base_lr": base_lr, "warmup_steps": ws, "warmup_ratio": wr,
                      "total_steps": total, "hf_warmup": warmup,
                      "lr": lrs(kind, base_lr, warmup, total, total + 3)})
    totals = []
    for n_batches, ga, epochs, max_steps in [(100, 1, 1.0, -1), (10, 4, 3.0, -1), (7, 8, 1.0, -1),
                                             (33, 4, 2.5, -1), (10, 3, 0.5, -1), (10, 4, 3.0, 17)]:
        totals.append({"micro_batches": n_batches, "gradient_accumulation_steps": ga,
                       "num_train_epochs": epochs, "max_steps": max_steps,
                       "total_steps": total_steps(n_batches, ga, epochs, max_steps, tmp)})
    doc = {"generator": "tools/make_schedule_fixtures.py", "transformers": transformers.__version__,
           "torch": torch.__version__, "schedules": cases, "total_steps": totals}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
    print("wrote", os.path.normpath(OUT), sum(len(c["lr"]) for c in cases), "lrs")


if __name__ == "__main__":
    main()
