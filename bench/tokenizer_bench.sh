#!/usr/bin/env bash
# Tokenizer encode throughput, ours vs Hugging Face `tokenizers`, CPU, single thread.
# Builds bench_tokenizer if needed, writes the English prose corpus (Debian fortunes + licence
# texts, not committed), runs bench/tokenizer/bench_tokenizer and tools/peers/tokenizer_bench.py
# on every (tokenizer, corpus) pair, checks that both produce the same ids (hash of all ids), and
# writes bench/results/tokenizer_encode_<host>.json ({device, driver, git_sha, command, cases}).
# Each pair gives two cases: <tok>/<corpus>/warm (passes back to back, per-word BPE caches kept on
# both sides) and .../cold (caches emptied before each pass: a corpus encoded once).
#
#   bench/tokenizer_bench.sh [--quick]      (--quick: 0.5 s rounds, 1 round; a smoke run)
#
# Environment: BUILD (build dir, default build-bench-tok; configured with -DQLORA_CUDA=OFF when it
# has no CMakeCache.txt), PYTHON (default /opt/fixenv/bin/python, needs `tokenizers`),
# MIN_SECONDS (per round, default 2), ROUNDS (default 3, best reported), OUT_JSON, JOBS.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

BUILD_SET="${BUILD:+1}"
BUILD="${BUILD:-$ROOT/build-bench-tok}"
PYTHON="${PYTHON:-/opt/fixenv/bin/python}"
MIN_SECONDS="${MIN_SECONDS:-2}"
ROUNDS="${ROUNDS:-3}"
JOBS="${JOBS:-2}"
if [ "${1:-}" = "--quick" ]; then MIN_SECONDS=0.5; ROUNDS=1; fi
HOST="$(hostname -s 2>/dev/null || echo host)"
HOST="${HOST//[^A-Za-z0-9_-]/_}"
OUT_JSON="${OUT_JSON:-$ROOT/bench/results/tokenizer_encode_${HOST}.json}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

log() { echo "[tokenizer_bench $(date +%T)] $*" >&2; }

# ---- build ------------------------------------------------------------------------------------
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  log "configuring $BUILD"
  cmake -S "$ROOT" -B "$BUILD" -DQLORA_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$WORK/cmake.log" 2>&1 ||
    { cat "$WORK/cmake.log" >&2; exit 1; }
fi
log "building bench_tokenizer"
cmake --build "$BUILD" -j"$JOBS" --target bench_tokenizer >"$WORK/build.log" 2>&1 ||
  { tail -50 "$WORK/build.log" >&2; exit 1; }
BENCH="$BUILD/bench_tokenizer"

# ---- corpora ----------------------------------------------------------------------------------
# prose_en: every fortune of the Debian fortune packages (art and ascii-art left out) and every
# paragraph of /usr/share/common-licenses, one per line with whitespace runs collapsed.
PROSE="$WORK/prose_en.txt"
"$PYTHON" - "$PROSE" <<'PY'
import glob, os, re, sys
docs = []
d = "/usr/share/games/fortunes"
for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
    p = os.path.join(d, f)
    if "." in f or f in ("art", "ascii-art") or os.path.islink(p) or not os.path.isfile(p):
        continue
    for e in open(p, encoding="utf-8", errors="replace").read().split("\n%\n"):
        e = " ".join(e.split())
        if e and e != "%":
            docs.append(e)
for p in sorted(glob.glob("/usr/share/common-licenses/*")):
    if os.path.islink(p) or not os.path.isfile(p):
        continue
    for para in re.split(r"\n\s*\n", open(p, encoding="utf-8", errors="replace").read()):
        para = " ".join(para.split())
        if para:
            docs.append(para)
if sum(len(x) for x in docs) < 500_000:
    sys.exit("prose corpus: too little text found (install fortunes or fortunes-min)")
open(sys.argv[1], "w", encoding="utf-8").write("\n".join(docs) + "\n")
PY
CORPORA=("parity_mixed:tests/fixtures/text/corpus.json" "prose_en:$PROSE")
TOKENIZERS=(smollm2 bytelevel_llama3 spm_llama2)

# ---- run --------------------------------------------------------------------------------------
log "load: $(uptime | sed 's/.*load average/load average/')"
: >"$WORK/ours.jsonl"
: >"$WORK/peer.jsonl"
status=0
for tk in "${TOKENIZERS[@]}"; do
  for c in "${CORPORA[@]}"; do
    cname="${c%%:*}"
    cpath="${c#*:}"
    name="$tk/$cname"
    tpath="tests/fixtures/text/tok/$tk"
    log "$name: ours"
    "$BENCH" --tokenizer "$tpath" --corpus "$cpath" --min-seconds "$MIN_SECONDS" --rounds "$ROUNDS" \
      --name "$name" >"$WORK/o.json"
    cat "$WORK/o.json" >>"$WORK/ours.jsonl"
    read -r hash tokens < <("$PYTHON" -c 'import json,sys; o=json.load(open(sys.argv[1])); print(o["ids_hash"], o["tokens"])' "$WORK/o.json")
    log "$name: tokenizers"
    if ! RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false "$PYTHON" tools/peers/tokenizer_bench.py \
      --tokenizer "$tpath" --corpus "$cpath" --min-seconds "$MIN_SECONDS" --rounds "$ROUNDS" \
      --name "$name" --expect-hash "$hash" --expect-tokens "$tokens" >>"$WORK/peer.jsonl"; then
      log "$name: IDS DIFFER"
      status=1
    fi
  done
