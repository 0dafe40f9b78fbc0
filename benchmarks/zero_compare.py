#!/usr/bin/env python3
"""Runs benchmarks/zero_bench.cpp at several world sizes through lockstep-run
and prints one table: per model, mode and world size, the largest rank's
optimizer-state memory, its ratio to 1/N of plain Adam's, and step times.
Ends with the goal check "ZeRO state per rank within 10% of 1/N of the total"
for each ZeRO run, then all results as one JSON line (into --json FILE
instead). Modes: plain Adam, then ZeRO with split parameters (the default:
zero-broadcast, zero-allgather), then ZeRO with whole parameters
(zero-*-whole, split_parameters = false). The exit
status is 2 when a split mode misses the goal, or a whole mode on "deep" does
(whole parameters cannot balance "mlp": reported, not counted), and 1 when a
world size failed (the others' results are still printed).

    benchmarks/zero_compare.py --build build                  1, 2 and 4 ranks
    benchmarks/zero_compare.py --build build --model deep --sizes 2,4
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import result_file
import script_checks

# The table's order: plain, the default (split) modes, the whole-parameter ones.
MODES = ["plain", "zero-broadcast", "zero-allgather", "zero-broadcast-whole", "zero-allgather-whole"]
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run_bench(a, n):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [os.path.join(a.build, "bin", "lockstep-run"), "-np", str(n), "--",
               os.path.join(a.build, "bin", "zero_bench"), "--model", a.model,
               "--batch", str(a.batch), "--warmup", str(a.warmup), "--iters", str(a.iters),
               "--json", out.name]
        if a.backend:
            cmd += ["--backend", a.backend]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout,
                               env=dict(os.environ, **ONE_THREAD))
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"zero_compare: {' '.join(cmd)} timed out after {a.timeout} s "
                             "(--timeout)\n")
            return None
        if r.returncode != 0:
            sys.stderr.write(f"zero_compare: {' '.join(cmd)} failed ({r.returncode}):\n"
                             f"{r.stdout[-2000:]}{r.stderr[-2000:]}\n")
            return None
        with open(out.name) as f:
            return json.load(f)


def table(header, rows):
    w = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w[i]) for i, c in enumerate(cells)) + " |"
    return "\n".join([line(header), "|" + "|".join("-" * (x + 2) for x in w) + "|"] +
                     [line(r) for r in rows])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--sizes", type=script_checks.int_list, default="1,2,4")
    p.add_argument("--model", default="mlp,deep")
    p.add_argument("--backend", default="")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--json", type=result_file.writable, default="")
    a = p.parse_args()
    unknown = [m for m in a.model.split(",") if m not in ("mlp", "deep")]
    if unknown or not a.model:
        p.error(f"--model {a.model}: mlp and/or deep, e.g. mlp,deep")
    if a.batch < 1 or a.iters < 1 or a.warmup < 0 or a.timeout < 1:
        p.error("needs --batch, --iters and --timeout >= 1 and --warmup >= 0")
    script_checks.require_programs("zero_compare", a.build, ["zero_bench", "lockstep-run"])

    # A world size that fails is reported; the others' results are kept.
    results, machine, failed = [], "", []
    for n in a.sizes:
        doc = run_bench(a, n)
        if doc is None:
            failed.append(n)
            continue
        machine = doc["machine"]
        results += doc["results"]
    order = {m: i for i, m in enumerate(MODES)}
    results.sort(key=lambda r: (r["model"], order.get(r["mode"], len(MODES)), r["world_size"]))
    mib = lambda b: f"{b / 2**20:.2f}"
    rows = []
    for r in results:
        plain_step = next((q["step_ms"] for q in results if q["model"] == r["model"] and
                           q["mode"] == "plain" and q["world_size"] == r["world_size"]), None)
        rows.append([r["model"], r["mode"], r["world_size"], r["backend"], mib(r["state_bytes_max"]),
                     mib(r["plain_state_bytes"] / r["world_size"]), f"{r['max_over_ideal']:.2f}",
                     f"{r['step_ms']:.1f}", f"{r['opt_step_ms']:.1f}",
                     f"{r['step_ms'] / plain_step:.2f}" if plain_step else "-"])
    print(f"# zero_compare: Adam, batch {a.batch} per rank, {a.warmup} warm-up + {a.iters} timed "
          f"steps; {machine}")
    print(table(["model", "mode", "ranks", "backend", "state MiB max rank", "1/N of plain MiB",
                 "max/ideal", "step ms", "opt ms", "step vs plain"], rows))
    ok = True
    for r in results:
        if r["mode"] == "plain" or r["world_size"] == 1:
            continue
        good = r["max_over_ideal"] <= 1.10
        counted = not r["mode"].endswith("-whole") or r["model"] == "deep"
        ok = ok and (good or not counted)
        print(f"# goal: ZeRO state per rank within 10% of 1/N of the total: {r['model']} {r['mode']} "
              f"N={r['world_size']}: {(r['max_over_ideal'] - 1) * 100:+.1f}% "
              f"{'PASS' if good else 'FAIL'}{'' if counted else ' (whole parameters; not counted)'}")
    if failed:
        print(f"# failed: {', '.join(f'N={n}' for n in failed)} (errors above); the table holds "
              "the other world sizes")
    doc = {"benchmark": "zero_compare", "machine": machine, "results": results,
           "failed_world_sizes": failed}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    else:
        print(json.dumps(doc))
    return 1 if failed else 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
