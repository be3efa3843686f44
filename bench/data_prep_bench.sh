#!/usr/bin/env bash
# Data preparation on 1 and 2 threads (issue 31, item 1): `qlora data --json` on a generated set of
# 100k multi-turn chat rows (1-4 turns, a system prompt in 30%; words drawn with a fixed seed from
# the words list the set was built with) with SmolLM2-135M-Instruct's tokenizer and chat template
# (the demo's GGUF in .cache/qlora, `make real-models`), max_length 2048, packing on. Reading,
# templating, tokenizing and masking run in parallel; the ids are the same for any thread count
# (tests/text/test_dataset_parallel.cpp). Writes one JSON file:
#   {"command", "git_sha", "cpu", "rows", "cases": [{"threads", "prepare_seconds", "pack_seconds",
#    "rows_per_second", "tokens", "wall_seconds", "peak_rss_kb"}]}
#   bench/data_prep_bench.sh [OUT.json]   (default bench/results/data_prep.json)
# No Hugging Face peer runs here: the issue's datasets.map + TRL comparison is still to be added.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/bench/results/data_prep.json}"
QLORA="${QLORA:-$ROOT/build/qlora}"
MODEL="${QLORA_SMOLLM2_GGUF:-$ROOT/.cache/qlora/SmolLM2-135M-Instruct.Q4_1.gguf}"
ROWS="${ROWS:-100000}"
[ -x "$QLORA" ] || { echo "data_prep_bench: $QLORA not built (make build)" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "data_prep_bench: $MODEL missing (make real-models)" >&2; exit 1; }
command -v /usr/bin/time >/dev/null || { echo "data_prep_bench: needs /usr/bin/time (Debian package time)" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/chat.jsonl" "$ROWS" <<'PY'
import json, random, sys
path, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(1)
words = ("harbor river quick lazy fox dog alpha beta gamma delta coast eager define meaning word the a of to "
         "in is was for on with as by at from this that it be are or an not but have has which their more "
         "cafe naive tokyo zebra über über-fast 42 3.14 (parens) don't can't").split()
with open(path, "w") as f:
    for _ in range(n):
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"role": "system", "content": " ".join(rng.choices(words, k=8))})
        for _ in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(5, 40)))})
            msgs.append({"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(10, 80)))})
        f.write(json.dumps({"messages": msgs}) + "\n")
PY
cat >"$tmp/data.yaml" <<EOF
model_name_or_path: $MODEL
train_file: $tmp/chat.jsonl
output_dir: $tmp/out
max_length: 2048
packing: true
EOF
for t in 1 2; do
  echo "data_prep_bench: $t thread(s)" >&2
  OMP_NUM_THREADS=$t /usr/bin/time -f "%e %M" -o "$tmp/time.$t" "$QLORA" data "$tmp/data.yaml" --json >"$tmp/data.$t.json" 2>/dev/null
done
python3 - "$tmp" "$OUT" "$(git -C "$ROOT" rev-parse HEAD)" "$QLORA data CONFIG --json (OMP_NUM_THREADS=1, 2)" "$ROWS" <<'PY'
import json, os, sys
tmp, out, sha, command, rows = sys.argv[1:6]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
cases = []
for t in (1, 2):
    d = json.load(open(os.path.join(tmp, f"data.{t}.json")))
    wall, rss = open(os.path.join(tmp, f"time.{t}")).read().split()
    cases.append({"threads": d["threads"], "prepare_seconds": d["prepare_seconds"], "pack_seconds": d["pack_seconds"],
                  "rows_per_second": d["rows"] / d["prepare_seconds"], "tokens": d["tokens"], "rows": d["rows"],
                  "wall_seconds": float(wall), "peak_rss_kb": int(rss)})
assert cases[0]["tokens"] == cases[1]["tokens"]
json.dump({"command": command, "git_sha": sha, "cpu": cpu, "rows": int(rows), "cases": cases}, open(out, "w"), indent=1)
for c in cases:
    print(f"{c['threads']} thread(s): prepared in {c['prepare_seconds']:.2f} s ({c['rows_per_second']:.0f} rows/s), "
          f"packed in {c['pack_seconds']:.2f} s, wall {c['wall_seconds']:.1f} s, peak RSS {c['peak_rss_kb'] / 1024:.0f} MiB")
PY
