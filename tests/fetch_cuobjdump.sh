#!/bin/sh
# Fetches cuobjdump and nvdisasm (cuobjdump calls it for -sass), which the CUDA toolkit's nvcc-only
# install lacks, from their PyPI wheels into the cache (default .cache/qlora), then copies them to
# TOOLS_DIR (default build/tools) for the cuda-static tests:
#   usage: fetch_cuobjdump.sh [TOOLS_DIR [CACHE_DIR]]
# Each wheel is fetched by package name and pinned version with `python3 -m pip download` (so the
# configured index or mirror applies; PYTHON chooses another interpreter), sha256-checked, and only
# its binary is kept. On failure it says why and exits 1; the cuda-static tests then fail naming the
# missing tool.
set -eu
TOOLS=${1:-build/tools}
CACHE=${2:-${QLORA_CACHE:-.cache/qlora}}
VERSION=13.2.51   # the oldest 13.x on PyPI; reads the cubins of nvcc 13.0
case "$(uname -m)" in
  x86_64)
    PLAT=manylinux2014_x86_64
    CUOBJDUMP_SHA256=95c69d3ddf0c2c1f535ec44c3433a66aeee19f588d9d22f73356e20b25f12b50
    NVDISASM_SHA256=5a7acf77c55d6d2911ed6155d4d5bc156ffadf9df7a68a89b0c1155f4b13688c ;;
  aarch64)
    PLAT=manylinux2014_aarch64
    CUOBJDUMP_SHA256=f2f3bc433a91f4ff910841f2de8bc9e7ce92556602d6e363054fe2bb62a587c4
    NVDISASM_SHA256=483c8f652c1ca006135584b4faf7ea1d2bafe4c40ec1c9ef57a04c6acfbdd57f ;;
  *) echo "error: fetch_cuobjdump.sh: no pinned cuobjdump wheel for $(uname -m)" >&2; exit 1 ;;
esac

. "$(dirname "$0")/../tools/pypi_wheel.sh"   # pypi_wheel NAME VERSION SHA256 DEST [PIP_OPTION...]

# fetch TOOL SHA256: the wheel nvidia-cuda-TOOL, its bin/TOOL cached and copied to TOOLS.
fetch() {
  tool=$1
  dir=$CACHE/cuda-binutils-$VERSION
  if ! [ -x "$dir/$tool" ]; then
    wheel=$dir/nvidia-cuda-$tool.whl.part
    mkdir -p "$dir"
    echo "fetching PyPI nvidia-cuda-$tool $VERSION into $dir ..." >&2
    pypi_wheel "nvidia-cuda-$tool" "$VERSION" "$2" "$wheel" -q --platform "$PLAT" || {
      echo "error: the cuda-static tests need $tool" >&2; rm -f "$wheel"; return 1; }
    unzip -p "$wheel" "nvidia/cu13/bin/$tool" > "$dir/$tool.part" && [ -s "$dir/$tool.part" ] || {
      echo "error: nvidia-cuda-$tool $VERSION has no nvidia/cu13/bin/$tool" >&2; rm -f "$wheel" "$dir/$tool.part"; return 1; }
    chmod +x "$dir/$tool.part" && mv "$dir/$tool.part" "$dir/$tool"
    rm -f "$wheel"   # the binary is all we keep
  fi
  mkdir -p "$TOOLS"
  cp "$dir/$tool" "$TOOLS/$tool.part" && mv "$TOOLS/$tool.part" "$TOOLS/$tool"
}

fetch cuobjdump "$CUOBJDUMP_SHA256"
fetch nvdisasm "$NVDISASM_SHA256"
"$TOOLS/cuobjdump" --version >/dev/null || { echo "error: $TOOLS/cuobjdump does not run" >&2; exit 1; }
echo "$TOOLS/cuobjdump"
