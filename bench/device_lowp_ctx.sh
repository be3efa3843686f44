#!/usr/bin/env bash
# Low-precision base GEMMs and the longest context, on the GPU machine, in one call:
#   gemm_fp8_vs_bf16   qlora bench on an fp8 base with --gemm-dtype fp8 (ours) and bf16 (peer: the
#                      same engine dequantizing to bf16); compute capability 8.9 or later
#   gemm_fp4_vs_bf16   the same on an nvfp4 base with --gemm-dtype fp4; compute capability 10.x
#   max_context_<ck>   for checkpointing none / full / offload: qlora plan --fit's longest sequence
#                      for this GPU (micro-batch 1), then one real training step at that length:
#                      does it run, and its peak device memory against the plan's
# A case the GPU cannot run is recorded as skipped with the reason, never as a result.
# Output: $OUT/lowp_ctx_results.json {device, driver, compute_capability, git_sha, command,
#   cases: [{name, config, ours, peer, status, message}]}; per-run files in build-device/lowp_ctx/.
#
#   bench/device_lowp_ctx.sh            on the GPU machine, from the repository root; needs
#                                       build-device/qlora (built here with device_run.sh's
#                                       QLORA_E2E=1 QLORA_E2E_ONLY=1 QLORA_E2E_NORUN=1 when missing)
#   bench/device_lowp_ctx.sh --dry-run  print the commands, run nothing
#
# Environment: OUT (default build-device/out), QLORA_BIN (default build-device/qlora),
# QLORA_LOWP_MODEL (GEMM cases, default llama3-8b), QLORA_CTX_MODEL (context cases, default
# llama3-8b), QLORA_LOWP_DEADLINE (seconds, default 540), QLORA_CTX_CASES (default none,full,offload).
# No network: the models are the presets' shapes with random weights (qlora bench).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/build-device/out}"
BIN="${QLORA_BIN:-$ROOT/build-device/qlora}"
WORK="$ROOT/build-device/lowp_ctx"
DEADLINE="${QLORA_LOWP_DEADLINE:-540}"
GEMM_MODEL="${QLORA_LOWP_MODEL:-llama3-8b}"
CTX_MODEL="${QLORA_CTX_MODEL:-llama3-8b}"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
mkdir -p "$OUT" "$WORK"
LOG="$OUT/lowp_ctx.log"
: >"$LOG"
log() { echo "[device_lowp_ctx $(date +%T) +${SECONDS}s] $*" | tee -a "$LOG" >&2; }

DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
CC="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)"
MEM_MIB="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)"
CC10="$(echo "${CC:-0}" | awk -F. '{print $1 * 10 + $2}')"
GIT_SHA="${QLORA_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
# The planner's catalog entry for this GPU (the matching of gpu_for_device_name in gpu_catalog.cpp).
case "${DEVICE:-}" in
  *H100*) GPU_KEY=h100-sxm ;;
  *H200*) GPU_KEY=h200 ;;
  *B200*) [ "${MEM_MIB:-0}" -lt 190000 ] && GPU_KEY=b200-180gb || GPU_KEY=b200 ;;
  *A100*) GPU_KEY=a100 ;;
  *) GPU_KEY="" ;;
esac
log "device ${DEVICE:-none} (compute capability ${CC:-?}, ${MEM_MIB:-?} MiB, catalog '${GPU_KEY:-none}') sha $GIT_SHA dry=$DRY"

if [ "$DRY" != 1 ] && [ ! -x "$BIN" ]; then
  log "no $BIN: building it (QLORA_E2E=1 QLORA_E2E_ONLY=1 QLORA_E2E_NORUN=1 bench/device_run.sh)"
  QLORA_E2E=1 QLORA_E2E_ONLY=1 QLORA_E2E_NORUN=1 OUT="$OUT" bash "$ROOT/bench/device_run.sh" >>"$LOG" 2>&1
fi

# run NAME LIMIT OUTFILE CMD...: stdout to OUTFILE, stderr to WORK/NAME.log; prints the rc.
run() {
  local name=$1 limit=$2 outf=$3
  shift 3
  if [ "$DRY" = 1 ]; then
    echo "  [$name, limit ${limit}s] $*" >&2
    echo dry
    return
  fi
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 20 ]; then
    log "skip $name: ${left}s left"
    echo skipped
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "run $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$outf" 2>"$WORK/$name.log"
  local rc=$?
  log "$name rc=$rc"
  echo "$rc"
}

CASES="$WORK/cases.jsonl"
: >"$CASES"
# case_line NAME STATUS MESSAGE CONFIG_JSON OURS_FILE PEER_FILE: one JSON line per case.
case_line() {
  python3 - "$@" >>"$CASES" <<'PY'
import json, os, sys
name, status, message, config, ours, peer = sys.argv[1:7]
def load(p):
    try: return json.load(open(p)) if p and os.path.exists(p) and os.path.getsize(p) else None
    except ValueError: return None
print(json.dumps({"name": name, "config": json.loads(config), "ours": load(ours), "peer": load(peer),
                  "status": status, "message": message}))
PY
}

