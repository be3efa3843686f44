#!/usr/bin/env bash
# Builds here what a GPU window runs there, as one archive (docs/bench.md, "The GPU window"):
#   qlora-device/bin/{qlora,test_cuda,bench_cuda_kernels}  from the main build (nvcc here compiles
#       the real CUDA backend for sm_80, sm_90a and sm_100a), debug info stripped, RUNPATH set to
#       $ORIGIN/../lib and then the places the GPU image keeps CUDA's libraries (toolkit folder,
#       the pip nvidia/*/lib folders of its Python); bench/device_window.sh also puts the folders
#       it finds there on LD_LIBRARY_PATH
#   qlora-device/lib/         every library the binaries load that is neither the C/C++ runtime
#       (glibc, libstdc++, libgcc_s, libgomp) nor CUDA's (cudart, cuBLAS, cuDNN, NCCL, NVRTC, the
#       driver): OpenBLAS, Open MPI and what they load, each with RUNPATH $ORIGIN
#   qlora-device/wheels/      bitsandbytes for the end-to-end peer, slimmed to its CPU and CUDA 13
#       libraries (bench/device_e2e.sh --pack-wheels; the image has no bitsandbytes)
#   qlora-device/devdeps/     the fallback build's dependencies (bench/device_run.sh --pack-deps), used
#       only when the prebuilt binaries do not start there
#   qlora-device/manifest.json  git sha, CUDA architectures, cuDNN/NCCL linked or not, the versions
#       compiled against, what was bundled and why
#
#   bench/device_pack.sh [BUILD] [DEST]     BUILD: the main build folder (default build; the three
#                                           targets are built there first), DEST: default build-pack
#
# Writes DEST/qlora_device.tar.xz (refused above QLORA_PACK_LIMIT_MIB, default 40) and carries no
# source: the window's working tree has the repository. Environment: QLORA_PACK_NO_WHEELS=1 leaves
# the bitsandbytes wheel out (the end-to-end peer then records why it did not run).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$(realpath -m "${1:-$ROOT/build}")"
DEST="$(realpath -m "${2:-$ROOT/build-pack}")"
LIMIT_MIB="${QLORA_PACK_LIMIT_MIB:-40}"
BINS=(qlora test_cuda bench_cuda_kernels)

die() { echo "device_pack: error: $*" >&2; exit 1; }
command -v patchelf >/dev/null || die "patchelf is missing (Debian: apt-get install patchelf; 'make deps' installs it)"
[ -f "$BUILD/CMakeCache.txt" ] || die "$BUILD is not a configured build (run 'make build' first)"
grep -q '^CMAKE_CUDA_COMPILER:' "$BUILD/CMakeCache.txt" && grep -q 'QLORA_HAVE_CUDA=1' "$BUILD/compile_commands.json" ||
  die "$BUILD has no CUDA backend (nvcc was not found when it was configured)"
echo "device_pack: building ${BINS[*]} in $BUILD (a no-op when up to date)"
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target "${BINS[@]}" >/dev/null || die "the build of ${BINS[*]} failed"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
pkg="$stage/qlora-device"
mkdir -p "$pkg/bin" "$pkg/lib" "$DEST"

# What the GPU image provides (never bundled): the C/C++ runtime and CUDA's libraries.
SYSTEM_RE='^(linux-vdso|ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|libgcc_s|libgomp)\.so'
CUDA_RE='^lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc[a-zA-Z._-]*|nvJitLink)\.so'
# Where the image keeps CUDA's libraries: the toolkit folder and the pip wheels of its Python
# (python3 there is /opt/torch/.venv/bin/python3, Python 3.12; nvidia/cu13 holds cudart, cuBLAS and
# NVRTC, nvidia/cudnn and nvidia/nccl their own).
SITE=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
RUNPATH='$ORIGIN/../lib'
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib "$SITE/cu13/lib" "$SITE/cudnn/lib" "$SITE/nccl/lib"; do
  RUNPATH="$RUNPATH:$d"
done

declare -A bundled=()
for b in "${BINS[@]}"; do
  src="$BUILD/$b"
  [ -x "$src" ] || die "$src was not built"
  cp "$src" "$pkg/bin/$b"
  strip --strip-debug "$pkg/bin/$b"
  patchelf --set-rpath "$RUNPATH" "$pkg/bin/$b"
  # ldd lists every library loaded, direct or not.
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$name" =~ $SYSTEM_RE || "$name" =~ $CUDA_RE ]] && continue
    [ "$path" = "not" ] && die "$b needs $name, which does not resolve here"
    [ -n "${bundled[$name]:-}" ] && continue
    cp -L "$path" "$pkg/lib/$name"
    chmod u+w "$pkg/lib/$name"
    strip --strip-debug "$pkg/lib/$name" 2>/dev/null || true
    patchelf --set-rpath '$ORIGIN' "$pkg/lib/$name"
    bundled[$name]="$path (needed by $b)"
  done < <(ldd "$src")
done

