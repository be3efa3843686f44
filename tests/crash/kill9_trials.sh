#!/usr/bin/env bash
# Crash safety under SIGKILL: usage  kill9_trials.sh QLORA_BIN TRIALS [SEED]
#
# Each trial trains examples/tiny.yaml into a fresh output dir with a save every 1 or 2 steps
# (save_total_limit=3, so old checkpoints are deleted as well), SIGKILLs it, then checks:
#   - every checkpoint-N directory is whole: exactly the four files a save writes, safetensors
#     headers intact and file sizes equal to what the headers describe, JSON files complete with
#     the right global_step, and the engine itself loads it (a resume from it with max_steps=N);
#   - a leftover temporary checkpoint-N.tmp-* directory is never taken for a checkpoint, and the
#     next run removes it;
#   - resume_from_checkpoint=latest (a fresh run when no checkpoint exists) exits 0 and writes a
#     final adapter bit-identical to that of an uninterrupted run (CPU resume is exact).
# Half the trials kill at a random moment of the run; the other half wait a random time, then
# kill as soon as a save's temporary directory appears, so that many kills land inside a save.
# Needs bash, coreutils and the qlora binary only. Exits non-zero on any failure, and keeps the
# failing trial's directory.
set -u

if [ $# -lt 2 ]; then
  echo "usage: $0 QLORA_BIN TRIALS [SEED]" >&2
  exit 2
fi
QLORA=$(readlink -f "$1")
TRIALS=$2
SEED=${3:-$(( $(date +%s) % 100000 ))}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2  # tiny.yaml names its model and data relative to the repository root
[ -x "$QLORA" ] || { echo "kill9: $QLORA is not an executable" >&2; exit 2; }
RANDOM=$SEED

WORK=$(mktemp -d "${TMPDIR:-/tmp}/qlora-kill9.XXXXXX")
KEEP=0
trap '[ "$KEEP" = 1 ] || rm -rf "$WORK"' EXIT

STEPS=16
COMMON=(examples/tiny.yaml "max_steps=$STEPS" save_total_limit=3 logging_steps=1 eval_steps=8 threads=1 device=cpu)

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
fail() {
  echo "kill9: FAIL (seed $SEED, trial ${TRIAL:-0}): $*" >&2
  KEEP=1
  echo "kill9: files kept in $WORK" >&2
  exit 1
}

# safetensors_ok FILE: 8-byte little-endian header length, a JSON object header, and a file size
# of exactly 8 + header + the largest data offset. Prints the number of tensors.
safetensors_ok() {
  local f=$1 size n hdr end count
  [ -f "$f" ] || { echo "missing"; return 1; }
  size=$(stat -c %s "$f")
  [ "$size" -ge 8 ] || { echo "shorter than 8 bytes"; return 1; }
  n=$(od -An -t u8 -N8 "$f" | tr -d ' ')
  { [ "$n" -ge 2 ] && [ $((8 + n)) -le "$size" ]; } || { echo "header length $n does not fit in $size bytes"; return 1; }
  hdr=$(head -c $((8 + n)) "$f" | tail -c "$n")
  hdr=${hdr%"${hdr##*[! ]}"}  # the header is padded with spaces
  [[ $hdr == "{"*"}" ]] || { echo "header is not a JSON object"; return 1; }
  end=$(grep -o '"data_offsets":\[[0-9]*,[0-9]*\]' <<<"$hdr" | sed 's/.*,\([0-9]*\)\]/\1/' | sort -n | tail -1)
  count=$(grep -o '"data_offsets"' <<<"$hdr" | wc -l)
  [ -n "$end" ] || { echo "no tensors in the header"; return 1; }
  [ $((8 + n + end)) -eq "$size" ] || { echo "size $size, header says $((8 + n + end))"; return 1; }
  echo "$count"
}

# checkpoint_whole DIR N: the structural checks, then the engine loads it.
checkpoint_whole() {
  local d=$1 step=$2 files out
  files=$(cd "$d" && ls -A | tr '\n' ' ')
  [ "$files" = "adapter_config.json adapter_model.safetensors optimizer.safetensors trainer_state.json " ] ||
    { echo "$d holds [$files]"; return 1; }
  out=$(safetensors_ok "$d/adapter_model.safetensors") || { echo "$d/adapter_model.safetensors: $out"; return 1; }
  [ "$out" = "$N_ADAPTER" ] || { echo "$d/adapter_model.safetensors: $out tensors, expected $N_ADAPTER"; return 1; }
  out=$(safetensors_ok "$d/optimizer.safetensors") || { echo "$d/optimizer.safetensors: $out"; return 1; }
  [ "$out" = "$N_OPTIM" ] || { echo "$d/optimizer.safetensors: $out tensors, expected $N_OPTIM"; return 1; }
  grep -q '"peft_type": "LORA"' "$d/adapter_config.json" && [ "$(tail -c 2 "$d/adapter_config.json")" = "}" ] ||
    { echo "$d/adapter_config.json is not a whole adapter config"; return 1; }
  grep -q "\"global_step\": $step,\?\$" "$d/trainer_state.json" && [ "$(tail -c 1 "$d/trainer_state.json")" = "}" ] ||
    { echo "$d/trainer_state.json is not whole or not step $step"; return 1; }
  rm -rf "$WORK/verify"
  "$QLORA" train "${COMMON[@]}" "output_dir=$WORK/verify" "max_steps=$step" "resume_from_checkpoint=$d" \
    >"$WORK/verify.log" 2>&1 || { echo "the engine cannot resume from $d: $(tail -n 3 "$WORK/verify.log")"; return 1; }
}

# ---- one uninterrupted run: its duration spreads the kills, its adapter is the reference
REF=$WORK/reference
t0=$(now_ms)
"$QLORA" train "${COMMON[@]}" "output_dir=$REF" save_steps=1 >"$WORK/reference.log" 2>&1 ||
  fail "the uninterrupted run failed: $(tail -n 5 "$WORK/reference.log")"
RUN_MS=$(( $(now_ms) - t0 ))
[ -z "$(compgen -G "$REF/*.tmp-*")" ] || fail "the uninterrupted run left temporary outputs: $(compgen -G "$REF/*.tmp-*")"
N_ADAPTER=$(safetensors_ok "$REF/adapter_model.safetensors") || fail "reference adapter: $N_ADAPTER"
N_OPTIM=$(safetensors_ok "$REF/checkpoint-$((STEPS - 1))/optimizer.safetensors") || fail "reference optimizer state: $N_OPTIM"
echo "kill9: seed $SEED, $TRIALS trials; an uninterrupted run of $STEPS steps takes $RUN_MS ms"

in_save=0 in_rotation=0 finished=0 checked=0 cleaned=0
for ((TRIAL = 1; TRIAL <= TRIALS; TRIAL++)); do
  out=$WORK/t$TRIAL
  save_steps=$((1 + RANDOM % 2))
  delay=$(( (RANDOM * 32768 + RANDOM) % RUN_MS ))
  mode=random
  [ $((TRIAL % 2)) = 0 ] && mode=save && delay=$((delay * 3 / 4))
  "$QLORA" train "${COMMON[@]}" "output_dir=$out" "save_steps=$save_steps" >"$out.log" 2>&1 &
  pid=$!
  sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
  if [ $mode = save ]; then  # kill as a save's temporary directory appears (or when the run ends)
    while kill -0 $pid 2>/dev/null; do
      compgen -G "$out/checkpoint-*.tmp-*" >/dev/null && break
    done
  fi
  kill -KILL $pid 2>/dev/null
  wait $pid 2>/dev/null  # (no "Killed" job notice)
  rc=$?
  what="killed"
  if [ $rc = 0 ]; then
    what="finished before the kill"; finished=$((finished + 1))
  elif [ $rc != 137 ]; then
    fail "the run exited $rc, not by the kill: $(tail -n 5 "$out.log")"
  fi
  leftovers=$(compgen -G "$out/checkpoint-*.tmp-*" | tr '\n' ' ')
  if [[ $leftovers == *.tmp-rm* ]]; then
    in_save=$((in_save + 1)); in_rotation=$((in_rotation + 1)); what="$what inside a save, deleting an old checkpoint"
  elif [ -n "$leftovers" ]; then
    in_save=$((in_save + 1)); what="$what inside a save"
  fi

  # Every checkpoint is whole; temporary directories are not checkpoints.
  latest=0 n=0
  for d in "$out"/checkpoint-*; do
    [ -d "$d" ] || continue
    name=${d##*/}
    [[ $name =~ ^checkpoint-([0-9]+)$ ]] || continue
    step=${BASH_REMATCH[1]}
    msg=$(checkpoint_whole "$d" "$step") || fail "$name is not whole after the kill: $msg"
    n=$((n + 1)); checked=$((checked + 1))
    [ "$step" -gt "$latest" ] && latest=$step
  done

  # Resume from the latest checkpoint (or start afresh) and finish.
  resume=()
  [ $n -gt 0 ] && resume=(resume_from_checkpoint=latest)
  "$QLORA" train "${COMMON[@]}" "output_dir=$out" "save_steps=$save_steps" "${resume[@]}" >"$out.resume.log" 2>&1 ||
    fail "the run after the kill failed: $(tail -n 5 "$out.resume.log")"
  if [ $n -gt 0 ]; then
    grep -q "resumed from $out/checkpoint-$latest at step $latest" "$out.resume.log" ||
      fail "did not resume from checkpoint-$latest: $(grep -m1 resumed "$out.resume.log")"
  fi
  if [ -n "$leftovers" ]; then
    grep -q "unfinished output" "$out.resume.log" || fail "no note about the removed leftovers [$leftovers]"
    cleaned=$((cleaned + 1))
  fi
  left=$(compgen -G "$out/*.tmp-*")
  [ -z "$left" ] || fail "temporary outputs remain after the resumed run: $left"
  cmp -s "$out/adapter_model.safetensors" "$REF/adapter_model.safetensors" ||
    fail "the final adapter differs from the uninterrupted run's"
  cmp -s "$out/adapter/adapter_model.safetensors" "$REF/adapter_model.safetensors" ||
    fail "adapter/adapter_model.safetensors differs from the uninterrupted run's"
  echo "trial $TRIAL: save_steps=$save_steps, kill after $delay ms ($mode): $what; $n checkpoints whole;" \
       "$([ $n -gt 0 ] && echo "resumed from checkpoint-$latest" || echo "fresh run") completed"
  rm -rf "$out" "$out.log" "$out.resume.log"
done

echo "kill9: $TRIALS trials, $in_save kills landed inside a save ($in_rotation while deleting an old checkpoint," \
     "$finished runs finished first), $checked checkpoints checked: all checkpoints whole, all resumes completed" \
     "(leftover temporary dirs removed by the next run in $cleaned trials)"
