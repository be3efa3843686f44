#!/usr/bin/env bash
# One device call for the CUDA backend: build for sm_90a, run test_cuda, run it again under
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) on reduced shapes, run the kernel benchmarks and their
# PyTorch peers, and write the results as JSON to $OUT. Aims to finish in about 6 minutes.
#
#   bench/device_run.sh                 on the GPU machine, from the repository root
#   bench/device_run.sh --pack-deps     here: bundle OpenBLAS + GoogleTest (and, for the `qlora`
#                                       binary of the end-to-end run, nlohmann-json, CLI11,
#                                       yaml-cpp, PCRE2, utf8proc) into build-devdeps/ (carried to
#                                       the GPU machine, used only if it lacks them) and the cuDNN
#                                       frontend headers (cuDNN attention; or carry
#                                       .cache/qlora/cudnn-frontend-1.32.0 itself)
#
# Environment: OUT (results folder, default build-device/out), QLORA_GIT_SHA (when .git is absent),
# CUDA_ARCH (default 90a), JOBS, QLORA_SKIP_SANITIZER=1, QLORA_BENCH_QUICK=1,
# QLORA_FORCE_DEPS_BUNDLE=1 (use the carried bundle even where the system has the libraries),
# QLORA_DEVICE_BUILD (build folder, default build-device).
# End-to-end fine-tuning benchmark (bench/device_e2e.sh, docs/bench_e2e.md): QLORA_E2E=1 also
# builds build-device/qlora and runs device_e2e.sh with the time left; QLORA_E2E_ONLY=1 (implies
# QLORA_E2E=1) builds only qlora and skips the tests, sanitizers and kernel benchmarks;
# QLORA_E2E_NORUN=1 builds it without running the cases. QLORA_LOWP_CTX=1 (with QLORA_E2E=1) runs
# bench/device_lowp_ctx.sh: FP8/FP4 base GEMMs against bf16, the plan's longest context run for real.
# Outputs in $OUT: cuda_results.json ({device, driver, git_sha, command, steps, cases: [{name,
# config, ours, peer}]}), test_cuda.json (gtest), and build/test/sanitizer/bench logs.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1

