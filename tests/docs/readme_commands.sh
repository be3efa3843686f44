#!/usr/bin/env bash
# Runs every command the README shows in its sh blocks, in order, as a newcomer would type them, in
# a scratch directory laid out like the repository (examples/, tests/, build/qlora). The README's
# own model (/models/Llama-3.2-1B-Instruct) is the tiny Llama fixture with a tokenizer
# (tests/fixtures/models/pref_tiny), my_run.yaml is the README's yaml block and data/train.jsonl
# the tiny example data; `qlora train my_run.yaml` runs 3 steps with a checkpoint at step 2, so
# resume_from_checkpoint=latest has one to continue from. A command must exit 0, or the status its
# comment names ("exit 3"). `mpirun` lines run with Open MPI's consent to run as root. Not run here:
# the Quickstart's `make demo` (it fetches the model) and `make test` (this suite).
#   tests/docs/readme_commands.sh QLORA_BINARY SOURCE_DIR
set -euo pipefail
qlora="$(realpath "$1")"
root="$(cd "$2" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
ln -s "$root/examples" examples
ln -s "$root/tests" tests
mkdir -p build data
ln -s "$qlora" build/qlora
cp "$root/examples/data/tiny_train.jsonl" data/train.jsonl
model=tests/fixtures/models/pref_tiny
readme="$root/README.md"

# The first yaml block is my_run.yaml.
awk '/^```yaml$/ { inside = 1; next } /^```/ { if (inside) exit } inside' "$readme" |
  sed "s|/models/Llama-3.2-1B-Instruct|$model|" >my_run.yaml
grep -q "^model_name_or_path: $model" my_run.yaml || { echo "readme_commands: no my_run.yaml block in README.md" >&2; exit 1; }

# Every line of the sh blocks, except the Quickstart's make lines.
mapfile -t commands < <(awk '/^```sh$/ { inside = 1; next } /^```/ { inside = 0 } inside && NF' "$readme" | grep -v '^make ')
[ "${#commands[@]}" -ge 15 ] || { echo "readme_commands: found only ${#commands[@]} commands in README.md" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
failed=0
for line in "${commands[@]}"; do
  want=0
  [[ "$line" =~ \(exit\ ([0-9]+)\) ]] && want="${BASH_REMATCH[1]}"
  cmd="${line//\/models\/Llama-3.2-1B-Instruct/$model}"
  cmd="${cmd%%#*}"  # the comment
  [[ "$cmd" =~ qlora\ train\ my_run\.yaml ]] && cmd="$cmd max_steps=3 save_steps=2"
  [[ "$cmd" =~ ^[a-z./] ]] || { echo "readme_commands: not a command: $line" >&2; failed=1; continue; }
  set +e
  out="$(bash -c "$cmd" 2>&1)"
  rc=$?
  set -e
  if [ "$rc" -eq "$want" ]; then
    echo "ok (exit $rc): $line"
  else
    echo "FAILED (exit $rc, expected $want): $line"
    echo "$out" | tail -20
    failed=1
  fi
done
exit "$failed"
