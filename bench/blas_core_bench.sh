#!/usr/bin/env bash
# What the OpenBLAS kernel core costs a CPU training step (docs/cpu_backend.md, "One thread pool"):
# `qlora bench` on SmolLM2-135M (NF4 base, 2 x 256 tokens) with the core qlora chooses (auto) and
# with each core forced through OPENBLAS_CORETYPE, in one run on one machine. Writes one JSON file:
#   {"command", "git_sha", "cpu", "cases": [{"core", "blas", "tokens_per_second", "bench"}]}
#   bench/blas_core_bench.sh [OUT.json]   (default bench/results/cpu_blas_core.json)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/bench/results/cpu_blas_core.json}"
QLORA="${QLORA:-$ROOT/build/qlora}"
[ -x "$QLORA" ] || { echo "blas_core_bench: $QLORA not built (make build)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
args=(bench --model smollm2-135m --base-precision nf4 --seq-len 256 --micro-batch 2 --steps 4 --warmup-steps 1 --json)
for core in auto Prescott Haswell SkylakeX Cooperlake; do
  echo "blas_core_bench: core $core" >&2
  if [ "$core" = auto ]; then env -u OPENBLAS_CORETYPE "$QLORA" "${args[@]}" >"$tmp/$core.json"
  else OPENBLAS_CORETYPE=$core "$QLORA" "${args[@]}" >"$tmp/$core.json"; fi
done
python3 - "$tmp" "$OUT" "$(git -C "$ROOT" rev-parse HEAD)" "$QLORA ${args[*]}" <<'PY'
import json, os, sys
tmp, out, sha, command = sys.argv[1:5]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
cases = []
for core in ("auto", "Prescott", "Haswell", "SkylakeX", "Cooperlake"):
    b = json.load(open(os.path.join(tmp, core + ".json")))
    cases.append({"core": core, "blas": b["host"]["blas"], "tokens_per_second": b["tokens_per_second"], "bench": b})
json.dump({"command": command, "git_sha": sha, "cpu": cpu, "cases": cases}, open(out, "w"), indent=1)
for c in cases:
    print(f"{c['core']:>10}: {c['tokens_per_second']:8.1f} tokens/s  ({c['blas']})")
PY