needed() { readelf -d "$pkg/bin/$1" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'; }
have_cudnn=false
needed test_cuda | grep -q '^libcudnn\.so' && have_cudnn=true
have_nccl=false
needed qlora | grep -q '^libnccl\.so' && have_nccl=true
# The architectures nvcc compiled the backend for (its --generate-code flags).
archs="$(grep -o 'generate-code=arch=compute_[0-9a-z]*' "$BUILD/CMakeFiles/qlora_backend_cuda.dir/flags.make" 2>/dev/null |
  sed 's/.*compute_//' | sort -u | paste -sd';')"
case ";$archs;" in *";90a;"*) ;; *) die "$BUILD does not build sm_90a (built: ${archs:-none}; -DCMAKE_CUDA_ARCHITECTURES)" ;; esac
ver() {  # ver HEADER MACRO...: the values of the macros, joined by dots
  local h=$1 out="" m v
  shift
  for m in "$@"; do
    v="$(sed -n "s/^#define $m[[:space:]]\+\([0-9]\+\).*/\1/p" "$h" 2>/dev/null | head -1)"
    out="${out:+$out.}${v:-?}"
  done
  echo "$out"
}
cuda_inc="$(dirname "$(readlink -f "$(command -v nvcc)")")/../include"
# For the fallback build on the device (bench/device_run.sh --build-only): OpenBLAS, GoogleTest, the
# qlora CLI's libraries, Open MPI's headers and libraries, the cuDNN frontend headers.
bash "$ROOT/bench/device_run.sh" --pack-deps "$pkg/devdeps" >"$stage/devdeps.log" 2>&1 ||
  { cat "$stage/devdeps.log" >&2; die "bench/device_run.sh --pack-deps failed"; }
if [ "${QLORA_PACK_NO_WHEELS:-0}" != 1 ]; then
  bash "$ROOT/bench/device_e2e.sh" --pack-wheels "$pkg/wheels" >/dev/null 2>"$stage/wheels.log" ||
    { cat "$stage/wheels.log" >&2; die "the bitsandbytes wheel could not be fetched (QLORA_PACK_NO_WHEELS=1 packs without it)"; }
fi

sha="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
[ "$sha" != unknown ] && ! git -C "$ROOT" diff --quiet HEAD -- src tests bench CMakeLists.txt cmake 2>/dev/null && sha="$sha+dirty"
for n in "${!bundled[@]}"; do printf '%s\t%s\n' "$n" "${bundled[$n]}"; done >"$stage/bundled.tsv"
# The newest glibc and libstdc++ symbol versions anything in the archive needs: the image's own C
# and C++ runtimes must be at least these (the probe compares).
newest() { objdump -T "$pkg"/bin/* "$pkg"/lib/* 2>/dev/null | grep -o "$1[0-9.]*" | sort -uV | tail -1; }
glibc_req="$(newest GLIBC_)"
glibcxx_req="$(newest GLIBCXX_)"
python3 - "$pkg/manifest.json" "$sha" "$archs" "$have_cudnn" "$have_nccl" \
  "$(ver "$cuda_inc/cudnn_version.h" CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL)" \
  "$(ver "$cuda_inc/nccl.h" NCCL_MAJOR NCCL_MINOR NCCL_PATCH)" \
  "$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')" "$RUNPATH" "${BINS[*]}" "$stage/bundled.tsv" \
  "$SYSTEM_RE" "$CUDA_RE" "$glibc_req" "$glibcxx_req" <<'PY'
import json, sys
out, sha, archs, cudnn, nccl, cudnn_v, nccl_v, cuda_v, runpath, bins, tsv, sys_re, cuda_re, glibc, glibcxx = sys.argv[1:16]
bundled = dict(line.rstrip("\n").split("\t", 1) for line in open(tsv) if line.strip())
json.dump({"git_sha": sha, "cuda_architectures": archs.split(";"), "cudnn": cudnn == "true",
           "nccl": nccl == "true", "compiled_against": {"cuda": cuda_v, "cudnn": cudnn_v, "nccl": nccl_v},
           "binaries": bins.split(), "runpath": runpath, "bundled": bundled,
           "system_libraries": sys_re, "cuda_libraries": cuda_re,
           "requires": {"glibc": glibc, "libstdcxx": glibcxx}}, open(out, "w"), indent=1)
PY
out="$DEST/qlora_device.tar.xz"
# The three binaries each link the CUDA backend, so each holds the same fatbinary (17 MiB of
# kernels for three architectures, stored uncompressed: nvcc's default). One xz stream whose
# dictionary spans the distance between them (about 24 MiB, the binaries side by side in name
# order) stores it once: 7 MiB less than xz -6's 8 MiB window (measured at f8965b0: 34.9 -> 27.9 MB).
# Decompression needs 48 MiB of memory.
tar -C "$stage" --sort=name -cf - qlora-device | xz -T1 --lzma2=preset=6,dict=48MiB >"$out.tmp"
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
echo "device_pack: $out $((size / 1048576)) MiB (${#bundled[@]} bundled libraries, cuDNN $have_cudnn, NCCL $have_nccl, archs $archs)"
[ "$size" -le $((LIMIT_MIB * 1048576)) ] || die "$out is $((size / 1048576)) MiB, over the ${LIMIT_MIB} MiB limit"
