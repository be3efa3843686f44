#!/usr/bin/env bash
# Shows that the CUDA host harness catches the kernel bugs it exists for: each mutation below is
# applied to a scratch copy of the tree, the harness tests are rebuilt and run there, and the
# mutation must make them fail. The tree itself is never modified.
#
#   tools/cuda_emu_mutations.sh [SCRATCH_DIR]     (default /tmp/qlora-mutations; ~10 min on 2 cores)
#   QLORA_MUTANTS=embedding tools/cuda_emu_mutations.sh   (only the mutants whose name has this text)
#
# Prints one line per mutation (CAUGHT or MISSED, with the first failure message) and exits 1 if
# any mutation was missed.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-/tmp/qlora-mutations}"
mkdir -p "$work/tree"
# The tracked and untracked-but-not-ignored files: what a checkout of this change holds. Only the
# files whose content differs from the scratch copy are copied (with a new time stamp), so a rerun
# rebuilds what changed, and a file the last run mutated and restored is rebuilt too.
list="$work/files"
(cd "$src" && git ls-files -z --cached --others --exclude-standard) >"$list"
while IFS= read -r -d '' f; do
  if ! cmp -s "$src/$f" "$work/tree/$f"; then
    mkdir -p "$work/tree/$(dirname "$f")"
    cp "$src/$f" "$work/tree/$f"
  fi
done <"$list"
# Files the change no longer has (the build globs the source folders).
(cd "$work/tree" && find . -type f -not -path './.cache/*' -printf '%P\0') | sort -z >"$list.tree"
sort -z "$list" | comm -z -23 "$list.tree" - | (cd "$work/tree" && xargs -0 -r rm -f)
cmake -S "$work/tree" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DQLORA_CUDA=OFF -DQLORA_NO_SANITIZE_TESTS=OFF >/dev/null
fwd="src/backend/cuda/cuda_attention_fwd.cu"
mma="src/backend/cuda/attention_mma.cuh"
side="src/backend/cuda/cuda_side_stream.cu"
dev="src/backend/cuda/cuda_device.cu"
loss="src/backend/cuda/cuda_loss_optim.cu"
mm="src/backend/cuda/cuda_matmul.cu"
norm="src/backend/cuda/cuda_norm.cu"
sdpa="src/backend/cuda/cudnn_sdpa_graph.cpp"

# name | gtest filter (empty: the attention forward tests) | file | sed expression, each run in fast
# mode; "tsan:" also under ThreadSanitizer, which must report the race; "tsanonly:" only under
# ThreadSanitizer (a race whose outcome fast mode's one-block-at-a-time schedule cannot show).
mutations=(
  "tsan:missing __syncthreads before a stage is refilled||$fwd|s|^    __syncthreads();  // this stage is refilled.*|    // (barrier removed)|"
  "cp.async wait skipped in the main loop||$fwd|s|^      cp_async_wait<1>();\$|      // (wait removed)|"
  "shared buffer one K/V stage too small||$mma|s|kSmemBytes = kQBytes + 4 \\* kKVBytes;|kSmemBytes = kQBytes + 3 * kKVBytes;|"
  "stream wait removed before a prefetched layer is read|CudaEmuTraining.Qlora*|$side|s|^      QLORA_CUDA_CHECK(cudaStreamWaitEvent(stream_, side.pending\\[i\\].ready, 0));|      // (wait removed)|"
  "error record cleared by a memset on the legacy stream, racing the compute stream|CudaOps.cross_entropy*|$dev|s|^  QLORA_CUDA_CHECK(cudaMemsetAsync(d_err_, 0, size_t(cuda_plan::kErrorRecordBytes), stream_));|  QLORA_CUDA_CHECK(cudaMemset(d_err_, 0, size_t(cuda_plan::kErrorRecordBytes)));|"
  "a host pointer passed to a kernel|CudaOps.sumsq*|$loss|s|total_blocks, partial);|total_blocks, a.out);|"
  "a cuBLASLt call that ignores its algorithm's workspace requirement|CudaOps.matmul*|$mm|s|be.lt_workspace_, be.lt_workspace_bytes_, be.stream_),|nullptr, 0, be.stream_),|"
  "a cuDNN graph whose Q/K/V token stride is off by one head|CudaEmuCudnn.*|$sdpa|s|.set_stride({sh.s \\* h \\* sh.d, sh.d, h \\* sh.d, 1}).set_ragged_offset(off));|.set_stride({sh.s * h * sh.d, sh.d, (h + 1) * sh.d, 1}).set_ragged_offset(off));|"
  "tsanonly:two blocks adding into one embedding row without an atomic|CudaOps.embedding_bwd*|$norm|s|^      atomicAdd(static_cast<float\\*>(dtable.p) + k, g);|      static_cast<float*>(dtable.p)[k] += g;|"
)

missed=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name filter file expr <<<"$m"
  filter="${filter:-CudaOps.attention_fwd*}"
  tsan=0
  fast=1
  if [[ "$name" == tsan:* ]]; then tsan=1; name="${name#tsan:}"; fi
  if [[ "$name" == tsanonly:* ]]; then tsan=1; fast=0; name="${name#tsanonly:}"; fi
  if [ -n "${QLORA_MUTANTS:-}" ] && [[ "$name" != *"$QLORA_MUTANTS"* ]]; then continue; fi
  cp "$src/$file" "$work/tree/$file"
  sed -i "$expr" "$work/tree/$file"
  if cmp -s "$src/$file" "$work/tree/$file"; then
    echo "ERROR: mutation '$name' did not apply to $file (the source changed; update this script)" >&2
    exit 2
  fi
  log="$work/$(echo "$name" | tr -c 'a-zA-Z0-9' '_').log"
  if [ "$fast" = 1 ]; then
    cmake --build "$work/build" -j "$(nproc)" --target test_cuda_emu >/dev/null
    if QLORA_CUDA_TEST_SMALL=1 "$work/build/test_cuda_emu" --gtest_filter="$filter" >"$log" 2>&1; then
      echo "MISSED  $name"
      missed=1
    else
      first=$(grep -m1 -E "qlora CUDA harness|host harness cuDNN|= nan|out of tolerance|non-finite" "$log" || grep -m1 Failure "$log" || true)
      echo "CAUGHT  $name: ${first}"
    fi
  fi
  if [ "$tsan" = 1 ]; then
    cmake --build "$work/build" -j "$(nproc)" --target test_cuda_emu_tsan >/dev/null
    if QLORA_CUDA_TEST_SMALL=1 OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
        "$work/build/test_cuda_emu_tsan" --gtest_filter="$filter" >"$log.tsan" 2>&1; then
      echo "MISSED  $name (ThreadSanitizer)"
      missed=1
    else
      echo "CAUGHT  $name (ThreadSanitizer): $(grep -m1 -E "ThreadSanitizer: " "$log.tsan" || tail -1 "$log.tsan")"
    fi
  fi
  cp "$src/$file" "$work/tree/$file"
done
exit "$missed"
