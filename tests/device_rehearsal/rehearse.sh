#!/usr/bin/env bash
# The GPU window rehearsed here (CTest label device-rehearsal; docs/bench.md): the exact window
# command, bench/device_window.sh, run on this machine in an environment made to look like the
# GPU image, and its output checked as the window's would be.
#
#   rehearse.sh setup BUILD WORK     pack BUILD's binaries (bench/device_pack.sh -> WORK/pack) and
#                                    make the image-like venv (WORK/venv)
#   rehearse.sh run WORK             the rehearsal; exit 0 when every check passes
#   rehearse.sh break WHAT WORK      the rehearsal of a deliberately broken window (WHAT: cudnn-lookup,
#                                    bundled-lib, deadline); exit 0 when it fails naming the cause
#
# The image-like environment: the archive alone (no build tree on LD_LIBRARY_PATH), Python with the
# pip nvidia-cudnn-cu13 and nvidia-nccl-cu13 wheels (their nvidia/*/lib layout, namespace packages)
# and cmake >= 3.31 from pip, hash-pinned; in a private mount namespace (unshare -m, root) the CUDA
# toolkit's own copies of cuDNN and NCCL are hidden, so they must come from the wheels, as on an
# image whose toolkit has none. There is no GPU here: device stages report "no device", and a
# second run with each device stage replaced by a sleep checks that the deadline clips them.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/tests/device_rehearsal"
fail() { echo "REHEARSAL FAILED: $*" >&2; exit 1; }

verb="${1:-}"
case "$verb" in
  setup)
    BUILD="$(realpath "$2")" WORK="$(realpath -m "$3")"
    mkdir -p "$WORK"
    bash "$ROOT/bench/device_pack.sh" "$BUILD" "$WORK/pack" || fail "bench/device_pack.sh failed"
    venv="$WORK/venv"
    if [ ! -x "$venv/bin/cmake" ] || ! cmp -s "$HERE/requirements.txt" "$venv/requirements.txt"; then
      rm -rf "$venv"
      python3 -m venv "$venv" || fail "python3 -m venv failed (Debian: python3-venv)"
      "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --require-hashes \
        -r "$HERE/requirements.txt" || fail "pip install of $HERE/requirements.txt failed"
      cp "$HERE/requirements.txt" "$venv/requirements.txt"
    fi
    v="$("$venv/bin/cmake" --version | head -1)"
    # A device call carries the working tree and the archive: 64 MiB in all.
    tree=$(git -C "$ROOT" ls-files -z --cached --others --exclude-standard | (cd "$ROOT" && du -cb --files0-from=- 2>/dev/null) | tail -1 | cut -f1)
    pack=$(stat -c %s "$WORK/pack/qlora_device.tar.xz")
    [ $((tree + pack)) -le $((64 << 20)) ] ||
      fail "the working tree ($((tree >> 20)) MiB) and the archive ($((pack >> 20)) MiB) exceed the 64 MiB a device call carries"
    echo "rehearsal setup: archive $((pack >> 20)) MiB + working tree $((tree >> 20)) MiB of the 64 MiB a call carries; venv with $v"
    exit 0
    ;;
  run) WORK="$(realpath "$2")" BREAK="" ;;
  break) BREAK="$2" WORK="$(realpath "$3")" ;;
  inside) ;;  # below: the part that runs in the mount namespace
  *) echo "usage: rehearse.sh setup BUILD WORK | run WORK | break WHAT WORK" >&2; exit 2 ;;
esac

