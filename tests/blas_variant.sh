#!/usr/bin/env bash
# Runs a test command under the other choice of OpenBLAS kernels than the environment's (the CTest
# label blas-variants, docs/cpu_backend.md): with OPENBLAS_CORETYPE set (as the environment of
# some machines sets Haswell), without it, so that the native kernels run (OpenBLAS's pick, or the
# wider core qlora chooses from the CPU's features); with it unset, with the AVX2 kernels
# (OPENBLAS_CORETYPE=Haswell OPENBLAS_L2_SIZE=512, as those machines set), or the SSE3 ones
# (Prescott) on a CPU without AVX2 + FMA. The kernels run are printed first.
#   tests/blas_variant.sh COMMAND [ARGS...]
set -euo pipefail
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
  echo "blas_variant: the environment sets OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE; running with it unset" >&2
  exec env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE -u QLORA_BLAS_CORE_REPLACED "$@"
fi
core=Prescott
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then core=Haswell; fi
echo "blas_variant: OPENBLAS_CORETYPE is unset here; running with OPENBLAS_CORETYPE=$core OPENBLAS_L2_SIZE=512" >&2
exec env OPENBLAS_CORETYPE=$core OPENBLAS_L2_SIZE=512 "$@"
