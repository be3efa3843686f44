#!/usr/bin/env bash
# Several GPUs of one machine training together, on the GPU machine, in one call:
#   multi_gpu_dp_<N>    mpirun -np N qlora train on the tiny example (device cuda, sharding none:
#                       the LoRA gradients summed by NCCL in device memory)
#   multi_gpu_fsdp_<N>  the same with sharding fsdp (each layer's base gathered by NCCL into the
#                       device slot; ZeRO-1's gradient collectives over MPI)
# ours = N GPUs, peer = 1 GPU with the same global batch (gradient_accumulation_steps x N):
# {final_loss, max_loss_rel_diff (largest relative difference of the logged losses against the
# 1-GPU run), median_step_s (from each step's trained tokens / tokens per second), steps}.
# With fewer than 2 GPUs or without mpirun every case is recorded as skipped with the reason.
# Output: $OUT/multi_gpu_results.json {device, gpus, git_sha, command, cases: [{name, config,
#   ours, peer, status, message}]}; runs and logs in build-device/multi_gpu/.
#
#   bench/device_multi_gpu.sh            on the GPU machine, from the repository root
#   bench/device_multi_gpu.sh --dry-run  print the commands, run nothing
#
# Environment: OUT (default build-device/out), QLORA_MGPU_BIN (a qlora built with MPI and NCCL;
# default: built here into build-device/multi_gpu/build with the main CMakeLists.txt, which needs
# MPI, yaml-cpp, CLI11, nlohmann-json on the machine), QLORA_MGPU_DEADLINE (seconds, default 300),
# CUDA_ARCH (default 90a).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
OUT="${OUT:-$ROOT/build-device/out}"
WORK="$ROOT/build-device/multi_gpu"
DEADLINE="${QLORA_MGPU_DEADLINE:-300}"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
mkdir -p "$OUT" "$WORK"
LOG="$OUT/multi_gpu.log"
: >"$LOG"
log() { echo "[device_multi_gpu $(date +%T) +${SECONDS}s] $*" | tee -a "$LOG" >&2; }

NGPU="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')"
DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
GIT_SHA="${QLORA_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
MPIRUN="$(command -v mpirun || true)"
log "device ${DEVICE:-none} x ${NGPU} GPUs, mpirun ${MPIRUN:-none}, sha $GIT_SHA dry=$DRY"
COMMON="device=cuda logging_steps=1 max_steps=8 eval_steps=0 save_steps=0 per_device_train_batch_size=4 max_length=128"
MPIENV=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none)

CASES="$WORK/cases.jsonl"
: >"$CASES"
# case_line NAME STATUS MESSAGE CONFIG_JSON OURS_DIR PEER_DIR: one JSON line per case, the numbers
# read from the runs' metrics.jsonl.
case_line() {
  python3 - "$@" >>"$CASES" <<'PY'
import json, os, statistics, sys
name, status, message, config, ours, peer = sys.argv[1:7]
def run(d):
    p = os.path.join(d, "metrics.jsonl") if d else ""
    if not p or not os.path.exists(p): return None
    rows = [json.loads(l) for l in open(p) if l.strip().startswith("{")]
    steps = [r for r in rows if isinstance(r.get("loss"), (int, float))]
    times = [r["trained_tokens"] / r["tokens_per_second"] for r in steps[1:] if r.get("tokens_per_second")]
    return {"steps": len(steps), "losses": [r["loss"] for r in steps],
            "final_loss": steps[-1]["loss"] if steps else None,
            "median_step_s": statistics.median(times) if times else None}
o, p = run(ours), run(peer)
if o and p and o["losses"] and len(o["losses"]) == len(p["losses"]):
    o["max_loss_rel_diff"] = max(abs(a - b) / max(abs(a), abs(b)) for a, b in zip(o["losses"], p["losses"]))
print(json.dumps({"name": name, "config": json.loads(config), "ours": o, "peer": p, "status": status, "message": message}))
PY
}

skip_all() {  # REASON
  for mode in dp fsdp; do
    case_line "multi_gpu_${mode}" skipped "$1" "{\"sharding\": \"$([ $mode = dp ] && echo none || echo fsdp)\"}" "" ""
  done
}

if [ "$DRY" != 1 ] && [ "${NGPU:-0}" -lt 2 ]; then
  log "skip: ${NGPU:-0} GPU(s) visible"
  skip_all "${NGPU:-0} GPU visible (nvidia-smi -L); the multi-GPU cases need 2 or more"
