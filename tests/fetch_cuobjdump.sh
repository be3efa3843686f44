#!/bin/sh
# Fetches cuobjdump and nvdisasm (cuobjdump calls it for -sass), which the CUDA toolkit's nvcc-only
# install lacks, from their PyPI wheels (zips; no Python needed) into the cache (default
# .cache/qlora), then copies them to TOOLS_DIR (default build/tools) for the cuda-static tests:
#   usage: fetch_cuobjdump.sh [TOOLS_DIR [CACHE_DIR]]
# On failure it says why and exits 1; the cuda-static tests then fail naming the missing tool.
set -eu
TOOLS=${1:-build/tools}
CACHE=${2:-${QLORA_CACHE:-.cache/qlora}}
VERSION=13.2.51   # the oldest 13.x on PyPI; reads the cubins of nvcc 13.0
PYPI=https://files.pythonhosted.org/packages
case "$(uname -m)" in
  x86_64)
    PLAT=manylinux2014_x86_64.manylinux_2_17_x86_64
    CUOBJDUMP_PATH=a9/2c/af21e3b8eecbf1e9c373967fe517fd5236d061646664a98277de7d21c420
    CUOBJDUMP_SHA256=95c69d3ddf0c2c1f535ec44c3433a66aeee19f588d9d22f73356e20b25f12b50
    NVDISASM_PATH=ad/34/f19b4dd50158e7dc18c55654f844d87bf188d2a2b230374620e6b126a6c9
    NVDISASM_SHA256=5a7acf77c55d6d2911ed6155d4d5bc156ffadf9df7a68a89b0c1155f4b13688c ;;
  aarch64)
    PLAT=manylinux2014_aarch64.manylinux_2_17_aarch64
    CUOBJDUMP_PATH=30/57/7a74e8766843c71c14868e857c9bd106107288039765cddea4717ea704a8
    CUOBJDUMP_SHA256=f2f3bc433a91f4ff910841f2de8bc9e7ce92556602d6e363054fe2bb62a587c4
    NVDISASM_PATH=32/e3/bf1272e9aa9deb5e5f323c4c1758bd03b541162823e59956bdf34a765596
    NVDISASM_SHA256=483c8f652c1ca006135584b4faf7ea1d2bafe4c40ec1c9ef57a04c6acfbdd57f ;;
  *) echo "error: fetch_cuobjdump.sh: no pinned cuobjdump wheel for $(uname -m)" >&2; exit 1 ;;
esac

# fetch TOOL URL_PATH SHA256: the wheel nvidia-cuda-TOOL, its bin/TOOL cached and copied to TOOLS.
fetch() {
  tool=$1
  dir=$CACHE/cuda-binutils-$VERSION
  if ! [ -x "$dir/$tool" ]; then
    wheel=nvidia_cuda_$tool-$VERSION-py3-none-$PLAT.whl
    url=$PYPI/$2/$wheel
    mkdir -p "$dir"
    echo "downloading PyPI nvidia-cuda-$tool $VERSION into $dir ..." >&2
    curl -fsSL --retry 3 -o "$dir/$wheel.part" "$url" || {
      echo "error: could not download $url (the cuda-static tests need $tool)" >&2; rm -f "$dir/$wheel.part"; return 1; }
    echo "$3  $dir/$wheel.part" | sha256sum -c - >/dev/null 2>&1 || {
      echo "error: $url: sha256 mismatch (expected $3)" >&2; rm -f "$dir/$wheel.part"; return 1; }
    unzip -p "$dir/$wheel.part" "nvidia/cu13/bin/$tool" > "$dir/$tool.part" && [ -s "$dir/$tool.part" ] || {
      echo "error: $wheel has no nvidia/cu13/bin/$tool" >&2; rm -f "$dir/$wheel.part" "$dir/$tool.part"; return 1; }
    chmod +x "$dir/$tool.part" && mv "$dir/$tool.part" "$dir/$tool"
    rm -f "$dir/$wheel.part"   # the binary is all we keep
  fi
  mkdir -p "$TOOLS"
  cp "$dir/$tool" "$TOOLS/$tool.part" && mv "$TOOLS/$tool.part" "$TOOLS/$tool"
}

fetch cuobjdump "$CUOBJDUMP_PATH" "$CUOBJDUMP_SHA256"
fetch nvdisasm "$NVDISASM_PATH" "$NVDISASM_SHA256"
"$TOOLS/cuobjdump" --version >/dev/null || { echo "error: $TOOLS/cuobjdump does not run" >&2; exit 1; }
echo "$TOOLS/cuobjdump"