if [ "$verb" != inside ]; then
  [ -f "$WORK/pack/qlora_device.tar.xz" ] && [ -x "$WORK/venv/bin/cmake" ] || fail "run 'rehearse.sh setup BUILD $WORK' first"
  [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null || fail "needs root and a private mount namespace (unshare -m) to hide the toolkit's cuDNN and NCCL"
  log="$WORK/rehearsal${BREAK:+_$BREAK}.log"
  unshare -m --propagation private bash "$0" inside "$WORK" "$BREAK" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ -z "$BREAK" ]; then exit "$rc"; fi
  # A broken window must fail, and say why.
  case "$BREAK" in
    cudnn-lookup) want='libcudnn\.so\.9 (not found|does not resolve)' ;;
    bundled-lib) want='libopenblas\.so\.0 resolved to .*outside the archive' ;;
    deadline) want='past its --timeout-s' ;;
    *) fail "unknown break '$BREAK'" ;;
  esac
  [ "$rc" -ne 0 ] || fail "the rehearsal passed with the window broken ($BREAK)"
  grep -Eq "REHEARSAL FAILED: .*$want" "$log" || fail "the rehearsal failed with the window broken ($BREAK) but no message names the cause (/$want/)"
  echo "rehearsal of the broken window ($BREAK): failed, naming the cause: $(grep -E "REHEARSAL FAILED" "$log" | head -1)"
  exit 0
fi

# ---- inside the mount namespace ----------------------------------------------------------------
WORK="$2" BREAK="${3:-}"
venv="$WORK/venv"
R="$WORK/${BREAK:-run}"  # this run's own folder: the runs may go on side by side
rm -rf "$R" && mkdir -p "$R"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# Hide the toolkit's cuDNN and NCCL: its lib folder becomes a tmpfs of links to everything else.
hidden=0
for tk in $(for d in /usr/local/cuda*/lib /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib; do
              [ -d "$d" ] && readlink -f "$d"; done | sort -u); do
  ls "$tk" | grep -Eq '^lib(cudnn|nccl)' || continue
  side="$R/mnt/$(echo "$tk" | tr / _)"
  mkdir -p "$side"
  mount --bind "$tk" "$side" && mount -t tmpfs tmpfs "$tk" || fail "cannot hide $tk"
  for f in "$side"/* "$side"/.[!.]*; do
    [ -e "$f" ] || continue
    case "$(basename "$f")" in libcudnn* | libnccl*) hidden=$((hidden + 1)) ;; *) ln -s "$f" "$tk/" ;; esac
  done
done
for p in $(ldconfig -p | sed -n 's/.*lib\(cudnn\|nccl\).* => //p'); do [ -e "$p" ] && fail "$p is still visible"; done
echo "rehearsal: $hidden toolkit copies of cuDNN/NCCL hidden; Python $("$venv/bin/python" -V 2>&1 | cut -d' ' -f2) with $(ls -d "$site"/nvidia/*/ | xargs -n1 basename | tr '\n' ' ')"

# What runs: the repository's window script, or a mutant of it for a break.
root="$ROOT"
mutant() {  # FILE PYTHON-EXPR: a copy of the tree's bench/ and tools/ with FILE rewritten
  root="$R/mutant"
  rm -rf "$root" && mkdir -p "$root" && cp -r "$ROOT/bench" "$root/" && ln -s "$ROOT/tools" "$ROOT/tests" "$root/"
  python3 - "$root/$1" "$2" <<'PY' || fail "mutant: $1 has changed; update rehearse.sh"
import sys
path, expr = sys.argv[1:3]
old, new = expr.split("=>")
src = open(path).read()
assert old in src, old
open(path, "w").write(src.replace(old, new))
PY
}
pack="$WORK/pack/qlora_device.tar.xz"
timeout_s=120
fake=""
case "$BREAK" in
  "") ;;
  cudnn-lookup)  # the lookup of cuDNN's wheel as it was: through nvidia.cudnn.__file__
    mutant bench/window_results.py 'spec = importlib.util.find_spec(mod)=>spec = importlib.util.find_spec(mod); spec.submodule_search_locations = [os.path.dirname(importlib.import_module(mod).__file__)]' ;;
  bundled-lib)  # the archive without OpenBLAS
    mkdir -p "$R/broken" && rm -rf "$R/broken/qlora-device"
    tar -xJf "$pack" -C "$R/broken" && rm "$R/broken/qlora-device/lib/libopenblas.so.0" &&
      tar -C "$R/broken" -cJf "$R/broken/qlora_device.tar.xz" qlora-device || fail "cannot make the broken archive"
    pack="$R/broken/qlora_device.tar.xz" ;;
  deadline)  # stages no longer clipped to the time left
    mutant bench/device_window.sh '  [ "$limit" -gt "$left" ] && limit=$left=>  :' ;;
  *) fail "unknown break '$BREAK'" ;;