# ---- FP8 / FP4 base GEMMs against bf16 GEMMs on the same base ---------------------------------
gemm_case() {  # NAME BASE GEMM MIN_CC MAX_CC WHY
  local name=$1 base=$2 gemm=$3 lo=$4 hi=$5 why=$6
  local cfg="{\"model\": \"$GEMM_MODEL\", \"method\": \"qlora\", \"base_precision\": \"$base\", \"gemm_dtype\": \"$gemm\", \"peer_gemm_dtype\": \"bf16\", \"seq_len\": 2048, \"micro_batch\": 1, \"gradient_checkpointing\": \"full\", \"steps\": 4, \"warmup_steps\": 1}"
  if [ "$DRY" != 1 ] && { [ "${CC10:-0}" -lt "$lo" ] || [ "${CC10:-0}" -gt "$hi" ]; }; then
    log "skip $name: compute capability ${CC:-?} ($why)"
    case_line "$name" skipped "compute capability ${CC:-unknown}: $why" "$cfg" "" ""
    return
  fi
  local common=(bench --model "$GEMM_MODEL" --method qlora --base-precision "$base" --seq-len 2048 --micro-batch 1
    --gradient-checkpointing full --steps 4 --warmup-steps 1 --device cuda --json)
  local r1 r2
  r1=$(run "$name.ours" 240 "$WORK/$name.ours.json" "$BIN" "${common[@]}" --gemm-dtype "$gemm")
  r2=$(run "$name.peer" 240 "$WORK/$name.peer.json" "$BIN" "${common[@]}" --gemm-dtype bf16)
  local status=ok
  { [ "$r1" != 0 ] || [ "$r2" != 0 ]; } && status="failed (ours rc $r1, peer rc $r2)"
  [ "$DRY" = 1 ] && status=dry-run
  case_line "$name" "$status" "ours: $gemm base GEMMs; peer: the same engine with bf16 GEMMs on the dequantized base" \
    "$cfg" "$WORK/$name.ours.json" "$WORK/$name.peer.json"
}
gemm_case gemm_fp8_vs_bf16 fp8 fp8 89 999 "FP8 GEMMs need 8.9 or later"
gemm_case gemm_fp4_vs_bf16 nvfp4 fp4 100 109 "the block-scaled FP4 GEMM runs on 10.x only"

# ---- the longest context: the plan's --fit answer against a real step at that length -----------
if [ -z "$GPU_KEY" ] && [ "$DRY" != 1 ]; then
  for ck in ${QLORA_CTX_CASES:-none full offload}; do
    case_line "max_context_$ck" skipped "no catalog entry for '${DEVICE:-none}': no plan to check" "{}" "" ""
  done
else
  fit="$WORK/fit.json"
  rc=$(run fit 120 "$fit" "$BIN" plan --model "$CTX_MODEL" --gpu "${GPU_KEY:-h100-sxm}" --method qlora --base-precision nf4 \
    --micro-batch 1 --fit --json)
  for ck in $(echo "${QLORA_CTX_CASES:-none,full,offload}" | tr ',' ' '); do
    name="max_context_$ck"
    T=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["max_seq_len_by_checkpointing"][sys.argv[2]])' "$fit" "$ck" 2>/dev/null || echo 0)
    [ "$DRY" = 1 ] && T=4096
    cfg="{\"model\": \"$CTX_MODEL\", \"method\": \"qlora\", \"base_precision\": \"nf4\", \"gradient_checkpointing\": \"$ck\", \"micro_batch\": 1, \"seq_len\": $T, \"planned_by\": \"qlora plan --fit --gpu ${GPU_KEY:-h100-sxm}\", \"steps\": 1, \"warmup_steps\": 0}"
    if [ "$T" = 0 ]; then
      case_line "$name" failed "qlora plan --fit gave no length (rc $rc, see $WORK/fit.log)" "$cfg" "" ""
      continue
    fi
    r=$(run "$name" 300 "$WORK/$name.json" "$BIN" bench --model "$CTX_MODEL" --method qlora --base-precision nf4 \
      --seq-len "$T" --micro-batch 1 --gradient-checkpointing "$ck" --steps 1 --warmup-steps 0 --device cuda --json)
    status=ok
    [ "$r" != 0 ] && status="failed (rc $r: 124 is the time limit; see $name.log for an out-of-memory error)"
    [ "$DRY" = 1 ] && status=dry-run
    case_line "$name" "$status" "ours: one step at the plan's longest length (peak_memory_bytes against planned_peak_memory_bytes); no peer" \
      "$cfg" "$WORK/$name.json" ""
  done
fi

python3 - "$OUT/lowp_ctx_results.json" "$CASES" "${DEVICE:-none}" "${DRIVER:-}" "${CC:-}" "$GIT_SHA" <<'PY'
import json, sys
out, cases, device, driver, cc, sha = sys.argv[1:7]
rows = [json.loads(l) for l in open(cases) if l.strip()]
json.dump({"device": device, "driver": driver, "compute_capability": cc, "git_sha": sha,
           "command": "bench/device_lowp_ctx.sh", "cases": rows}, open(out, "w"), indent=1)
for c in rows:
    o, p = c.get("ours") or {}, c.get("peer") or {}
    extra = ""
    if "tokens_per_second" in o and "tokens_per_second" in p and p["tokens_per_second"]:
        extra = "%.0f vs %.0f tok/s (x%.2f)" % (o["tokens_per_second"], p["tokens_per_second"], o["tokens_per_second"] / p["tokens_per_second"])
    elif "peak_memory_bytes" in o:
        extra = "peak %.2f GiB, planned %.2f GiB" % (o["peak_memory_bytes"] / 2**30, (o.get("planned_peak_memory_bytes") or 0) / 2**30)
    print("%-22s %-8s %s %s" % (c["name"], c["status"], extra, c["message"] if c["status"] != "ok" else ""))
PY
log "done in ${SECONDS}s: $OUT/lowp_ctx_results.json"
