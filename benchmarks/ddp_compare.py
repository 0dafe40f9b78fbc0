#!/usr/bin/env python3
"""Runs lockstep's DistributedDataParallel and PyTorch's on the identical
models and batch sizes, at the same world sizes, in one go, and prints one
table with ratios, then all results as one JSON line (into --json FILE instead):

  lockstep default  lockstep-run -np N ddp_bench (the default backend: shm on one node)
  lockstep gloo     lockstep-run -np N ddp_bench --backend gloo
  lockstep mpi      mpirun -np N ddp_bench --backend mpi
  torch gloo      ddp_bench_torch.py --np N (torch.nn.parallel.DistributedDataParallel
                  over gloo, Debian's python3-torch on OpenBLAS, running the
                  OpenBLAS kernels lockstep ran: runtime/cpu/openblas_core.h);
                  "torch nccl" with --device cuda, where PyTorch runs over nccl
  no comm         N independent one-rank ddp_bench processes at once (N > 1): the
                  ceiling of scaling efficiency on this machine when ranks share
                  nothing but its cores and memory (--no-ceiling skips it)

One BLAS thread per rank on both sides. Per model and world size: the slowest
rank's mean step time, samples/s (world size x batch / step time), scaling
efficiency (samples/s at N ranks over N x the same path's samples/s at one
rank), communication time, the part of it still waited for after backward
(exposed) and the share hidden behind backward, and lockstep's samples/s over
PyTorch's. Then a bucket-size sweep at two ranks (gloo, both libraries; nccl
with --device cuda).
Everything runs --repeats times in whole rounds (A, B, A, B, ...: a burst of
other load on a shared machine hits one repeat of a configuration rather than
all of them) and each configuration's median run by samples/s is reported (of
an even count, the slower of the two middle runs).

    benchmarks/ddp_compare.py --build build                 MLP and CNN at 1 and 2 ranks
    benchmarks/ddp_compare.py --build build --sizes 1,2,4   4 ranks oversubscribe 2 cores
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import machine
import result_file
import script_checks

HERE = os.path.dirname(os.path.abspath(__file__))
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# The goals at two ranks.
GOAL_RATIO = {"mlp": 1.5, "cnn": 1.2}
GOAL_EFFICIENCY = 0.85
GOAL_HIDDEN_CNN = 0.80
TORCH_COMM_NOTE = (
    "# * PyTorch's own DDP statistics: its comm time spans the first bucket's launch to the end "
    "of backward's wait\n#   (compute in between included), so comm ms and hidden % are larger "
    "than lockstep's busy-time figures;\n#   exposed ms (waited for after backward's compute) "
    "compares like for like.")
LAST_RANK_NOTE = (
    "# comm, exposed and hidden are, per step, those of the rank that finished backward last; "
    "imbalance ms is\n#   how much longer the other ranks waited after backward (for that rank, "
    "not for communication).")


def csv(text, kind=str):
    return [kind(x) for x in text.split(",") if x]


def run(cmd, env=None, timeout=600):
    full_env = dict(os.environ, **ONE_THREAD, **(env or {}))
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)
    except subprocess.TimeoutExpired:
        sys.stderr.write(f"ddp_compare: {' '.join(cmd)} timed out after {timeout} s\n")
        return None
    if r.returncode != 0:
        sys.stderr.write(f"ddp_compare: {' '.join(cmd)} failed ({r.returncode}):\n"
                         f"{r.stdout[-2000:]}{r.stderr[-2000:]}\n")
        return None
    return r


def common_args(a, model, caps):
    args = ["--model", model, "--batch", str(a.batch), "--warmup", str(a.warmup),
            "--iters", str(a.iters), "--bucket-cap-mb", ",".join(f"{c:g}" for c in caps)]
    if a.device != "cpu":  # the CPU command lines stay as they were
        args += ["--device", a.device]
    return args


# From the last lockstep run: the OpenBLAS kernels it ran ("openblas_core"),
# what the peer's environment needs to run the same ("peer_env":
# OPENBLAS_CORETYPE where lockstep corrected OpenBLAS's choice), and
# ddp_bench's machine line, which names them.
LOCKSTEP_RUN = {"peer_env": {}, "machine": None, "openblas_core": None}


def lockstep_path(a, backend, model, n, caps):
    """ddp_bench's results (one per cap), or None. Backend "default" passes none."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        bench = [os.path.join(a.build, "bin", "ddp_bench")] + common_args(a, model, caps) + [
            "--json", out.name]
        if backend != "default":
            bench += ["--backend", backend]
        if backend != "mpi":
            cmd = [os.path.join(a.build, "bin", "lockstep-run"), "-np", str(n), "--"] + bench
            env = None
        else:
            cmd = [a.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(n)] + bench
            env = MPI_ENV
        if run(cmd, env) is None:
            return None
        doc = json.load(open(out.name))
        LOCKSTEP_RUN.update(peer_env=doc.get("peer_env", {}), machine=doc.get("machine"),
                            openblas_core=doc.get("openblas_core"))
        return doc["results"]


