"""The JSON files of a GPU window (bench/device_window.sh, docs/bench.md), each complete on its own.

  window_results.py probe OUT WORK PKG        probe.json: machine, library resolution, cuDNN, loads
  window_results.py kernels OUT WORK          kernels.json: bench_cuda_kernels cases beside their PyTorch peers
  window_results.py sanitizer OUT WORK        sanitizer.json: compute-sanitizer runs and their error counts
  window_results.py summary OUT WORK COMMAND  cuda_results.json: every stage, test_cuda's counts and all cases

WORK holds the stage table (stages.tsv: name, status, rc, seconds, reason) and the raw outputs.
Standard library only: it runs under the GPU image's Python and under the rehearsal's."""
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys


def load(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def dump(obj, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def jsonl(path):
    rows = []
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def stages(work):
    rows = []
    path = os.path.join(work, "stages.tsv")
    if os.path.exists(path):
        for line in open(path):
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 4:
                name, status, rc, secs = parts[:4]
                rows.append({"name": name, "status": status, "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                             "seconds": int(secs), "reason": parts[4] if len(parts) > 4 else ""})
    return rows


def sh(cmd, timeout=20):
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
        return r.stdout.strip() if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def pip_lib_dirs():
    """The lib folders of the nvidia-* wheels of this Python. In the CUDA 13 wheels `nvidia` and
    `nvidia.cudnn` are namespace packages (no __file__), so the folders come from the import
    system's search locations, not from a module's file."""
    dirs = []
    for mod in ("nvidia.cu13", "nvidia.cudnn", "nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime",
                "nvidia.cuda_nvrtc"):
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        for loc in (spec.submodule_search_locations or []) if spec else []:
            lib = os.path.join(loc, "lib")
            if os.path.isdir(lib) and lib not in dirs:
                dirs.append(lib)
    return dirs


def cmd_libdirs():
    print(":".join(pip_lib_dirs()))


def ldd(binary):
    """{soname: path or None} as the dynamic loader resolves them in this environment."""
    out = {}
    try:
        text = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return out
    for line in text.splitlines():
        m = re.match(r"\s*(\S+) => (not found|(\S+) \(0x[0-9a-f]+\))", line)
        if m:
            out[m.group(1)] = None if m.group(2) == "not found" else os.path.realpath(m.group(3))
    return out


def cmd_probe(out, work, pkg):
    manifest = load(os.path.join(pkg, "manifest.json"), {})
    sys_re = re.compile(manifest.get("system_libraries", r"^lib(c|m|stdc\+\+|gcc_s|gomp)\.so"))
    cuda_re = re.compile(manifest.get("cuda_libraries", r"^lib(cuda|cudart|cublas|cudnn|nccl|nvrtc)"))
    bindir = os.environ.get("QLORA_WINDOW_BIN", os.path.join(pkg, "bin"))
    pkg_lib = os.path.realpath(os.path.join(pkg, "lib"))
    toolkit_hidden = [d for d in os.environ.get("QLORA_REHEARSAL_FORBIDDEN", "").split(":") if d]
    problems, binaries = [], {}
    has_device = os.environ.get("QLORA_WINDOW_DEVICE", "") != ""
    for b in manifest.get("binaries", ["qlora", "test_cuda", "bench_cuda_kernels"]):
        path = os.path.join(bindir, b)
        libs = ldd(path)
        rows = {}
        for name, where in sorted(libs.items()):
            if sys_re.search(name):
                kind = "system"
            elif cuda_re.search(name):
                kind = "cuda"
            else:
                kind = "bundled"
            rows[name] = {"path": where, "kind": kind}
            if where is None:
                if name == "libcuda.so.1" and not has_device:
                    continue  # the driver's library: there only with a GPU
                problems.append(f"{b}: {name} not found (LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')})")
            elif kind == "bundled" and not where.startswith(pkg_lib + os.sep):
                problems.append(f"{b}: {name} resolved to {where}, outside the archive: it is not bundled "
                                f"(bench/device_pack.sh bundles every library that is neither system nor CUDA)")
            elif kind == "cuda" and any(where.startswith(os.path.realpath(d) + os.sep) for d in toolkit_hidden):
                problems.append(f"{b}: {name} resolved to {where}, a copy the GPU image does not have "
                                f"(the pip nvidia/*/lib lookup did not find it)")
        binaries[b] = {"exists": os.path.exists(path), "libraries": rows}
    cudnn_path = (binaries.get("test_cuda", {}).get("libraries", {}).get("libcudnn.so.9") or {}).get("path")
    dists = {}
    for d in importlib.metadata.distributions():
        name = (d.metadata.get("Name") or "").lower()
        if name.startswith("nvidia-") or name in ("torch", "transformers", "peft", "cmake", "bitsandbytes"):
            dists[name] = d.version
    cudnn = {"built_with": bool(manifest.get("cudnn")), "library": cudnn_path,
             "pip_version": dists.get("nvidia-cudnn-cu13"),
             "compiled_against": manifest.get("compiled_against", {}).get("cudnn")}
    cudnn["state"] = "on" if cudnn["built_with"] and cudnn_path else "off"
    if cudnn["state"] == "off":
        cudnn["reason"] = ("the binaries were built without cuDNN" if not cudnn["built_with"]
                           else "libcudnn.so.9 does not resolve")
        problems.append("cuDNN off: " + cudnn["reason"])
    # The C and C++ runtimes here against the newest symbol versions the archive needs.
    runtimes = {"glibc": (sh("ldd --version | head -1") or "").split()[-1:] or [None]}
    runtimes["glibc"] = runtimes["glibc"][0]
    cxx = next((r["path"] for b in binaries.values() for n, r in b["libraries"].items()
                if n.startswith("libstdc++") and r["path"]), None)
    have_cxx = sh(f"grep -ao 'GLIBCXX_3\\.4\\.[0-9]*' {cxx} | sort -uV | tail -1") if cxx else None
    runtimes["libstdcxx"] = have_cxx
    req = manifest.get("requires", {})
    def ver(v):
        return tuple(int(x) for x in re.findall(r"\d+", v or ""))
    if req.get("glibc") and runtimes["glibc"] and ver(runtimes["glibc"]) < ver(req["glibc"][len("GLIBC_"):]):
        problems.append(f"glibc {runtimes['glibc']} here; the archive needs {req['glibc']}")
    if req.get("libstdcxx") and have_cxx and ver(have_cxx) < ver(req["libstdcxx"]):
        problems.append(f"libstdc++ here has up to {have_cxx}; the archive needs {req['libstdcxx']}")
    loads = load(os.path.join(work, "loads.json"), {})
    for b, rc in loads.items():
        if rc != 0:
            problems.append(f"{b} does not start here (rc {rc}; logs.tar.gz: probe.log)")
    res = {"device": os.environ.get("QLORA_WINDOW_DEVICE") or None,
           "driver": os.environ.get("QLORA_WINDOW_DRIVER") or None,
           "nvidia_smi": sh("nvidia-smi -L"),
           "nvcc": sh("nvcc --version | tail -1"), "cmake": sh("cmake --version | head -1"),
           "python": sys.version.split()[0], "python_packages": dists,
           "manifest": manifest, "lib_dirs": os.environ.get("LD_LIBRARY_PATH", "").split(":"),
           "cudnn": cudnn, "runtimes": runtimes, "loads": loads, "binaries": binaries, "problems": problems,
           "fallback_build": load(os.path.join(work, "fallback.json"))}
    dump(res, os.path.join(out, "probe.json"))
    print(f"probe: cuDNN {cudnn['state']} ({cudnn_path or cudnn.get('reason')}); {len(problems)} problem(s)")
    for p in problems:
        print("probe problem: " + p)


def cmd_kernels(out, work):
    cases = {c["name"]: c for c in jsonl(os.path.join(work, "bench_ours.jsonl"))}
    for p in jsonl(os.path.join(work, "bench_peers.jsonl")):
        c = cases.setdefault(p["name"], {"name": p["name"], "config": {}, "ours": {}})
        c["peer"] = p.get("peer")
        if "peer_info" in p:
            c["peer_info"] = p["peer_info"]
    for c in cases.values():
        c.setdefault("peer", None)
        key = "tflops" if "tflops" in (c.get("ours") or {}) else "gbps"
        o, p = (c.get("ours") or {}).get(key), (c.get("peer") or {}).get(key)
        c["ratio"] = round(o / p, 3) if o and p else None
    dump({"cases": list(cases.values())}, os.path.join(out, "kernels.json"))


def cmd_sanitizer(out, work):
    runs = []
    for path in sorted(glob.glob(os.path.join(work, "sanitizer_*.log"))):
        tool = os.path.basename(path)[len("sanitizer_"):-len(".log")]
        text = open(path, errors="replace").read()
        m = re.findall(r"ERROR SUMMARY: (\d+) error", text)
        runs.append({"tool": tool, "errors": int(m[-1]) if m else None,
                     "first_reports": [l for l in text.splitlines() if l.startswith("========= ") and
                                       ("Invalid" in l or "Race" in l or "Error" in l)][:20]})
    dump({"runs": runs, "stages": [s for s in stages(work) if s["name"].startswith("sanitizer")]},
         os.path.join(out, "sanitizer.json"))


def cmd_summary(out, work, command):
    probe = load(os.path.join(out, "probe.json"), {})
    manifest = probe.get("manifest", {})
    tests = {}
    t = load(os.path.join(out, "test_cuda.json"))
    if t:
        tests = {k: t.get(k) for k in ("tests", "failures", "disabled", "errors", "time")}
        cases_t = [c for s in t.get("testsuites", []) for c in s.get("testsuite", [])]
        tests["failed"] = [f"{c.get('classname')}.{c['name']}" for c in cases_t if c.get("failures")]
        tests["skipped"] = [f"{c.get('classname')}.{c['name']}" for c in cases_t if c.get("result") == "SKIPPED"]
    cases = list((load(os.path.join(out, "kernels.json"), {}) or {}).get("cases", []))
    for c in (load(os.path.join(out, "e2e_results.json"), {}) or {}).get("cases", []):
        cases.append(dict(c, kind="end_to_end"))
    res = {"device": probe.get("device"), "driver": probe.get("driver"),
           "git_sha": manifest.get("git_sha") or os.environ.get("QLORA_GIT_SHA"),
           "command": command, "deadline_s": int(os.environ.get("QLORA_WINDOW_DEADLINE", "0")),
           "cudnn": probe.get("cudnn", {}).get("state"), "problems": probe.get("problems", []),
           "stages": stages(work), "test_cuda": tests,
           "sanitizer": (load(os.path.join(out, "sanitizer.json"), {}) or {}).get("runs"), "cases": cases}
    dump(res, os.path.join(out, "cuda_results.json"))


if __name__ == "__main__":
    verb, args = sys.argv[1], sys.argv[2:]
    {"probe": cmd_probe, "kernels": cmd_kernels, "sanitizer": cmd_sanitizer, "summary": cmd_summary,
     "libdirs": cmd_libdirs}[verb](*args)
