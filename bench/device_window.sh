#!/usr/bin/env bash
# The GPU window's one call (docs/bench.md, "The GPU window"): runs the prebuilt archive of
# bench/device_pack.sh in stages, in order of value, each writing its result file before the next
# starts, all inside a deadline taken from the call's timeout:
#   probe      machine, driver, versions, where every library of the binaries resolves, cuDNN on or
#              off, whether the binaries start (else: the fallback build on the device, said so)
#              -> probe.json
#   test_cuda  every CUDA op against the CPU reference on the device -> test_cuda.json (gtest)
#   e2e        one end-to-end QLoRA case (Llama-3-8B shapes, random NF4 weights, T=2048): tokens/s
#              and peak device memory, the planner's prediction, transformers + peft + bitsandbytes
#              in the same call -> e2e_results.json
#   kernels    bench_cuda_kernels against PyTorch (attention own/cuDNN vs SDPA, dequant vs copy
#              bandwidth, GEMM vs torch.matmul, ...) -> kernels.json
#   sanitizer  compute-sanitizer memcheck and racecheck on the own kernels, small shapes -> sanitizer.json
#   e2e_more   the other end-to-end cases while time remains -> e2e_results.json
# After every stage: cuda_results.json (device, driver, git_sha, command, stages, test_cuda, cases
# with ours and peer) and logs.tar.gz (every log so far) are rewritten, so a kill loses at most the
# stage in flight. Seven files at most in $OUT.
#
#   bench/device_window.sh --timeout-s N [--stages a,b] [--e2e-cases LIST]
#
# --timeout-s: the device call's timeout_s; the stages end 25 s before it. --stages: a comma list
# of the stages above (default all; probe always runs). --e2e-cases: device_e2e.sh case names or
# indexes for the e2e stage (default 1); e2e_more runs the rest.
# Environment: OUT (results, default build-window/out), QLORA_PACK (archive, default
# build-pack/qlora_device.tar.xz), QLORA_WINDOW_WORK (default /tmp/qlora-window),
# QLORA_WINDOW_NO_DEVICE=1 (act as on a machine without a GPU), QLORA_WINDOW_FAKE_DEVICE=S (no
# GPU: each device stage runs `sleep S` in place of its command, so the rehearsal sees the stages
# clipped by the deadline; tests/device_rehearsal/rehearse.sh).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
COMMAND="bench/device_window.sh $*"
TIMEOUT_S="" ONLY="" E2E_CASES=1
while [ $# -gt 0 ]; do
  case "$1" in
    --timeout-s) TIMEOUT_S="$2"; shift 2 ;;
    --stages) ONLY="$2"; shift 2 ;;
    --e2e-cases) E2E_CASES="$2"; shift 2 ;;
    *) echo "device_window: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ "$TIMEOUT_S" =~ ^[0-9]+$ ]] || { echo "device_window: --timeout-s N (the device call's timeout_s) is required" >&2; exit 2; }
DEADLINE=$((TIMEOUT_S - 25))
export QLORA_WINDOW_DEADLINE=$DEADLINE
OUT="${OUT:-$ROOT/build-window/out}"
PACK="${QLORA_PACK:-$ROOT/build-pack/qlora_device.tar.xz}"
WORK="${QLORA_WINDOW_WORK:-/tmp/qlora-window}"
LOGS="$WORK/logs"
rm -rf "$WORK"
mkdir -p "$OUT" "$LOGS"
: >"$WORK/stages.tsv"
RESULTS="python3 $ROOT/bench/window_results.py"

log() { echo "[window +${SECONDS}s] $*" | tee -a "$LOGS/window.log"; }
wanted() { [ -z "$ONLY" ] || [ "$1" = probe ] || [[ ",$ONLY," == *",$1,"* ]]; }
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >>"$WORK/stages.tsv"; }
# After each stage: the summary and the logs, so a kill keeps what was done.
publish() {
  $RESULTS summary "$OUT" "$WORK" "$COMMAND" >>"$LOGS/window.log" 2>&1
  tar -C "$WORK" -czf "$OUT/logs.tar.gz.tmp" logs 2>/dev/null && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}