def torch_path(a, model, n, caps):
    """ddp_bench_torch.py's results (one per cap), or None."""
    if not os.path.exists(a.python):
        sys.stderr.write(f"ddp_compare: {a.python} not found; skipping PyTorch "
                         "(apt-get install python3-torch)\n")
        return None
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [a.python, os.path.join(HERE, "ddp_bench_torch.py"), "--np", str(n),
               "--threads", "1", "--json", out.name] + common_args(a, model, caps)
        if run(cmd, LOCKSTEP_RUN["peer_env"]) is None:
            return None
        doc = json.load(open(out.name))
        # Both on one OpenBLAS: a comparison of two kernel sets would time OpenBLAS.
        ours, theirs = LOCKSTEP_RUN["openblas_core"], doc.get("openblas_core")
        if ours and theirs and ours != theirs:
            sys.stderr.write(f"ddp_compare: PyTorch's OpenBLAS ran its {theirs} kernels, "
                             f"lockstep its {ours}; no PyTorch numbers from this run\n")
            return None
        return doc["results"]


def independent_path(a, model, n):
    """N one-rank ddp_bench processes started together: their summed samples/s,
    the slowest one's step time; None if any failed."""
    outs = [tempfile.NamedTemporaryFile(suffix=".json") for _ in range(n)]
    try:
        procs = []
        for out in outs:
            cmd = [os.path.join(a.build, "bin", "ddp_bench")] + common_args(
                a, model, [a.bucket_cap_mb]) + ["--json", out.name]
            env = dict(os.environ, **ONE_THREAD)
            for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCKSTEP_BACKEND"):
                env.pop(var, None)
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          text=True, env=env))
        errors = [p.communicate(timeout=600)[1] for p in procs]
        if any(p.returncode != 0 for p in procs):
            sys.stderr.write("ddp_compare: an independent one-rank run failed:\n"
                             + "".join(e[-1000:] for e in errors) + "\n")
            return None
        rs = [json.load(open(out.name))["results"][0] for out in outs]
    finally:
        for out in outs:
            out.close()
    return {"step_ms": max(r["step_ms"] for r in rs),
            "samples_per_s": sum(r["samples_per_s"] for r in rs), "independent_runs": rs}


def fmt(x, spec=".2f", none="n/a"):
    return none if x is None else format(x, spec)