elif [ "$DRY" != 1 ] && [ -z "$MPIRUN" ]; then
  log "skip: no mpirun"
  skip_all "no mpirun on this machine"
else
  BIN="${QLORA_MGPU_BIN:-}"
  if [ -z "$BIN" ]; then
    BIN="$WORK/build/qlora"
    if [ "$DRY" = 1 ]; then
      echo "  cmake -S $ROOT -B $WORK/build -DQLORA_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90a} && cmake --build $WORK/build --target qlora" >&2
    else
      log "building qlora with MPI and NCCL into $WORK/build"
      { timeout 240 cmake -S "$ROOT" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DQLORA_TESTS=OFF \
          -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}" &&
        timeout 300 cmake --build "$WORK/build" -j "$(nproc)" --target qlora; } >"$WORK/build.log" 2>&1
    fi
  fi
  if [ "$DRY" != 1 ] && [ ! -x "$BIN" ]; then
    log "no qlora binary (see $WORK/build.log)"
    skip_all "not run: qlora with MPI and NCCL did not build here (build-device/multi_gpu/build.log)"
  else
    # run NAME NP DIR ARGS...: one training run (NP 0: a plain process on GPU 0); prints the rc.
    run() {
      local name=$1 np=$2 dir=$3
      shift 3
      local cmd=("$BIN" train "$ROOT/examples/tiny.yaml" $COMMON output_dir="$dir" "$@")
      [ "$np" -gt 0 ] && cmd=("${MPIENV[@]}" "$MPIRUN" -np "$np" "${cmd[@]}")
      [ "$np" -eq 0 ] && cmd=(env CUDA_VISIBLE_DEVICES=0 "${cmd[@]}")
      if [ "$DRY" = 1 ]; then echo "  [$name] ${cmd[*]}" >&2; echo dry; return; fi
      local left=$((DEADLINE - SECONDS))
      if [ "$left" -lt 20 ]; then log "skip $name: ${left}s left"; echo skipped; return; fi
      rm -rf "$dir"
      log "run $name: ${cmd[*]}"
      timeout --kill-after=10 "$left" "${cmd[@]}" >"$WORK/$name.log" 2>&1
      local rc=$?
      log "$name rc=$rc"
      echo "$rc"
    }
    n="${NGPU:-2}"
    [ "$n" -lt 2 ] && n=2
    for mode in dp fsdp; do
      sharding=none
      [ "$mode" = fsdp ] && sharding=fsdp
      r1=$(run "${mode}_1gpu" 0 "$WORK/${mode}_1gpu" gradient_accumulation_steps="$n")
      rn=$(run "${mode}_${n}gpu" "$n" "$WORK/${mode}_${n}gpu" gradient_accumulation_steps=1 sharding="$sharding")
      status=ok
      { [ "$r1" != 0 ] || [ "$rn" != 0 ]; } && status="failed (${n} GPUs rc $rn, 1 GPU rc $r1)"
      [ "$DRY" = 1 ] && status=dry-run
      case_line "multi_gpu_${mode}_${n}" "$status" \
        "ours: mpirun -np $n, sharding $sharding, 1 micro-batch per rank; peer: 1 GPU, $n micro-batches per step (same global batch)" \
        "{\"model\": \"tests/fixtures/models/tiny_byte\", \"gpus\": $n, \"sharding\": \"$sharding\", \"per_device_train_batch_size\": 4, \"max_length\": 128, \"steps\": 8}" \
        "$WORK/${mode}_${n}gpu" "$WORK/${mode}_1gpu"
    done
  fi
fi

python3 - "$OUT" "$CASES" "${DEVICE:-none}" "${NGPU:-0}" "$GIT_SHA" "bench/device_multi_gpu.sh ${*:-}" <<'PY'
import json, os, sys
out, cases, device, ngpu, sha, command = sys.argv[1:7]
rows = [json.loads(l) for l in open(cases) if l.strip()]
json.dump({"device": device, "gpus": int(ngpu), "git_sha": sha, "command": command, "cases": rows},
          open(os.path.join(out, "multi_gpu_results.json"), "w"), indent=1)
for r in rows:
    o = r.get("ours") or {}
    print("%-22s %-10s loss rel diff %s, step %s s (1 GPU %s s)" % (r["name"], r["status"][:10], o.get("max_loss_rel_diff"),
          o.get("median_step_s"), (r.get("peer") or {}).get("median_step_s")))
PY
