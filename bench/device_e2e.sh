#!/usr/bin/env bash
# End-to-end fine-tuning throughput on the GPU machine: for each case, `qlora bench` (ours),
# tools/peers/hf_peft_bench.py (transformers + peft + bitsandbytes, same settings) and `qlora plan`
# (the planner's prediction), assembled by tools/peers/combine_e2e.py into $OUT/e2e_results.json:
#   {device, driver, git_sha, command, cases: [{name, config, ours, peer, ratio, planned,
#    planner_error, status, runs}]}
#
#   bench/device_e2e.sh                 on the GPU machine, from the repository root; needs
#                                       build-device/qlora (QLORA_E2E=1 bench/device_run.sh builds it;
#                                       when it is missing this script builds it that way first)
#   bench/device_e2e.sh --pack-wheels   here: bitsandbytes wheel for the GPU image -> build-wheels/
#                                       (the image has torch, transformers and peft, not bitsandbytes)
#   bench/device_e2e.sh --dry-run       print the commands, run nothing (same as QLORA_E2E_DRY=1)
#
# Environment: OUT (results folder, default build-device/out), QLORA_BIN (default
# build-device/qlora), QLORA_E2E_CASES (comma list of case names or 1-based indexes; default all),
# QLORA_E2E_DEADLINE (seconds this script may use, default 560: a device call is 10 minutes),
# QLORA_E2E_DRY=1, QLORA_GIT_SHA, QLORA_WHEELS (default build-wheels), QLORA_E2E_SKIP_PEER=1,
# QLORA_E2E_SKIP_OURS=1.
# Outputs in $OUT: e2e_results.json and e2e.log (this script's log, then every run's stderr);
# per-run files stay in build-device/e2e/ (a device call brings back at most 8 files).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 1
BNB_VERSION=0.50.2  # ships libbitsandbytes_cuda130.so (the image: torch 2.11+cu130)
BNB_SHA256=55348a9a4a21bfd99cf8c7b32fe67b4030ae5c2a05738e03c1747f65fa6ec283  # its manylinux_2_24_x86_64 wheel
WHEELS="${QLORA_WHEELS:-$ROOT/build-wheels}"

# ---- --pack-wheels: runs here (any machine with pip and internet), needs no GPU --------------
if [ "${1:-}" = "--pack-wheels" ]; then
  dest="${2:-$WHEELS}"
  mkdir -p "$dest"
  rm -f "$dest"/bitsandbytes-*.whl
  PY="${PYTHON:-python3}"
  # By package name and pinned version through pip (the configured index or mirror applies), the
  # wheel sha256-checked before it is slimmed.
  . "$ROOT/tools/pypi_wheel.sh"
  pypi_wheel bitsandbytes "$BNB_VERSION" "$BNB_SHA256" "$dest/bitsandbytes-$BNB_VERSION-py3-none-manylinux_2_24_x86_64.whl" \
    -q --python-version 3.12 --implementation cp --platform manylinux_2_24_x86_64 || exit 1
  # The wheel carries a library per CUDA/ROCm/XPU version (43 MB); keep the CPU one and CUDA 13.x
  # (the image's torch is cu130), drop the rest and their RECORD lines: the carry limit is 64 MiB.
  "$PY" - "$dest"/bitsandbytes-*.whl <<'PY' || exit 1
import os, re, sys, zipfile
src = sys.argv[1]
keep = re.compile(r"libbitsandbytes_(cpu|cuda13\d)\.so$")
tmp = src + ".tmp"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        name = item.filename
        if name.endswith(".so") and not keep.search(name):
            continue
        data = zin.read(name)
        if name.endswith(".dist-info/RECORD"):
            lines = [l for l in data.decode().splitlines() if not (l.split(",")[0].endswith(".so") and not keep.search(l.split(",")[0]))]
            data = ("\n".join(lines) + "\n").encode()
        zout.writestr(item, data)