esac

out_ok() {  # OUT: what comes back from a device call, and each file's content
  local out=$1 n
  n=$(find "$out" -mindepth 1 | wc -l)
  [ "$n" -le 8 ] || fail "$out holds $n entries; a device call brings back at most 8 files"
  find "$out" -mindepth 1 ! -type f | grep -q . && fail "$out holds something that is not a plain file"
  find "$out" -type f -printf '%f\n' | grep -Ev '^[A-Za-z0-9._-]+$' && fail "a file name in $out would not come back"
  for f in "$out"/*.json; do
    python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$f" 2>/dev/null || fail "$(basename "$f") is not valid JSON"
  done
  tar -tzf "$out/logs.tar.gz" >/dev/null 2>&1 || fail "logs.tar.gz is missing or damaged"
  python3 - "$out" <<'PY' || exit 1
import json, os, sys
out = sys.argv[1]
def fail(msg):
    print("REHEARSAL FAILED: " + msg, file=sys.stderr); sys.exit(1)
r = json.load(open(os.path.join(out, "cuda_results.json")))
for k in ("device", "driver", "git_sha", "command", "stages", "cases"):
    if k not in r: fail(f"cuda_results.json has no '{k}'")
p = json.load(open(os.path.join(out, "probe.json")))
for msg in p["problems"]: fail("probe: " + msg)
if p["cudnn"]["state"] != "on": fail(f"probe: cuDNN {p['cudnn']['state']}")
names = [s["name"] for s in r["stages"]]
for want in ("probe", "test_cuda", "e2e", "kernels", "sanitizer", "e2e_more"):
    if not any(n == want or n.startswith(want + "_") for n in names): fail(f"cuda_results.json records no stage '{want}'")
PY
}

# 1. The window as on a machine without a GPU: every stage reports, the probe finds everything.
#    (The deadline break changes only what part 2 checks.)
if [ "$BREAK" != deadline ]; then
out="$R/out"
rm -rf "$out" && mkdir -p "$out"
t0=$SECONDS
OUT="$out" QLORA_PACK="$pack" QLORA_WINDOW_WORK="$R/window" QLORA_WINDOW_NO_DEVICE=1 PATH="$venv/bin:$PATH" \
  bash "$root/bench/device_window.sh" --timeout-s $timeout_s >"$R/window_run.log" 2>&1
rc=$?
took=$((SECONDS - t0))
cat "$R/window_run.log"
[ $took -le $timeout_s ] || fail "the window ran ${took}s, past its --timeout-s $timeout_s"
[ $rc -eq 0 ] || fail "bench/device_window.sh exited $rc"
out_ok "$out"
echo "rehearsal: the window without a GPU: ${took}s of ${timeout_s}s, $(ls "$out" | wc -l) files: $(ls "$out" | tr '\n' ' ')"
fi

# 2. Device stages standing in as sleeps longer than the time left: clipped, the rest skipped.
out2="$R/out_deadline"
rm -rf "$out2" && mkdir -p "$out2"
timeout_s=70
t0=$SECONDS
OUT="$out2" QLORA_PACK="$pack" QLORA_WINDOW_WORK="$R/window2" QLORA_WINDOW_FAKE_DEVICE=80 PATH="$venv/bin:$PATH" \
  bash "$root/bench/device_window.sh" --timeout-s $timeout_s >"$R/window_run2.log" 2>&1
took=$((SECONDS - t0))
[ $took -le $timeout_s ] || fail "the window ran ${took}s, past its --timeout-s $timeout_s (stages: $(cut -f1,2,4 "$R/window2/stages.tsv" | tr '\t\n' ' ,'))"
out_ok "$out2"
python3 - "$out2/cuda_results.json" <<'PY' || exit 1
import json, sys
st = {s["name"]: s["status"] for s in json.load(open(sys.argv[1]))["stages"]}
if st.get("test_cuda") != "timeout" or any(st.get(n) != "skipped" for n in ("e2e", "kernels", "e2e_more")):
    print("REHEARSAL FAILED: the deadline did not clip the stages: " + repr(st), file=sys.stderr); sys.exit(1)
print("rehearsal: deadline clipping:", ", ".join(f"{k} {v}" for k, v in st.items()))
PY
[ -n "$BREAK" ] && exit 0

# 3. The fallback build on the device configures with the image's cmake (>= 3.31), the archive's
#    dependency bundle in place of the system's OpenBLAS, GoogleTest and CLI libraries, and finds
#    the wheel's cuDNN.
fb="$R/fallback"
rm -rf "$fb"
PATH="$venv/bin:$PATH" OUT="$fb/out" QLORA_DEVICE_BUILD="$fb/build" QLORA_E2E=1 QLORA_FORCE_DEPS_BUNDLE=1 \
  QLORA_DEVICE_DEPS="$R/window/qlora-device/devdeps" \
  bash "$ROOT/bench/device_run.sh" --configure-only >"$R/fallback.log" 2>&1 ||
  { tail -30 "$fb/out/build.log" "$R/fallback.log"; fail "the fallback build's configure failed with $("$venv/bin/cmake" --version | head -1)"; }
grep -q "cuDNN attention path: .*$site/nvidia/cudnn" "$fb/out/build.log" ||
  { grep -i cudnn "$fb/out/build.log"; fail "the fallback build did not find the wheel's cuDNN ($site/nvidia/cudnn)"; }
echo "rehearsal: the fallback build configures with $("$venv/bin/cmake" --version | head -1) and the wheel's cuDNN"

# 4. The end-to-end stage's commands, as the window calls device_e2e.sh (a dry run prints them), name
#    the archive's qlora, and the carried bitsandbytes wheel installs the way device_e2e.sh does it.
pkg="$R/window/qlora-device"
dry="$(QLORA_BIN="$pkg/bin/qlora" QLORA_WHEELS="$pkg/wheels" QLORA_E2E_CASES=1 OUT="$R/e2e_dry" \
  bash "$ROOT/bench/device_e2e.sh" --dry-run 2>&1)" || fail "device_e2e.sh --dry-run failed: $dry"
grep -q "\[ours, limit [0-9]*s\] $pkg/bin/qlora bench --model llama3-8b --seq-len 2048" <<<"$dry" ||
  fail "the end-to-end stage would not run the archive's qlora on llama3-8b at T=2048: $dry"
grep -q "\[peer, limit [0-9]*s\] .*tools/peers/hf_peft_bench.py" <<<"$dry" || fail "the end-to-end stage has no peer run: $dry"
ls "$pkg"/wheels/bitsandbytes-*.whl >/dev/null 2>&1 || fail "the archive has no bitsandbytes wheel for the peer"
"$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile --target "$R/bnb_site" "$pkg"/wheels/*.whl ||
  fail "the carried bitsandbytes wheel does not install"
ls "$R"/bnb_site/bitsandbytes/libbitsandbytes_cuda13*.so >/dev/null 2>&1 ||
  fail "the carried bitsandbytes wheel has no CUDA 13 library (the image's torch is cu130)"
echo "rehearsal: the end-to-end stage runs the archive's qlora and the peer; bitsandbytes installs with its CUDA 13 library"
echo "rehearsal: passed"