done

# ---- one JSON ---------------------------------------------------------------------------------
DEVICE="$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), 1 thread (of $(nproc) CPUs)"
COMMAND="bench/tokenizer_bench.sh${1:+ $*}"
if [ -n "${BUILD_SET:-}" ]; then COMMAND="BUILD=$BUILD $COMMAND"; fi
GIT_SHA="$(git rev-parse HEAD 2>/dev/null || echo "${QLORA_GIT_SHA:-unknown}")"
if [ -n "$(git status --porcelain -- src/text bench/tokenizer 2>/dev/null)" ]; then GIT_SHA="$GIT_SHA+dirty"; fi
mkdir -p "$(dirname "$OUT_JSON")"
"$PYTHON" - "$WORK" "$OUT_JSON" "$DEVICE" "$GIT_SHA" "$COMMAND" "$MIN_SECONDS" "$ROUNDS" <<'PY'
import json, sys, time
work, out_json, device, sha, command, min_s, rounds = sys.argv[1:8]
ours = [json.loads(l) for l in open(f"{work}/ours.jsonl") if l.strip()]
peer = {p["name"]: p for p in (json.loads(l) for l in open(f"{work}/peer.jsonl") if l.strip())}
cases = []
timing = f"best of {rounds} rounds of >= {min_s} s after one warm-up pass"
for o in ours:
    p = peer.get(o["name"], {})
    tk, corpus = o["name"].split("/")
    config = {"tokenizer": o["tokenizer"], "corpus": corpus if corpus != "parity_mixed" else o["corpus"],
              "bytes": o["bytes"], "lines": o["lines"], "tokens": o["tokens"],
              "add_special_tokens": False, "threads": 1}
    # warm: passes back to back, per-word caches kept; cold: caches emptied (untimed) before
    # each pass, i.e. a corpus encoded once.
    for mode in ("warm", "cold"):
        om = o if mode == "warm" else o["cold"]
        case = {"name": f"{o['name']}/{mode}",
                "config": dict(config, cache=mode, timing=timing),
                "ours": {"tokens_per_second": om["tokens_per_second"], "bytes_per_second": om["bytes_per_second"],
                         "ids_hash": o["ids_hash"],
                         "rounds_bytes_per_second": [round(r["bytes_per_second"]) for r in om["rounds"]]}}
        if p:
            pm = p if mode == "warm" else p["cold"]
            case["peer"] = {"name": p["peer"], "call": "Tokenizer.encode(line, add_special_tokens=False)",
                            "tokens_per_second": pm["tokens_per_second"], "bytes_per_second": pm["bytes_per_second"],
                            "ids_hash": p["ids_hash"], "ids_match": p["ids_match"],
                            "rounds_bytes_per_second": [round(r["bytes_per_second"]) for r in pm["rounds"]]}
            case["ratio"] = om["bytes_per_second"] / pm["bytes_per_second"]
            if mode == "warm" and "encode_batch" in p:
                case["peer_encode_batch"] = {"name": p["peer"],
                                             "call": "encode_batch(lines, add_special_tokens=False), RAYON_NUM_THREADS=1",
                                             "tokens_per_second": p["encode_batch"]["tokens_per_second"],
                                             "bytes_per_second": p["encode_batch"]["bytes_per_second"]}
                case["ratio_vs_encode_batch"] = om["bytes_per_second"] / p["encode_batch"]["bytes_per_second"]
        cases.append(case)
res = {"device": device, "driver": "n/a (CPU)", "git_sha": sha, "command": command,
       "date": time.strftime("%Y-%m-%d %H:%M %Z"), "cases": cases}
json.dump(res, open(out_json, "w"), indent=1)
print("%-36s %10s %10s %10s %7s %7s %9s" % ("case (MB/s)", "ours", "hf.encode", "hf.batch", "ratio", "r.batch", "ours Mtok/s"))
for c in cases:
    o, p, b = c["ours"]["bytes_per_second"], c.get("peer", {}).get("bytes_per_second"), c.get("peer_encode_batch", {}).get("bytes_per_second")
    print("%-36s %10.2f %10s %10s %7s %7s  %.2f" % (c["name"], o / 1e6, f"{p / 1e6:.2f}" if p else "-", f"{b / 1e6:.2f}" if b else "-",
          f"{o / p:.2f}" if p else "-", f"{o / b:.2f}" if b else "-", c["ours"]["tokens_per_second"] / 1e6))
print("ids match:", all(c.get("peer", {}).get("ids_match") for c in cases))
PY
log "wrote $OUT_JSON"
exit $status
