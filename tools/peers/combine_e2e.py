#!/usr/bin/env python3
"""Assemble the end-to-end benchmark results (bench/device_e2e.sh) into one JSON.

    combine_e2e.py --work DIR --cases A,B,... --out e2e_results.json [--device D --driver V --git-sha S --command C]
    combine_e2e.py --merge run1/e2e_results.json run2/e2e_results.json --out merged.json

Per case NAME, DIR holds: NAME.config.json (the settings), NAME.ours.json (`qlora bench --json`),
NAME.peer.json (tools/peers/hf_peft_bench.py --json), NAME.plan.json (`qlora plan --json`),
NAME.runs ("what rc seconds" lines) and NAME.{ours,peer,plan}.log (stderr). Any of them may be
missing or broken: a case that failed is recorded with its status and the tail of its log, and
never stops the others.

Output: {device, driver, git_sha, command, cases: [{name, config, ours, peer, status, ratio,
planned, planner_error, runs}]}
 - status: {ours, peer}: ok | oom | error | timeout | skipped | missing | dry
 - ratio: ours / peer for tokens_per_second and peak_memory_bytes (each tool's own peak:
   qlora bench samples cudaMemGetInfo, the peer reports torch.cuda.max_memory_allocated), and
   peak_device_used_bytes (ours / the peer's cudaMemGetInfo samples: the like-for-like memory ratio);
   null where either side has no number.
 - planned: the planner's figures for our run: tokens_per_second from `qlora plan`, and
   peak_memory_bytes = qlora bench's planned_peak_memory_bytes (the arena it allocated plus the
   planner's overhead lines) or else `qlora plan`'s total_bytes; each with its source.
 - planner_error: (planned - measured) / measured against ours, for both figures.
"""
import argparse
import json
import os
import sys


def read_json(path):
    """The JSON object in a file that may also hold other output; None when there is none."""
    try:
        text = open(path).read()
    except OSError:
        return None
    text = text.strip()
    if not text:
        return None
    try:
        v = json.loads(text)
        return v if isinstance(v, dict) else None
    except ValueError:
        pass
    dec = json.JSONDecoder()
    best = None
    i = text.find("{")
    while i >= 0:  # the last complete top-level object wins (progress text may precede it)
        try:
            v, end = dec.raw_decode(text, i)
            if isinstance(v, dict):
                best = v
            i = text.find("{", end)
        except ValueError:
            i = text.find("{", i + 1)
    return best


def tail(path, n=1500):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode(errors="replace")
    except OSError:
        return None


def read_runs(path):
    runs = {}
    try:
        for line in open(path):
            parts = line.split()
            if len(parts) == 3:
                what, rc, secs = parts
                runs[what] = {"rc": int(rc) if rc.lstrip("-").isdigit() else rc, "seconds": int(secs)}
    except OSError:
        pass
    return runs


def status_of(result, run):
    if run is None:
        return "missing"
    rc = run["rc"]
    if rc in ("skipped", "dry"):
        return rc
    if isinstance(result, dict) and result.get("error") == "oom":
        return "oom"
    if rc in (124, 137):
        return "timeout"
    if result is None or "error" in result or rc != 0:
        return "error"
    return "ok"


def num(d, *keys):
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def rel_err(planned, measured):
    return (planned - measured) / measured if planned is not None and measured not in (None, 0) else None


