#!/usr/bin/env bash
# `make fuzz-smoke`: each fuzz target TARGET runs for SECONDS from its seeds (fuzz/seeds/TARGET) and
# kept findings (fuzz/regressions/TARGET), JOBS targets at a time (each one process on one core, so
# the executions per target are those of a serial run); the corpus of the run is build-fuzz/smoke/.
# A crash, sanitizer report, leak, timeout or out-of-memory leaves its input in
# build-fuzz/findings/TARGET/, prints the end of the log and makes the script exit 1 once all ran.
#   FUZZ_OPTS="..." fuzz/smoke.sh SECONDS JOBS TARGET...
set -u
seconds=$1 jobs=$2
shift 2
cd "$(dirname "$0")/.."

run_one() {
  local t=$1 log=build-fuzz/smoke_$1.log
  local regs=()
  [ -d "fuzz/regressions/$t" ] && regs=("fuzz/regressions/$t")
  mkdir -p "build-fuzz/smoke/$t" "build-fuzz/findings/$t"
  # shellcheck disable=SC2086  # FUZZ_OPTS is a list of options
  if "./build-fuzz/fuzz/fuzz_$t" ${FUZZ_OPTS:-} -max_total_time="$seconds" -print_final_stats=1 \
      -artifact_prefix="build-fuzz/findings/$t/" "build-fuzz/smoke/$t" "fuzz/seeds/$t" "${regs[@]}" >"$log" 2>&1; then
    echo "fuzz_$t: $(grep -o 'number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*') executions in $seconds s, no finding"
  else
    { tail -40 "$log"; echo "fuzz_$t found a problem: see $log"; } >&2
    touch "build-fuzz/smoke_$t.failed"
  fi
}

rm -f build-fuzz/smoke_*.failed
for t in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  run_one "$t" &
done
wait
! ls build-fuzz/smoke_*.failed >/dev/null 2>&1