def print_table(header, rows):
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--models", default="mlp,cnn")
    p.add_argument("--sizes", type=script_checks.int_list, default="1,2",
                   help="world sizes, e.g. 1,2,4")
    p.add_argument("--backends", default="default,gloo,mpi",
                   help="lockstep's backends to run (default: what init_process_group picks)")
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0, help="cap for the main table")
    p.add_argument("--sweep", default="1,5,25",
                   help="bucket caps (MiB) swept at two ranks over gloo (nccl with --device cuda); "
                        "empty: no sweep")
    p.add_argument("--repeats", type=int, default=3,
                   help="run everything this many times; report each configuration's median run")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="passed to both sides; on cuda lockstep's default backend and "
                        "PyTorch's are nccl (one GPU per rank)")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    p.add_argument("--no-ceiling", action="store_true",
                   help="skip the independent one-rank processes (the no-communication ceiling)")
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    p.add_argument("--json", type=result_file.writable, help="write all results to this file")
    a = p.parse_args()
    a.build = os.path.abspath(a.build)
    models, sizes, backends = csv(a.models), a.sizes, csv(a.backends)
    unknown = [x for x in models if x not in ("mlp", "cnn", "resnet18")] + [
        x for x in backends if x not in ("default", "nccl", "shm", "shm+gloo", "gloo", "mpi")]
    if a.repeats < 1 or a.batch < 1 or a.iters < 1 or a.warmup < 0:
        p.error("needs --repeats, --batch and --iters >= 1 and --warmup >= 0")
    if unknown:
        p.error(f"unknown model or backend: {', '.join(unknown)} (--models mlp,cnn,resnet18; "
                "--backends default,nccl,shm,shm+gloo,gloo,mpi)")
    try:
        sweep = csv(a.sweep, float)
    except ValueError:
        p.error(f"--sweep {a.sweep}: not a comma-separated list of bucket caps in MiB")
    if backends:
        script_checks.require_programs("ddp_compare", a.build, ["ddp_bench", "lockstep-run"])
    if "mpi" in backends:
        a.mpirun = script_checks.require_command("ddp_compare", a.mpirun, "--mpirun")
    if not a.no_torch:
        script_checks.require_torch("ddp_compare", a.python)

    started = time.time()
    # The backend PyTorch runs over (ddp_bench_torch.py), and the sweep's.
    peer_backend = "nccl" if a.device == "cuda" else "gloo"
    peer = f"torch {peer_backend}"
    paths = [f"lockstep {b}" for b in backends] + ([] if a.no_torch else [peer])
    # The ceiling is measured against the first lockstep path's one-rank run.
    ceiling = not a.no_ceiling and a.device == "cpu" and backends and 1 in sizes
    sweep_n = 2
    ok = True

    runs = {}  # (model, n, path) -> every successful repeat's result
    sweep_runs = {}  # (model, path) -> per repeat, the results of every cap

    def median_run(results):
        """The repeat whose samples/s is the median (of an even count, the slower
        middle one: a real run, not a mean of two), with every repeat's samples/s."""
        if not results:
            return None
        ordered = sorted(results, key=lambda r: r["samples_per_s"])
        return dict(ordered[(len(ordered) - 1) // 2],
                    repeats_samples_per_s=[r["samples_per_s"] for r in results])

    # Whole rounds, so that a burst of other load on the machine hits one
    # repeat of a configuration rather than all of them.
    for _ in range(a.repeats):
        for model in models:
            for n in sizes:
                for path in paths + (["no comm"] if ceiling and n > 1 else []):
                    if path == "no comm":
                        one = independent_path(a, model, n)
                        r = [one] if one else None
                    elif path == peer:
                        r = torch_path(a, model, n, [a.bucket_cap_mb])
                    else:
                        r = lockstep_path(a, path.split()[1], model, n, [a.bucket_cap_mb])
                    ok = ok and r is not None
                    runs.setdefault((model, n, path), []).extend(r[:1] if r else [])
        if sweep:
            for model in models:
                for path in paths:
                    if path == f"lockstep {peer_backend}":
                        r = lockstep_path(a, peer_backend, model, sweep_n, sweep)
                    elif path == peer:
                        r = torch_path(a, model, sweep_n, sweep)
                    else:
                        continue
                    ok = ok and r is not None
                    sweep_runs.setdefault((model, path), []).extend([r] if r else [])
    res = {key: median_run(rs) for key, rs in runs.items()}  # (model, n, path) -> result
    sweep_res = {key: [median_run([rs[i] for rs in per_repeat]) for i in range(len(sweep))]
                 if per_repeat else None for key, per_repeat in sweep_runs.items()}

    def efficiency(model, n, path):
        base = paths[0] if path == "no comm" else path
        r, r1 = res.get((model, n, path)), res.get((model, 1, base))
        if not r or not r1:
            return None
        return r["samples_per_s"] / (n * r1["samples_per_s"])

    def ratio(model, n, path):
        r, t = res.get((model, n, path)), res.get((model, n, peer))
        if not r or not t:
            return None
        return r["samples_per_s"] / t["samples_per_s"]

    print(f"# DDP training step, batch {a.batch} per rank, {a.warmup} warm-up + {a.iters} timed "
          f"steps, bucket cap {a.bucket_cap_mb:g} MiB, 1 BLAS thread per rank; step = slowest "
          f"rank's mean, median of {a.repeats} runs; ratio = lockstep samples/s over PyTorch's "
          f"at the same N")
    print(f"# {LOCKSTEP_RUN['machine'] or machine.describe()}"
          + (f"; {max(sizes)} ranks oversubscribe the cores" if max(sizes) > (os.cpu_count() or 1) else ""))
    header = ["model", "N", "path", "step ms", "samples/s", "scaling eff", "comm ms", "exposed ms",
              "hidden %", "imbalance ms", "vs torch"]
    rows = []
    for model in models:
        for n in sizes:
            for path in paths + (["no comm"] if ceiling and n > 1 else []):
                r = res[(model, n, path)]
                if r is None:
                    rows.append([model, str(n), path] + ["failed"] + ["n/a"] * 7)
                    continue
                hid = r.get("hidden_fraction")
                star = "*" if path == peer else ""
                rows.append([model, str(n), path, fmt(r["step_ms"]), fmt(r["samples_per_s"], ".0f"),
                             fmt(efficiency(model, n, path)), fmt(r.get("comm_ms")) + star,
                             fmt(r.get("exposed_comm_ms")),
                             fmt(None if hid is None else hid * 100, ".0f") + star,
                             fmt(r.get("imbalance_ms")),
                             "-" if path in (peer, "no comm") else fmt(ratio(model, n, path), ".2f")])
    print_table(header, rows)
    print(LAST_RANK_NOTE)
    if not a.no_torch:
        print(TORCH_COMM_NOTE)
    if ceiling:
        print(f"# no comm: N independent one-rank processes at once; its scaling eff (over N x "
              f"{paths[0]}'s one rank) is the most any backend can reach here")

    if sweep:
        print(f"\n# bucket-size sweep, {sweep_n} ranks, {peer_backend}")
        header = ["model", "path", "bucket cap MiB", "buckets", "step ms", "samples/s", "comm ms",
                  "exposed ms", "hidden %"]
        rows = []
        for (model, path), rs in sweep_res.items():
            for cap, r in zip(sweep, rs or [None] * len(sweep)):
                if r is None:
                    rows.append([model, path, f"{cap:g}", "failed"] + ["n/a"] * 5)
                    continue
                hid = r.get("hidden_fraction")
                star = "*" if path == peer else ""
                rows.append([model, path, f"{cap:g}", str(r.get("buckets")), fmt(r["step_ms"]),
                             fmt(r["samples_per_s"], ".0f"), fmt(r.get("comm_ms")) + star,
                             fmt(r.get("exposed_comm_ms")),
                             fmt(None if hid is None else hid * 100, ".0f") + star])
        print_table(header, rows)

    goals = []
    if 2 in sizes and not a.no_torch:
        print("\n# goals at 2 ranks: samples/s vs PyTorch >= 1.5x (MLP) / 1.2x (CNN), scaling "
              "efficiency >= 0.85, >= 80% of communication hidden (CNN)")
        for model in models:
            for path in paths:
                if path == peer:
                    continue
                rt, eff = ratio(model, 2, path), efficiency(model, 2, path)
                r = res.get((model, 2, path))
                hid = r.get("hidden_fraction") if r else None
                checks = [("vs torch", rt, GOAL_RATIO.get(model, 1.0), ".2f")]
                if 1 in sizes:
                    checks.append(("efficiency", eff, GOAL_EFFICIENCY, ".2f"))
                if model == "cnn":
                    checks.append(("hidden", hid, GOAL_HIDDEN_CNN, ".2f"))
                cells = []
                for name, value, goal, spec in checks:
                    met = value is not None and value >= goal
                    goals.append({"model": model, "path": path, "check": name, "value": value,
                                  "goal": goal, "met": met})
                    cells.append(f"{name} {fmt(value, spec)} (goal {goal:g}: "
                                 f"{'met' if met else 'MISSED'})")
                print(f"# {model} {path}: " + ", ".join(cells))
    print(f"# total {time.time() - started:.0f} s")

    doc = {"benchmark": "ddp_compare", "repeats": a.repeats, "batch": a.batch, "warmup": a.warmup, "iters": a.iters,
           "bucket_cap_mb": a.bucket_cap_mb, "sizes": sizes,
           "date": time.strftime("%Y-%m-%d"), "machine": LOCKSTEP_RUN["machine"] or machine.describe(),
           "results": [dict(r, model=m, world_size=n, path=path, scaling_efficiency=efficiency(m, n, path),
                            ratio_vs_torch=ratio(m, n, path) if path != peer else None)
                       for (m, n, path), r in res.items() if r],
           "sweep": {f"{m} {path}": rs for (m, path), rs in sweep_res.items()},
           "goals": goals}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    else:
        print(json.dumps(doc))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