def one_case(work, name):
    cfg = read_json(os.path.join(work, name + ".config.json")) or {}
    runs = read_runs(os.path.join(work, name + ".runs"))
    side = {}
    for what in ("ours", "peer"):
        res = read_json(os.path.join(work, f"{name}.{what}.json"))
        st = status_of(res, runs.get(what))
        if res is None:
            res = {}
            if st not in ("skipped", "dry", "missing"):
                res = {"error": st, "rc": runs[what]["rc"], "message": "no JSON on stdout",
                       "log_tail": tail(os.path.join(work, f"{name}.{what}.log"))}
        elif st != "ok" and "log_tail" not in res and st != "oom":
            res["log_tail"] = tail(os.path.join(work, f"{name}.{what}.log"))
        side[what] = (res, st)
    ours, peer = side["ours"][0], side["peer"][0]
    ok_o, ok_p = side["ours"][1] == "ok", side["peer"][1] == "ok"
    plan = read_json(os.path.join(work, name + ".plan.json"))

    m_tps = num(ours, "tokens_per_second") if ok_o else None
    m_mem = num(ours, "peak_memory_bytes") if ok_o else None
    p_tps = num(peer, "tokens_per_second") if ok_p else None
    p_mem = num(peer, "peak_memory_bytes") if ok_p else None
    p_used = num(peer, "peak_device_used_bytes") if ok_p else None

    planned = {"tokens_per_second": num(plan, "tokens_per_second"), "tokens_per_second_source": "qlora plan",
               "fits": plan.get("fits") if isinstance(plan, dict) else None}
    if num(ours, "planned_peak_memory_bytes"):
        planned["peak_memory_bytes"] = num(ours, "planned_peak_memory_bytes")
        planned["peak_memory_source"] = "qlora bench planned_peak_memory_bytes"
    else:
        planned["peak_memory_bytes"] = num(plan, "total_bytes")
        planned["peak_memory_source"] = "qlora plan total_bytes"
    # Data movement of the quantized base: what the engine dequantized per step, as `qlora bench`
    # counted it, against the planner's "base weight dequant/cast" bytes for the same step.
    dm = ours.get("data_movement") if ok_o and isinstance(ours, dict) else None
    if isinstance(dm, dict):
        planned["dequant_bytes_per_step"] = dm.get("planned_dequant_bytes_per_step")
    if planned["tokens_per_second"] is None:
        planned["tokens_per_second_source"] = None
    if planned["peak_memory_bytes"] is None:
        planned["peak_memory_source"] = None

    return {
        "name": name,
        "config": cfg,
        "ours": ours,
        "peer": peer,
        "status": {"ours": side["ours"][1], "peer": side["peer"][1]},
        "ratio": {"tokens_per_second": ratio(m_tps, p_tps), "peak_memory_bytes": ratio(m_mem, p_mem),
                  "peak_device_used_bytes": ratio(m_mem, p_used)},
        "planned": planned,
        "planner_error": {"tokens_per_second": rel_err(planned["tokens_per_second"], m_tps),
                          "peak_memory_bytes": rel_err(planned["peak_memory_bytes"], m_mem),
                          "dequant_bytes_per_step": rel_err(planned.get("dequant_bytes_per_step"),
                                                            dm.get("dequant_bytes_per_step") if isinstance(dm, dict) else None)},
        "runs": runs,
    }


def fmt(v, spec, scale=1.0):
    return format(v / scale, spec) if isinstance(v, (int, float)) else "-"


def summary(res):
    g = 2 ** 30
    lines = ["", "%-24s %9s %9s %6s %8s %8s %6s %7s %7s %s" % (
        "case", "ours t/s", "peer t/s", "ratio", "ours GiB", "peer GiB", "ratio", "plan t/s", "plan mem", "status")]
    for c in res["cases"]:
        o, p = c["ours"], c["peer"]
        lines.append("%-24s %9s %9s %6s %8s %8s %6s %7s %7s %s" % (
            c["name"][:24], fmt(num(o, "tokens_per_second"), ".0f"), fmt(num(p, "tokens_per_second"), ".0f"),
            fmt(c["ratio"]["tokens_per_second"], ".2f"), fmt(num(o, "peak_memory_bytes"), ".1f", g),
            fmt(num(p, "peak_memory_bytes"), ".1f", g), fmt(c["ratio"]["peak_memory_bytes"], ".2f"),
            fmt(c["planner_error"]["tokens_per_second"], "+.0%"), fmt(c["planner_error"]["peak_memory_bytes"], "+.0%"),
            "ours %s, peer %s" % (c["status"]["ours"], c["status"]["peer"])))
    lines.append("(ratio = ours / peer; plan columns = planner error (planned - measured) / measured of ours)")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", help="folder with the per-case files")
    ap.add_argument("--cases", default="", help="comma list of case names, in order")
    ap.add_argument("--merge", nargs="+", help="e2e_results.json files to merge (later cases replace same-named ones)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="")
    ap.add_argument("--driver", default="")
    ap.add_argument("--git-sha", default="")
    ap.add_argument("--command", default="")
    a = ap.parse_args(argv)
    if a.merge:
        parts = [json.load(open(p)) for p in a.merge]
        res = {k: parts[0].get(k) for k in ("device", "driver", "git_sha", "command")}
        for k in ("device", "driver", "git_sha", "command"):
            vals = [p.get(k) for p in parts]
            if len(set(map(str, vals))) > 1:
                res[k] = vals if k == "command" else " | ".join(map(str, vals))
        cases = {}
        for p in parts:
            for c in p.get("cases", []):
                cases[c["name"]] = c
        res["cases"] = list(cases.values())
    else:
        if not a.work:
            ap.error("--work or --merge")
        names = [n for n in a.cases.split(",") if n]
        res = {"device": a.device or None, "driver": a.driver or None, "git_sha": a.git_sha or None,
               "command": a.command or None, "cases": [one_case(a.work, n) for n in names]}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")
    print(summary(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