# stage NAME LIMIT MIN CMD...: runs CMD under a timeout clipped to the deadline; skipped when fewer
# than MIN seconds are left. Records status (ok, failed, timeout, skipped) and seconds.
stage() {
  local name=$1 limit=$2 min=$3
  shift 3
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt "$min" ]; then
    log "skip $name: ${left}s left of the ${DEADLINE}s deadline, it needs ${min}s"
    record "$name" skipped "" 0 "deadline: ${left}s left, ${min}s needed"
    publish
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "run $name (limit ${limit}s)"
  local t0=$SECONDS rc status reason=""
  [ -n "$FAKE" ] && set -- sleep "$FAKE"
  timeout --kill-after=5 "$limit" "$@" >>"$LOGS/$name.log" 2>&1
  rc=$?
  status=ok
  [ $rc -ne 0 ] && status=failed && reason="exit $rc (logs.tar.gz: logs/$name.log)"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status=timeout && reason="stopped at its ${limit}s limit"
  record "$name" "$status" "$rc" "$((SECONDS - t0))" "$reason"
  log "$name: $status in $((SECONDS - t0))s"
  publish
  return $rc
}
no_device() {  # NAME: a device stage on a machine without a GPU
  record "$1" "no device" "" 0 "nvidia-smi lists no GPU"
  log "$1: no device"
  publish
}

# ---- probe -------------------------------------------------------------------------------------
DEVICE="" DRIVER="" FAKE="${QLORA_WINDOW_FAKE_DEVICE:-}"
if [ "${QLORA_WINDOW_NO_DEVICE:-0}" != 1 ] && [ -z "$FAKE" ]; then
  DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
fi
export QLORA_WINDOW_DEVICE="$DEVICE" QLORA_WINDOW_DRIVER="$DRIVER"
log "device '${DEVICE:-none}' driver '${DRIVER:-none}' deadline ${DEADLINE}s archive $PACK"
PKG="$WORK/qlora-device"
if ! tar -xJf "$PACK" -C "$WORK" 2>>"$LOGS/probe.log"; then
  record probe failed 1 "$SECONDS" "cannot unpack $PACK (carry build-pack, made by bench/device_pack.sh)"
  publish
  exit 1
fi
# Libraries: the archive's, the pip nvidia-* wheels of this Python, the toolkit of nvcc.
LIBDIRS="$PKG/lib"
PIPDIRS="$($RESULTS libdirs 2>>"$LOGS/probe.log")"
[ -n "$PIPDIRS" ] && LIBDIRS="$LIBDIRS:$PIPDIRS"
if command -v nvcc >/dev/null; then
  tk="$(dirname "$(readlink -f "$(command -v nvcc)")")/.."
  for d in "$tk/lib64" "$tk/lib" "$tk/targets/x86_64-linux/lib"; do
    [ -d "$d" ] && d="$(readlink -f "$d")" && [[ ":$LIBDIRS:" != *":$d:"* ]] && LIBDIRS="$LIBDIRS:$d"
  done
fi
export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
BIN="$PKG/bin"
loads() {  # do the binaries start? (test_cuda lists its tests, qlora prints its help)
  local q t
  "$BIN/qlora" --help >>"$LOGS/probe.log" 2>&1; q=$?
  "$BIN/test_cuda" --gtest_list_tests >>"$LOGS/probe.log" 2>&1; t=$?
  printf '{"qlora": %d, "test_cuda": %d}\n' "$q" "$t" >"$WORK/loads.json"
  [ $q -eq 0 ] && [ $t -eq 0 ]
}
if ! loads && [ -n "$DEVICE" ]; then
  # The fallback: build on the device (bench/device_run.sh --build-only), and say so.
  log "the prebuilt binaries do not start here: building on the device (bench/device_run.sh --build-only)"
  t0=$SECONDS
  QLORA_E2E=1 OUT="$WORK/fallback" QLORA_DEVICE_DEPS="$PKG/devdeps" timeout $((DEADLINE - SECONDS - 60 > 30 ? DEADLINE - SECONDS - 60 : 30)) \
    bash "$ROOT/bench/device_run.sh" --build-only >>"$LOGS/fallback_build.log" 2>&1
  rc=$?
  printf '{"reason": "the prebuilt binaries did not start (probe.json loads)", "rc": %d, "seconds": %d}\n' \
    "$rc" "$((SECONDS - t0))" >"$WORK/fallback.json"
  [ $rc -eq 0 ] && [ -x "$ROOT/build-device/test_cuda" ] && BIN="$ROOT/build-device" && export QLORA_WINDOW_BIN="$BIN" && loads
fi
$RESULTS probe "$OUT" "$WORK" "$PKG" >>"$LOGS/probe.log" 2>&1
probe_status=ok
python3 -c 'import json,sys; sys.exit(1 if json.load(open(sys.argv[1]))["problems"] else 0)' "$OUT/probe.json" 2>/dev/null ||
  probe_status=problems
record probe "$probe_status" 0 "$SECONDS" "$([ $probe_status = ok ] || echo 'see probe.json problems')"
grep -E '^probe' "$LOGS/probe.log" | tail -20
publish

# ---- test_cuda ---------------------------------------------------------------------------------
if wanted test_cuda; then
  if [ -z "$DEVICE$FAKE" ]; then no_device test_cuda
  else stage test_cuda 150 30 "$BIN/test_cuda" --gtest_output="json:$OUT/test_cuda.json"; fi