# ---- --pack-deps: runs on the development machine (Debian), needs no GPU --------------------
if [ "${1:-}" = "--pack-deps" ]; then
  dest="${2:-$ROOT/build-devdeps}"
  stage="$(mktemp -d)"
  mkdir -p "$stage/include" "$stage/lib" "$dest"
  # Debian's OpenBLAS comes in a pthread and an OpenMP build (the Makefile installs the latter).
  variant=openblas-pthread
  [ -d /usr/include/x86_64-linux-gnu/$variant ] || variant=openblas-openmp
  inc=/usr/include/x86_64-linux-gnu/$variant
  lib=/usr/lib/x86_64-linux-gnu
  cp "$inc"/cblas.h "$inc"/openblas_config.h "$stage/include/" || exit 1
  cp -r /usr/include/gtest "$stage/include/" || exit 1
  cp "$(readlink -f $lib/$variant/libopenblas.so.0)" "$stage/lib/libopenblas.so.0" || exit 1
  ln -s libopenblas.so.0 "$stage/lib/libopenblas.so"
  cp "$(readlink -f $lib/libgfortran.so.5)" "$stage/lib/libgfortran.so.5" || exit 1
  cp "$(readlink -f $lib/libquadmath.so.0)" "$stage/lib/libquadmath.so.0" || exit 1
  cp $lib/libgtest.a $lib/libgtest_main.a "$stage/lib/" || exit 1
  # The qlora CLI (end-to-end benchmark): header-only nlohmann-json and CLI11, static yaml-cpp,
  # PCRE2 and utf8proc (static: nothing to find at run time).
  cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/yaml-cpp "$stage/include/" || exit 1
  cp /usr/include/pcre2.h /usr/include/utf8proc.h /usr/include/xxhash.h "$stage/include/" || exit 1
  # The cuDNN frontend headers (cuDNN fused attention), fetched by cmake into the cache.
  cfe="$ROOT/.cache/qlora/cudnn-frontend-1.32.0/include"
  if [ -f "$cfe/cudnn_frontend.h" ]; then cp -r "$cfe/." "$stage/include/" || exit 1
  else echo "warning: $cfe missing (configure the main build once); the bundle has no cuDNN frontend" >&2; fi
  cp $lib/libyaml-cpp.a $lib/libpcre2-8.a $lib/libutf8proc.a $lib/libxxhash.a "$stage/lib/" || exit 1
  # Open MPI's headers and shared libraries: qlora links MPI (src/dist/); a single process never
  # starts the MPI runtime, so the libraries need only load (no mpirun, no MCA plugins).
  mkdir -p "$stage/include/openmpi" "$stage/lib/mpi"
  cp /usr/lib/x86_64-linux-gnu/openmpi/include/*.h "$stage/include/openmpi/" || exit 1
  for so in libmpi.so.40 libopen-rte.so.40 libopen-pal.so.40 libhwloc.so.15 libevent_core-2.1.so.7 \
            libevent_pthreads-2.1.so.7; do
    cp "$(readlink -f $lib/$so)" "$stage/lib/mpi/$so" || exit 1
  done
  ln -s libmpi.so.40 "$stage/lib/mpi/libmpi.so"
  tar -cJf "$dest/qlora_devdeps.tar.xz" -C "$stage" include lib
  rm -rf "$stage"
  ls -l "$dest/qlora_devdeps.tar.xz"
  echo "carry 'build-devdeps' in the device call; device_run.sh unpacks it only if cblas.h or gtest (or, with QLORA_E2E=1, a qlora CLI library) is missing"
  exit 0
fi

# --build-only: configure and build (test_cuda, bench_cuda_kernels, and qlora with QLORA_E2E=1), run
# nothing: the fallback of bench/device_window.sh when the prebuilt binaries do not start.
# --configure-only: configure and stop (the rehearsal checks the configure with the image's cmake).
MODE=all
case "${1:-}" in --build-only) MODE=build ;; --configure-only) MODE=configure ;; esac
OUT="${OUT:-$ROOT/build-device/out}"
mkdir -p "$OUT"
ARCH="${CUDA_ARCH:-90a}"
JOBS="${JOBS:-$(nproc)}"
BUILD="${QLORA_DEVICE_BUILD:-$ROOT/build-device}"
E2E="${QLORA_E2E:-0}"
E2E_ONLY="${QLORA_E2E_ONLY:-0}"
[ "$E2E_ONLY" = 1 ] && E2E=1
STEPS="$OUT/.steps"
: >"$STEPS"
# Seconds; later steps are skipped past this. QLORA_DEVICE_DEADLINE follows the device call's
# timeout_s (leave 30 s for the JSON).
DEADLINE="${QLORA_DEVICE_DEADLINE:-540}"

log() { echo "[device_run $(date +%T) +${SECONDS}s] $*"; }
# step NAME TIMEOUT_S LOGFILE CMD...: runs with a timeout, records rc and seconds for the JSON.
step() {
  local name=$1 limit=$2 logf=$3
  shift 3
  if [ "$SECONDS" -ge "$DEADLINE" ]; then
    log "skip $name (past the ${DEADLINE}s budget)"
    echo "$name skipped 0" >>"$STEPS"
    return 124
  fi
  local left=$((DEADLINE + 30 - SECONDS))
  [ "$limit" -gt "$left" ] && limit=$left
  log "run $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >>"$logf" 2>&1
  local rc=$?
  echo "$name $rc $((SECONDS - t0))" >>"$STEPS"
  log "$name rc=$rc in $((SECONDS - t0))s"
  return $rc
}

# ---- facts about the machine -----------------------------------------------------------------
DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
GIT_SHA="${QLORA_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
if [ "$GIT_SHA" != unknown ] && [ -z "${QLORA_GIT_SHA:-}" ] && ! git diff --quiet HEAD 2>/dev/null; then GIT_SHA="$GIT_SHA+dirty"; fi
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
SANITIZER="$(command -v compute-sanitizer || echo "$(dirname "$NVCC")/compute-sanitizer")"
log "device: ${DEVICE:-none} driver ${DRIVER:-?} nvcc $("$NVCC" --version | tail -1) sha $GIT_SHA"
{
  nvidia-smi 2>&1 | head -20
  "$NVCC" --version
  cmake --version | head -1
  g++ --version | head -1
} >"$OUT/build.log" 2>&1

# ---- dependencies: OpenBLAS (cblas) and GoogleTest; the carried bundle fills in what is missing
have_deps() {
  printf '#include <cblas.h>\n#include <gtest/gtest.h>\nint main(){return 0;}\n' |
    g++ -std=c++20 -x c++ - -o /dev/null -lopenblas -lgtest -lpthread >/dev/null 2>&1
}
BLAS_INC="" BLAS_LIB="" GTEST_INC="" GTEST_LIBS=""
if [ "${QLORA_FORCE_DEPS_BUNDLE:-0}" = 1 ] || ! have_deps; then
  bundle="${QLORA_DEVICE_DEPS:-$ROOT/build-devdeps}/qlora_devdeps.tar.xz"
  if [ -f "$bundle" ]; then
    log "OpenBLAS/GoogleTest missing here: unpacking $bundle"
    mkdir -p /tmp/qdeps && tar -xJf "$bundle" -C /tmp/qdeps
    BLAS_INC=/tmp/qdeps/include BLAS_LIB=/tmp/qdeps/lib/libopenblas.so
    GTEST_INC=/tmp/qdeps/include GTEST_LIBS="/tmp/qdeps/lib/libgtest_main.a /tmp/qdeps/lib/libgtest.a"
    export LD_LIBRARY_PATH="/tmp/qdeps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    log "warning: cblas.h or gtest missing and no bundle at $bundle (make one with --pack-deps)"
  fi
fi

# The qlora CLI's libraries (only for QLORA_E2E=1): from the system, else from the carried bundle.
have_cli_deps() {
  printf '#include <nlohmann/json.hpp>\n#include <CLI/CLI.hpp>\n#include <yaml-cpp/yaml.h>\n#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n#include <utf8proc.h>\n#include <xxhash.h>\nint main(){YAML::Load("a: 1"); pcre2_code_free(nullptr); return utf8proc_version() && XXH64("", 0, 0) ? 0 : 1;}\n' |
    g++ -std=c++20 -x c++ - -o /dev/null -lyaml-cpp -lpcre2-8 -lutf8proc -lxxhash >/dev/null 2>&1
}
CLI_INC="" CLI_LIBS="yaml-cpp;pcre2-8;utf8proc;xxhash"
# MPI for src/dist/ (the qlora CLI links it): the system's, else the bundle's Open MPI libraries.
have_mpi() { command -v mpicxx >/dev/null 2>&1 || [ -f /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ]; }
MPI_INC="" MPI_LIB=""
if [ "$E2E" = 1 ] && { [ "${QLORA_FORCE_DEPS_BUNDLE:-0}" = 1 ] || ! have_cli_deps; }; then
  bundle="${QLORA_DEVICE_DEPS:-$ROOT/build-devdeps}/qlora_devdeps.tar.xz"
  [ -f /tmp/qdeps/lib/libyaml-cpp.a ] || { [ -f "$bundle" ] && mkdir -p /tmp/qdeps && tar -xJf "$bundle" -C /tmp/qdeps; }
  if [ -f /tmp/qdeps/lib/libyaml-cpp.a ]; then
    log "qlora CLI libraries missing here: using the bundle's (nlohmann-json, CLI11, yaml-cpp, PCRE2, utf8proc, xxHash)"
    CLI_INC=/tmp/qdeps/include
    CLI_LIBS="/tmp/qdeps/lib/libyaml-cpp.a;/tmp/qdeps/lib/libpcre2-8.a;/tmp/qdeps/lib/libutf8proc.a;/tmp/qdeps/lib/libxxhash.a"
  else
    log "warning: the qlora CLI's libraries are missing and $bundle lacks them (remake it with --pack-deps)"
  fi
fi
if [ "$E2E" = 1 ] && { [ "${QLORA_FORCE_DEPS_BUNDLE:-0}" = 1 ] || ! have_mpi; }; then
  bundle="${QLORA_DEVICE_DEPS:-$ROOT/build-devdeps}/qlora_devdeps.tar.xz"
  [ -f /tmp/qdeps/lib/mpi/libmpi.so ] || { [ -f "$bundle" ] && mkdir -p /tmp/qdeps && tar -xJf "$bundle" -C /tmp/qdeps; }
  if [ -f /tmp/qdeps/lib/mpi/libmpi.so ]; then
    log "MPI missing here: qlora links the bundle's Open MPI libraries (single process: the runtime never starts)"
    MPI_INC=/tmp/qdeps/include/openmpi MPI_LIB=/tmp/qdeps/lib/mpi/libmpi.so
    export LD_LIBRARY_PATH="/tmp/qdeps/lib/mpi${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    log "warning: MPI is missing and $bundle lacks it (remake it with --pack-deps); qlora will not link"
  fi
fi

# The cuDNN frontend headers for the cuDNN attention path: the configure-time cache (carried with
# the tree when .cache/qlora is carried) or the bundle; libcudnn from the toolkit, the system or
# the nvidia-cudnn wheel of the machine's Python. Without them the backend builds without cuDNN.
CFE_INC=""
[ -f "$ROOT/.cache/qlora/cudnn-frontend-1.32.0/include/cudnn_frontend.h" ] && CFE_INC="$ROOT/.cache/qlora/cudnn-frontend-1.32.0/include"
if [ -z "$CFE_INC" ]; then
  bundle="${QLORA_DEVICE_DEPS:-$ROOT/build-devdeps}/qlora_devdeps.tar.xz"
  [ -f /tmp/qdeps/include/cudnn_frontend.h ] || { [ -f "$bundle" ] && mkdir -p /tmp/qdeps && tar -xJf "$bundle" -C /tmp/qdeps; }
  [ -f /tmp/qdeps/include/cudnn_frontend.h ] && CFE_INC=/tmp/qdeps/include
fi
# The wheel's folder from the same lookup the GPU window uses (bench/window_results.py libdirs:
# nvidia.cudnn is a namespace package in the CUDA 13 wheels, with no __file__).
CUDNN_HINT="$(python3 "$ROOT/bench/window_results.py" libdirs 2>/dev/null | tr ':' '\n' | sed -n 's|/lib$||; /nvidia\/cudnn$/p' | head -1)"
log "cuDNN frontend headers: ${CFE_INC:-none}; cuDNN wheel: ${CUDNN_HINT:-none}"

# ---- build: a small CMake project over the repository's sources (only what test_cuda and the
# benchmark need: core, quant, cpu and cuda backends), so the GPU image needs no yaml-cpp, CLI11,
# PCRE2 or nlohmann-json. Flags follow the main CMakeLists.txt.
mkdir -p "$BUILD/src"
cat >"$BUILD/src/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.24)
# CMake < 3.26 has no C++20 flag for nvcc; newer versions overwrite these with their own.
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION -std=c++20)
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION -std=c++20)
project(qlora_device LANGUAGES C CXX)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(R "$ROOT")
add_compile_options(-Wall -Wextra -Wno-unused-parameter)
# OpenMP before CUDA is enabled: with CUDA enabled, CMake >= 3.31 also asks for OpenMP for CUDA.
find_package(OpenMP REQUIRED COMPONENTS CXX)
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 20)
find_package(CUDAToolkit REQUIRED)
file(GLOB core \${R}/src/core/*.cpp)
file(GLOB quant \${R}/src/quant/*.cpp)
file(GLOB cpu \${R}/src/backend/cpu/*.cpp)
file(GLOB cuda \${R}/src/backend/cuda/*.cu \${R}/src/backend/cuda/*.cpp)
file(GLOB tests \${R}/tests/cuda/*.cpp)
add_library(qlora_core STATIC \${core})
target_include_directories(qlora_core PUBLIC \${R}/src)
target_link_libraries(qlora_core PUBLIC OpenMP::OpenMP_CXX)
add_library(qlora_quant STATIC \${quant})
target_link_libraries(qlora_quant PUBLIC qlora_core)
add_library(qlora_backend_cpu STATIC \${cpu})
if("$BLAS_LIB" STREQUAL "")
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS REQUIRED)
  find_path(CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas openblas-pthread x86_64-linux-gnu/openblas-pthread REQUIRED)
  target_include_directories(qlora_backend_cpu PRIVATE \${CBLAS_INCLUDE_DIR})
  target_link_libraries(qlora_backend_cpu PUBLIC qlora_core \${BLAS_LIBRARIES})
else()
  target_include_directories(qlora_backend_cpu PRIVATE "$BLAS_INC")
  target_link_libraries(qlora_backend_cpu PUBLIC qlora_core "$BLAS_LIB")
endif()
add_library(qlora_backend_cuda STATIC \${cuda})
target_link_libraries(qlora_backend_cuda PUBLIC qlora_core CUDA::cudart CUDA::cublas CUDA::cublasLt)
target_compile_definitions(qlora_backend_cuda PUBLIC QLORA_HAVE_CUDA=1)
target_compile_definitions(qlora_backend_cuda PRIVATE QLORA_CUDA_ARCHS="sm_$ARCH")
target_compile_options(qlora_backend_cuda PRIVATE \$<\$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
find_library(CUDNN_LIB NAMES cudnn libcudnn.so.9 HINTS \${CUDAToolkit_LIBRARY_DIR} "$CUDNN_HINT/lib")
find_path(CUDNN_INC cudnn_graph.h HINTS \${CUDAToolkit_INCLUDE_DIRS} "$CUDNN_HINT/include")
if(CUDNN_LIB AND CUDNN_INC AND EXISTS "$CFE_INC/cudnn_frontend.h")
  target_include_directories(qlora_backend_cuda SYSTEM PUBLIC "$CFE_INC" \${CUDNN_INC})
  target_compile_definitions(qlora_backend_cuda PUBLIC QLORA_HAVE_CUDNN=1)
  target_link_libraries(qlora_backend_cuda PUBLIC \${CUDNN_LIB} CUDA::nvrtc)
  message(STATUS "cuDNN attention path: \${CUDNN_LIB}, frontend $CFE_INC")
else()
  message(WARNING "cuDNN attention path off (libcudnn \${CUDNN_LIB}, cudnn_graph.h \${CUDNN_INC}, frontend '$CFE_INC')")
endif()
add_executable(test_cuda \${tests})
target_compile_definitions(test_cuda PRIVATE QLORA_FIXTURES="\${R}/tests/fixtures" QLORA_SOURCE_DIR="\${R}" QLORA_BIN="")
target_link_libraries(test_cuda PRIVATE qlora_backend_cuda qlora_backend_cpu qlora_quant)
if("$GTEST_LIBS" STREQUAL "")
  find_package(GTest REQUIRED)
  target_link_libraries(test_cuda PRIVATE GTest::gtest GTest::gtest_main)
else()
  target_include_directories(test_cuda PRIVATE "$GTEST_INC")
  target_link_libraries(test_cuda PRIVATE $GTEST_LIBS pthread)
endif()
add_executable(bench_cuda_kernels \${R}/bench/kernels/bench_cuda_kernels.cpp)
target_link_libraries(bench_cuda_kernels PRIVATE qlora_backend_cuda qlora_quant CUDA::cudart)
EOF
if [ "$E2E" = 1 ]; then
  # The qlora binary for the end-to-end benchmark: every source area, linked as the main
  # CMakeLists.txt links them, with the CLI's libraries named directly (no find_package/pkg-config).
  cat >>"$BUILD/src/CMakeLists.txt" <<EOF
set(CLI_INC "$CLI_INC")
set(CLI_LIBS "$CLI_LIBS")
if(CLI_INC)
  target_include_directories(qlora_core PUBLIC \${CLI_INC})
endif()
list(GET CLI_LIBS 0 YAML_LIB)
list(GET CLI_LIBS 1 PCRE2_LIB)
list(GET CLI_LIBS 2 UTF8PROC_LIB)
list(GET CLI_LIBS 3 XXHASH_LIB)
foreach(area io text model plan train dist)
  file(GLOB srcs_\${area} \${R}/src/\${area}/*.cpp)
endforeach()
set(MPI_INC "$MPI_INC")
set(MPI_LIB "$MPI_LIB")
add_library(qlora_dist STATIC \${srcs_dist})
target_compile_definitions(qlora_dist PUBLIC OMPI_SKIP_MPICXX=1 MPICH_SKIP_MPICXX=1)
if(MPI_LIB)
  target_include_directories(qlora_dist PUBLIC \${MPI_INC})
  target_link_libraries(qlora_dist PUBLIC qlora_core \${MPI_LIB})
else()
  find_package(MPI REQUIRED COMPONENTS CXX)
  target_link_libraries(qlora_dist PUBLIC qlora_core MPI::MPI_CXX)
endif()
add_library(qlora_io STATIC \${srcs_io})
target_link_libraries(qlora_io PUBLIC qlora_core \${YAML_LIB} \${XXHASH_LIB})
add_library(qlora_text STATIC \${srcs_text})
target_link_libraries(qlora_text PUBLIC qlora_io \${PCRE2_LIB} \${UTF8PROC_LIB})
target_compile_definitions(qlora_text PRIVATE QLORA_HAVE_UTF8PROC=1)
add_library(qlora_model STATIC \${srcs_model})
target_link_libraries(qlora_model PUBLIC qlora_io qlora_quant qlora_backend_cpu qlora_dist)
add_library(qlora_plan STATIC \${srcs_plan})
target_link_libraries(qlora_plan PUBLIC qlora_model)
add_library(qlora_train STATIC \${srcs_train})
target_link_libraries(qlora_train PUBLIC qlora_model qlora_text qlora_plan qlora_dist)
file(GLOB cli \${R}/src/cli/*.cpp)
add_executable(qlora \${cli})
target_link_libraries(qlora PRIVATE qlora_train qlora_backend_cuda)
EOF
fi
GEN=""
command -v ninja >/dev/null && GEN="-G Ninja"
step configure 120 "$OUT/build.log" cmake -S "$BUILD/src" -B "$BUILD" $GEN -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_COMPILER="$NVCC"
[ "$MODE" = configure ] && exit $?
targets=(test_cuda bench_cuda_kernels)
[ "$E2E" = 1 ] && targets+=(qlora)
[ "$E2E_ONLY" = 1 ] && targets=(qlora)
# One target at a time: a link failure of one (qlora's MPI, say) leaves the others built.
BUILT=0
for t in "${targets[@]}"; do
  step "build_$t" 300 "$OUT/build.log" cmake --build "$BUILD" -j "$JOBS" --target "$t" || BUILT=1
done
[ "$MODE" = build ] && exit $BUILT
[ "$E2E_ONLY" != 1 ] && [ -x "$BUILD/test_cuda" ] && BUILT=0

# ---- tests -------------------------------------------------------------------------------------
if [ $BUILT -eq 0 ] && [ "$E2E_ONLY" != 1 ]; then
  step test_cuda 180 "$OUT/test_cuda.log" "$BUILD/test_cuda" --gtest_output="json:$OUT/test_cuda.json"
  if [ "${QLORA_SKIP_SANITIZER:-0}" != 1 ]; then
    export QLORA_CUDA_TEST_SMALL=1
    step memcheck 150 "$OUT/sanitizer.log" "$SANITIZER" --tool memcheck --error-exitcode 9 --leak-check no \
      "$BUILD/test_cuda" --gtest_filter='CudaOps.*:CudaDequant.*:CudaBackend.*'
    # racecheck watches shared memory: the kernels that use it (attention, the block reductions).
    step racecheck 150 "$OUT/sanitizer.log" "$SANITIZER" --tool racecheck --racecheck-report analysis --error-exitcode 9 \
      "$BUILD/test_cuda" --gtest_filter='CudaOps.attention*:CudaOps.cross_entropy*:CudaOps.rmsnorm*:CudaOps.sumsq*:CudaDequant.*'
    # synccheck: barriers in divergent code; initcheck: reads of device memory never written.
    step synccheck 150 "$OUT/sanitizer.log" "$SANITIZER" --tool synccheck --error-exitcode 9 \
      "$BUILD/test_cuda" --gtest_filter='CudaOps.attention*:CudaOps.cross_entropy*:CudaOps.rmsnorm*:CudaOps.sumsq*:CudaOps.rope*'
    step initcheck 150 "$OUT/sanitizer.log" "$SANITIZER" --tool initcheck --error-exitcode 9 \
      "$BUILD/test_cuda" --gtest_filter='CudaOps.*:CudaDequant.*'
    unset QLORA_CUDA_TEST_SMALL
  fi
  # ---- benchmarks and peers ----------------------------------------------------------------------
  quick=""
  [ "${QLORA_BENCH_QUICK:-0}" = 1 ] && quick="--quick"
  : >"$OUT/bench_ours.jsonl"
  step bench 150 "$OUT/bench.log" bash -c "'$BUILD/bench_cuda_kernels' $quick >'$OUT/bench_ours.jsonl'"
  : >"$OUT/bench_peers.jsonl"
  for p in attention_peer gemm_peer ce_peer pointwise_peer; do
    step "$p" 60 "$OUT/bench.log" bash -c "cd '$ROOT/tools/peers' && PYTHONUNBUFFERED=1 python3 $p.py '$OUT/bench_ours.jsonl' >>'$OUT/bench_peers.jsonl'"
  done
fi

# ---- end-to-end fine-tuning benchmark (bench/device_e2e.sh writes $OUT/e2e_results.json) -------
if [ "$E2E" = 1 ] && [ "${QLORA_E2E_NORUN:-0}" != 1 ]; then
  left=$((570 - SECONDS))
  log "end-to-end cases with ${left}s left"
  t0=$SECONDS
  QLORA_BIN="$BUILD/qlora" QLORA_E2E_DEADLINE=$left QLORA_GIT_SHA="$GIT_SHA" OUT="$OUT" bash "$ROOT/bench/device_e2e.sh"
  echo "e2e $? $((SECONDS - t0))" >>"$STEPS"
fi

# ---- FP8/FP4 base GEMMs against bf16 and the longest context (bench/device_lowp_ctx.sh writes
# $OUT/lowp_ctx_results.json): QLORA_LOWP_CTX=1 with QLORA_E2E=1 (it needs build-device/qlora);
# QLORA_E2E_ONLY=1 QLORA_E2E_NORUN=1 QLORA_LOWP_CTX=1 builds only qlora and runs only these cases.
if [ "${QLORA_LOWP_CTX:-0}" = 1 ] && [ -x "$BUILD/qlora" ]; then
  left=$((580 - SECONDS))
  log "low-precision GEMM and context cases with ${left}s left"
  t0=$SECONDS
  QLORA_BIN="$BUILD/qlora" QLORA_LOWP_DEADLINE=$left QLORA_GIT_SHA="$GIT_SHA" OUT="$OUT" bash "$ROOT/bench/device_lowp_ctx.sh"
  echo "lowp_ctx $? $((SECONDS - t0))" >>"$STEPS"
fi

# ---- several GPUs (bench/device_multi_gpu.sh writes $OUT/multi_gpu_results.json): mpirun -np
# <GPUs> qlora train, data parallel and fsdp, against 1 GPU; on 1 GPU the cases are recorded as skipped.
if [ "${QLORA_E2E_ONLY:-0}" != 1 ]; then
  t0=$SECONDS
  QLORA_MGPU_DEADLINE=$((590 - SECONDS)) QLORA_GIT_SHA="$GIT_SHA" OUT="$OUT" bash "$ROOT/bench/device_multi_gpu.sh"
  echo "multi_gpu $? $((SECONDS - t0))" >>"$STEPS"
fi

# ---- one JSON with everything ------------------------------------------------------------------
python3 - "$OUT" "$DEVICE" "$DRIVER" "$GIT_SHA" "bench/device_run.sh ${*:-}" <<'PY'
import json, os, sys
out, device, driver, sha, command = sys.argv[1:6]
def jsonl(path):
    rows = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                try: rows.append(json.loads(line))
                except ValueError: pass
    return rows
cases = {c["name"]: c for c in jsonl(os.path.join(out, "bench_ours.jsonl"))}
for p in jsonl(os.path.join(out, "bench_peers.jsonl")):
    c = cases.setdefault(p["name"], {"name": p["name"], "config": {}, "ours": {}})
    c["peer"] = p["peer"]
    if "peer_info" in p: c["peer_info"] = p["peer_info"]
steps = {}
for line in open(os.path.join(out, ".steps")):
    name, rc, secs = line.split()
    steps[name] = {"rc": rc if rc == "skipped" else int(rc), "seconds": int(secs)}
tests = {}
tj = os.path.join(out, "test_cuda.json")
if os.path.exists(tj):
    t = json.load(open(tj))
    tests = {k: t.get(k) for k in ("tests", "failures", "disabled", "errors", "time")}
    tests["failed"] = [f"{s['name']}.{c['name']}" for s in t.get("testsuites", []) for c in s.get("testsuite", [])
                       if c.get("failures")]
    tests["skipped"] = sum(1 for s in t.get("testsuites", []) for c in s.get("testsuite", [])
                           if c.get("result") == "SKIPPED")
res = {"device": device, "driver": driver, "git_sha": sha, "command": command, "steps": steps,
       "test_cuda": tests, "cases": list(cases.values())}
json.dump(res, open(os.path.join(out, "cuda_results.json"), "w"), indent=1)
print("\n%-30s %12s %12s %8s" % ("case", "ours", "peer", "ratio"))
for c in res["cases"]:
    key = "tflops" if "tflops" in c.get("ours", {}) else "gbps"
    o, p = c.get("ours", {}).get(key), c.get("peer", {}).get(key)
    r = f"{o / p:.2f}" if o and p else "-"
    unit = "TFLOP/s" if key == "tflops" else "GB/s"
    print("%-30s %12s %12s %8s %s" % (c["name"], f"{o:.1f}" if o else "-", f"{p:.1f}" if p else "-", r, unit))
print("\nsteps:", " ".join(f"{k}={v['rc']}({v['seconds']}s)" for k, v in steps.items()))
if tests: print("test_cuda:", tests.get("tests"), "tests,", tests.get("failures"), "failures,",
                tests.get("skipped"), "skipped", ("FAILED: " + ", ".join(tests["failed"])) if tests.get("failed") else "")
PY
rm -f "$OUT/.steps" "$OUT/bench_ours.jsonl" "$OUT/bench_peers.jsonl"  # merged into cuda_results.json
# Keep the logs inside what a device call brings back (16 MiB per file).
for f in "$OUT"/*.log; do
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 8000000 ] && tail -c 8000000 "$f" >"$f.tmp" && mv "$f.tmp" "$f"
done
log "done in ${SECONDS}s; results in $OUT/cuda_results.json"