os.replace(tmp, src)
print("slimmed", os.path.basename(src), os.path.getsize(src) // 1024, "KiB")
PY
  ls -l "$dest"
  git check-ignore -q "$dest" 2>/dev/null || echo "warning: $dest is not ignored by git; add it to .git/info/exclude"
  echo "carry '$(realpath --relative-to="$ROOT" "$dest")' (and 'build-devdeps') in the device call"
  exit 0
fi
DRY="${QLORA_E2E_DRY:-0}"
[ "${1:-}" = "--dry-run" ] && DRY=1

OUT="${OUT:-$ROOT/build-device/out}"
BIN="${QLORA_BIN:-$ROOT/build-device/qlora}"
WORK="$ROOT/build-device/e2e"
SITE=/tmp/qlora-e2e-site
LOG="$OUT/e2e.log"
DEADLINE="${QLORA_E2E_DEADLINE:-560}"
RESERVE=20  # seconds kept for assembling the JSON
mkdir -p "$OUT" "$WORK"
rm -f "$WORK"/*
: >"$LOG"
log() { echo "[device_e2e $(date +%T) +${SECONDS}s] $*" | tee -a "$LOG"; }
show() { printf '%q ' "$@"; }

# ---- the cases: name model seq micro_batch steps warmup ours_limit peer_limit checkpointing
# Shared: QLoRA, NF4 + double quant, r 16, alpha 32, all-linear, seed 0. The offload case is ours
# only (peer_limit 0: the peer has no activation offload), at a context that full checkpointing
# also reaches on an H100, so the two rows of ours show what offload costs.
CASES=(
  "llama3-8b_seq2048_mb4 llama3-8b 2048 4 6 2 180 210 full"
  "llama3-8b_seq8192_mb1 llama3-8b 8192 1 6 2 180 210 full"
  "llama3-70b_seq4096_mb1 llama3-70b 4096 1 3 1 300 300 full"
  "llama3-8b_seq8192_mb1_offload llama3-8b 8192 1 6 2 180 0 offload"
)
COMMON_BENCH=(--method qlora --base-precision nf4 --double-quant --r 16 --lora-alpha 32 --target-modules all-linear
  --seed 0)
COMMON_PLAN=(--method qlora --base-precision nf4 --double-quant --lora-r 16 --targets all-linear)

selected() {  # selected INDEX NAME: in QLORA_E2E_CASES (names or 1-based indexes), or all when unset
  [ -z "${QLORA_E2E_CASES:-}" ] && return 0
  local s
  IFS=',' read -ra sel <<<"$QLORA_E2E_CASES"
  for s in "${sel[@]}"; do [ "$s" = "$1" ] || [ "$s" = "$2" ] && return 0; done
  return 1
}

# ---- facts about the machine -----------------------------------------------------------------
DEVICE="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
MEM_MIB="$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)"
GIT_SHA="${QLORA_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
if [ "$GIT_SHA" != unknown ] && [ -z "${QLORA_GIT_SHA:-}" ] && ! git diff --quiet HEAD 2>/dev/null; then GIT_SHA="$GIT_SHA+dirty"; fi
export QLORA_GIT_SHA="$GIT_SHA"
# The planner's catalog entry for this GPU (same matching as gpu_for_device_name in gpu_catalog.cpp).
GPU_KEY="$(cd tools/peers && python3 -c 'import sys, hf_peft_bench as h; print(h.gpu_for_device_name(sys.argv[1], int(float(sys.argv[2] or 0)) << 20) or "")' \
  "${DEVICE:-none}" "${MEM_MIB:-0}" 2>/dev/null)"
COMMAND="bench/device_e2e.sh${*:+ $*}${QLORA_E2E_CASES:+ (QLORA_E2E_CASES=$QLORA_E2E_CASES)}"
log "device: ${DEVICE:-none} (${MEM_MIB:-?} MiB, catalog '${GPU_KEY:-none}') driver ${DRIVER:-?} sha $GIT_SHA deadline ${DEADLINE}s dry=$DRY"

# ---- the qlora binary: built by device_run.sh (QLORA_E2E=1) into build-device/ -----------------
if [ "$DRY" != 1 ] && [ ! -x "$BIN" ] && [ "${QLORA_E2E_SKIP_OURS:-0}" != 1 ]; then
  log "no $BIN: building it (QLORA_E2E=1 QLORA_E2E_ONLY=1 QLORA_E2E_NORUN=1 bench/device_run.sh)"
  QLORA_E2E=1 QLORA_E2E_ONLY=1 QLORA_E2E_NORUN=1 OUT="$OUT" bash "$ROOT/bench/device_run.sh" >>"$LOG" 2>&1
  [ -x "$BIN" ] || log "build failed: the ours runs will be recorded as missing (see build.log)"
fi

# ---- bitsandbytes for the peer: from the carried wheel when the image lacks it ------------------
if [ "$DRY" != 1 ] && [ "${QLORA_E2E_SKIP_PEER:-0}" != 1 ]; then
  if python3 -c "import bitsandbytes" >/dev/null 2>&1; then
    log "bitsandbytes $(python3 -c 'import bitsandbytes as b; print(b.__version__)' 2>/dev/null) already installed"
  elif ls "$WHEELS"/bitsandbytes-*.whl >/dev/null 2>&1; then
    mkdir -p "$SITE"
    if ! python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/*.whl >>"$LOG" 2>&1; then
      log "pip install failed; unpacking the wheel instead"
      for w in "$WHEELS"/*.whl; do python3 -m zipfile -e "$w" "$SITE" >>"$LOG" 2>&1; done
    fi
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    log "bitsandbytes from $WHEELS: $(python3 -c 'import bitsandbytes as b, torch; print(b.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1)"
  else
    log "warning: bitsandbytes missing and no wheel in $WHEELS (bench/device_e2e.sh --pack-wheels here, carry it)"
  fi
fi

# run_one CASE WHAT LIMIT OUTFILE CMD...: runs with a timeout clamped to the deadline, stdout to
# OUTFILE, stderr to WORK/CASE.WHAT.log; appends "WHAT rc seconds" to WORK/CASE.runs.
run_one() {
  local c=$1 what=$2 limit=$3 outf=$4
  shift 4
  if [ "$DRY" = 1 ]; then
    echo "  [$what, limit ${limit}s] $(show "$@")> ${outf#"$ROOT"/}"
    echo "$what dry 0" >>"$WORK/$c.runs"
    return 0
  fi
  local left=$((DEADLINE - RESERVE - SECONDS))
  if [ "$left" -lt 30 ]; then
    log "skip $c/$what: ${left}s left of the ${DEADLINE}s budget"
    echo "$what skipped 0" >>"$WORK/$c.runs"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "run $c/$what (limit ${limit}s): $(show "$@")"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$outf" 2>"$WORK/$c.$what.log"
  local rc=$?
  echo "$what $rc $((SECONDS - t0))" >>"$WORK/$c.runs"
  log "$c/$what rc=$rc in $((SECONDS - t0))s"
  return $rc
}

names=()
i=0
for spec in "${CASES[@]}"; do
  i=$((i + 1))
  read -r name model seq mb steps warm t_ours t_peer ckpt <<<"$spec"
  selected "$i" "$name" || continue
  names+=("$name")
  : >"$WORK/$name.runs"
  printf '{"model": "%s", "method": "qlora", "base_precision": "nf4", "double_quant": true, "r": 16, "lora_alpha": 32, "target_modules": "all-linear", "seq_len": %s, "micro_batch": %s, "gradient_checkpointing": "%s", "steps": %s, "warmup_steps": %s, "seed": 0, "gpus": 1}\n' \
    "$model" "$seq" "$mb" "$ckpt" "$steps" "$warm" >"$WORK/$name.config.json"
  shape=(--model "$model" --seq-len "$seq" --micro-batch "$mb")
  [ "$DRY" = 1 ] && echo "case $i: $name"
  if [ -n "$GPU_KEY" ] || [ "$DRY" = 1 ]; then
    run_one "$name" plan 30 "$WORK/$name.plan.json" "$BIN" plan "${shape[@]}" --gpu "${GPU_KEY:-h100-sxm}" \
      "${COMMON_PLAN[@]}" --checkpointing "$ckpt" --json
  fi
  [ "${QLORA_E2E_SKIP_OURS:-0}" != 1 ] &&
    run_one "$name" ours "$t_ours" "$WORK/$name.ours.json" "$BIN" bench "${shape[@]}" "${COMMON_BENCH[@]}" \
      --gradient-checkpointing "$ckpt" --steps "$steps" --warmup-steps "$warm" --device cuda --json
  [ "$t_peer" -eq 0 ] && echo "peer skipped 0" >>"$WORK/$name.runs"  # no peer for this case
  [ "${QLORA_E2E_SKIP_PEER:-0}" != 1 ] && [ "$t_peer" -gt 0 ] &&
    run_one "$name" peer "$t_peer" "$WORK/$name.peer.json" env PYTHONUNBUFFERED=1 python3 tools/peers/hf_peft_bench.py \
      "${shape[@]}" "${COMMON_BENCH[@]}" --gradient-checkpointing "$ckpt" --steps "$steps" --warmup-steps "$warm" \
      --device cuda --json
done

# ---- one JSON with everything --------------------------------------------------------------------
for n in "${names[@]}"; do
  for f in "$WORK/$n".*.log; do
    [ -s "$f" ] && { echo "===== ${f##*/}"; tail -c 2000000 "$f"; } >>"$LOG"
  done
done
[ "$DRY" = 1 ] && echo "assemble: $(show python3 tools/peers/combine_e2e.py --work "${WORK#"$ROOT"/}" --cases "$(IFS=,; echo "${names[*]}")" --out "$OUT/e2e_results.json")"
python3 tools/peers/combine_e2e.py --work "$WORK" --cases "$(IFS=,; echo "${names[*]}")" --out "$OUT/e2e_results.json" \
  --device "${DEVICE:-}" --driver "${DRIVER:-}" --git-sha "$GIT_SHA" --command "$COMMAND" | tee -a "$LOG"
[ -f "$LOG" ] && [ "$(stat -c %s "$LOG")" -gt 8000000 ] && tail -c 8000000 "$LOG" >"$LOG.tmp" && mv "$LOG.tmp" "$LOG"
log "done in ${SECONDS}s; results in $OUT/e2e_results.json"