fi

# ---- one end-to-end case ------------------------------------------------------------------------
e2e() {  # CASES: device_e2e.sh with the time left; merged into e2e_results.json
  local cases=$1 name=$2
  if [ -z "$DEVICE$FAKE" ]; then no_device "$name"; return; fi
  mkdir -p "$WORK/$name"
  stage "$name" 600 90 env QLORA_BIN="$BIN/qlora" QLORA_WHEELS="$PKG/wheels" QLORA_E2E_CASES="$cases" \
    QLORA_E2E_DEADLINE=$((DEADLINE - SECONDS - 5)) OUT="$WORK/$name" bash "$ROOT/bench/device_e2e.sh"
  cp "$WORK/$name/e2e.log" "$LOGS/$name.cases.log" 2>/dev/null
  local parts=()
  for f in "$OUT/e2e_results.json" "$WORK/$name/e2e_results.json"; do [ -f "$f" ] && parts+=("$f"); done
  [ ${#parts[@]} -gt 0 ] && python3 tools/peers/combine_e2e.py --merge "${parts[@]}" --out "$OUT/e2e_results.json.new" \
    >>"$LOGS/$name.log" 2>&1 && mv "$OUT/e2e_results.json.new" "$OUT/e2e_results.json"
  publish
}
wanted e2e && e2e "$E2E_CASES" e2e

# ---- kernel benchmarks against PyTorch ----------------------------------------------------------
if wanted kernels; then
  if [ -z "$DEVICE$FAKE" ]; then no_device kernels
  else
    stage kernels 150 40 bash -c "'$BIN/bench_cuda_kernels' --quick >'$WORK/bench_ours.jsonl' &&
      cd '$ROOT/tools/peers' && for p in attention_peer gemm_peer ce_peer pointwise_peer; do
        PYTHONUNBUFFERED=1 python3 \$p.py '$WORK/bench_ours.jsonl' >>'$WORK/bench_peers.jsonl' || echo \"peer \$p failed\"; done"
    $RESULTS kernels "$OUT" "$WORK" >>"$LOGS/kernels.log" 2>&1
    publish
  fi
fi

# ---- compute-sanitizer on the own kernels ------------------------------------------------------
if wanted sanitizer; then
  if [ -z "$DEVICE$FAKE" ]; then no_device sanitizer
  else
    SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
    export QLORA_CUDA_TEST_SMALL=1 QLORA_ATTENTION_KERNEL=own
    stage sanitizer_memcheck 90 30 "$SAN" --tool memcheck --error-exitcode 9 --leak-check no \
      --log-file "$WORK/sanitizer_memcheck.log" "$BIN/test_cuda" --gtest_filter='CudaOps.*:CudaDequant.*'
    stage sanitizer_racecheck 90 30 "$SAN" --tool racecheck --racecheck-report analysis --error-exitcode 9 \
      --log-file "$WORK/sanitizer_racecheck.log" "$BIN/test_cuda" \
      --gtest_filter='CudaOps.attention*:CudaOps.cross_entropy*:CudaOps.rmsnorm*:CudaOps.sumsq*:CudaDequant.*'
    unset QLORA_CUDA_TEST_SMALL QLORA_ATTENTION_KERNEL
    cp "$WORK"/sanitizer_*.log "$LOGS/" 2>/dev/null
    $RESULTS sanitizer "$OUT" "$WORK" >>"$LOGS/window.log" 2>&1
    publish
  fi
fi

# ---- the other end-to-end cases while time remains ----------------------------------------------
wanted e2e_more && e2e "$(python3 -c 'import sys; c=sys.argv[1].split(","); print(",".join(str(i) for i in range(1, 5) if str(i) not in c))' "$E2E_CASES")" e2e_more

log "done in ${SECONDS}s of ${DEADLINE}s; results in $OUT"
python3 - "$OUT/cuda_results.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("device:", r.get("device"), "| driver:", r.get("driver"), "| cuDNN:", r.get("cudnn"), "| sha:", r.get("git_sha"))
for s in r["stages"]:
    print(f"  {s['name']:<20} {s['status']:<10} {s['seconds']:>4}s  {s['reason']}")
t = r.get("test_cuda") or {}
if t: print("test_cuda:", t.get("tests"), "tests,", t.get("failures"), "failures", ", ".join(t.get("failed", [])[:10]))
for c in r["cases"]:
    o, p = c.get("ours") or {}, c.get("peer") or {}
    key = next((k for k in ("tokens_per_second", "tflops", "gbps") if k in o), None)
    if key: print(f"  {c['name']:<40} ours {o.get(key)} peer {p.get(key) if p else None} {key}")
for p in r.get("problems", []): print("problem:", p)
PY
