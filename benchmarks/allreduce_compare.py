#!/usr/bin/env python3
"""Runs every all-reduce path at the same sizes, in one go, and prints one
table with ratios (and --json FILE):

  lockstep shm    lockstep-run -np N allreduce_perf --backend shm (the default on one node)
  lockstep shm pool
                  the same with --shared-pool: the buffer in the group's shared pool, read
                  in place by the other ranks (how DDP's buckets are all-reduced)
  lockstep hier   shm within a node + gloo across: two lockstep-run launches on this host
                  posing as two nodes of N/2 ranks (LOCKSTEP_NODE_ID differs), default backend
  lockstep gloo   lockstep-run -np N allreduce_perf --backend gloo
  raw gloo        lockstep-run -np N allreduce_perf --backend raw-gloo
  torch gloo      PyTorch's dist.all_reduce over gloo (Debian's python3-torch)
  lockstep mpi    mpirun -np N allreduce_perf --backend mpi
  raw MPI         mpirun -np N allreduce_perf --backend raw-mpi (MPI_Allreduce)

float32 sum, in place. Time is the slowest rank's mean per all-reduce; a ratio
is lockstep's time over the library's (1.00 = our layer adds nothing); shm/MPI
compares lockstep's shared-memory backend with Open MPI's own all-reduce.

    benchmarks/allreduce_compare.py --build build -np 2 -b 4K -e 64M -f 4
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import machine
import result_file
import script_checks

HERE = os.path.dirname(os.path.abspath(__file__))
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def run(cmd, env=None):
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    r = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=1800)
    if r.returncode != 0:
        sys.stderr.write(f"allreduce_compare: {' '.join(cmd)} failed ({r.returncode}):\n"
                         f"{r.stdout[-2000:]}{r.stderr[-2000:]}\n")
        return None
    return r


def perf_path(a, launcher, backend, extra=()):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        perf = [os.path.join(a.build, "bin", "allreduce_perf"), "-b", str(a.b), "-e", str(a.e),
                "-f", str(a.f), "-w", str(a.w), "-n", str(a.n), "-c", "1", "--backend", backend,
                "--json", out.name, *extra]
        if launcher == "lockstep-run":
            cmd = [os.path.join(a.build, "bin", "lockstep-run"), "-np", str(a.np), "--"] + perf
            env = None
        else:
            cmd = [a.mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(a.np)] + perf
            env = MPI_ENV
        if run(cmd, env) is None:
            return None
        return json.load(open(out.name))


def hierarchical_path(a):
    """Two launchers on this host as two nodes of N/2 ranks each; None if N is odd."""
    if a.np < 2 or a.np % 2:
        return None
    port, token = str(free_port()), "allreduce-compare"
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        perf = [os.path.join(a.build, "bin", "allreduce_perf"), "-b", str(a.b), "-e", str(a.e),
                "-f", str(a.f), "-w", str(a.w), "-n", str(a.n), "-c", "1", "--backend", "shm+gloo",
                "--json", out.name]
        procs = []
        for node in range(2):
            cmd = [os.path.join(a.build, "bin", "lockstep-run"), "--nnodes", "2", "--node-rank", str(node),
                   "--nproc-per-node", str(a.np // 2), "--master-addr", "127.0.0.1",
                   "--master-port", port, "--token", token, "--"] + perf
            env = dict(os.environ, OMP_NUM_THREADS="1", LOCKSTEP_NODE_ID=f"node{node}")
            env.pop("LOCKSTEP_BACKEND", None)
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, env=env))
        outs = [p.communicate(timeout=1800)[0] for p in procs]
        if any(p.returncode != 0 for p in procs):
            sys.stderr.write("allreduce_compare: the two-node run failed:\n" + outs[0][-2000:] + "\n")
            return None
        return json.load(open(out.name))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_path(a, sizes):
    if not os.path.exists(a.python):
        return None
    port = str(free_port())
    procs = []
    for rank in range(a.np):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(a.np), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [a.python, os.path.join(HERE, "allreduce_torch.py"), "--sizes", ",".join(map(str, sizes)),
             "--warmup", str(a.w), "--iters", str(a.n)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    outs = [p.communicate(timeout=1800) for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.stderr.write("allreduce_compare: the PyTorch peer failed:\n" + outs[0][1][-2000:] + "\n")
        return None
    return json.loads(outs[0][0].strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("-np", type=int, default=2)
    p.add_argument("-b", type=script_checks.byte_size, default="4K")
    p.add_argument("-e", type=script_checks.byte_size, default="64M")
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-w", type=int, default=5)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch (its column says n/a)")
    p.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    p.add_argument("--json", type=result_file.writable, help="write all results to this file")
    a = p.parse_args()
    if a.np < 1 or a.w < 0 or a.n < 1 or a.f < 2 or a.b > a.e:
        p.error("needs -np >= 1, -w >= 0, -n >= 1, -f >= 2 and -b <= -e")
    if a.b % 4:  # each path runs size // 4 floats and reports that size, matching no row
        p.error(f"-b {a.b}: not a whole number of float32 elements; give a multiple of 4 bytes")
    script_checks.require_programs("allreduce_compare", a.build, ["allreduce_perf", "lockstep-run"])
    a.mpirun = script_checks.require_command("allreduce_compare", a.mpirun, "--mpirun")
    if not a.no_torch:
        script_checks.require_torch("allreduce_compare", a.python)

    sizes, s = [], a.b
    while s <= a.e:
        sizes.append(s)
        s *= a.f

    paths = {
        "lockstep shm": perf_path(a, "lockstep-run", "shm"),
        "lockstep shm pool": perf_path(a, "lockstep-run", "shm", ["--shared-pool"]),
        "lockstep hier": hierarchical_path(a),
        "lockstep gloo": perf_path(a, "lockstep-run", "gloo"),
        "raw gloo": perf_path(a, "lockstep-run", "raw-gloo"),
        "torch gloo": None if a.no_torch else torch_path(a, sizes),
        "lockstep mpi": perf_path(a, "mpirun", "mpi"),
        "raw MPI": perf_path(a, "mpirun", "raw-mpi"),
    }
    times = {name: ({r["size_bytes"]: r["time_us"] for r in doc["results"]} if doc else {})
             for name, doc in paths.items()}

    def cell(name, size):
        t = times[name].get(size)
        return f"{t:.1f}" if t is not None else "n/a"

    def ratio(num, den, size):
        x, y = times[num].get(size), times[den].get(size)
        return f"{x / y:.2f}" if x and y else "n/a"

    def busbw(name, size):
        t = times[name].get(size)
        return f"{size / t / 1e3 * 2 * (a.np - 1) / a.np:.2f}" if t else "n/a"

    header = ["size (B)"] + [f"{n} (us)" for n in paths] + [
        "shm/MPI", "pool/MPI", "gloo/raw", "gloo/torch", "mpi/raw", "busbw shm", "busbw pool",
        "busbw raw MPI"]
    rows = [[str(size)] + [cell(n, size) for n in paths] + [
        ratio("lockstep shm", "raw MPI", size), ratio("lockstep shm pool", "raw MPI", size),
        ratio("lockstep gloo", "raw gloo", size),
        ratio("lockstep gloo", "torch gloo", size), ratio("lockstep mpi", "raw MPI", size),
        busbw("lockstep shm", size), busbw("lockstep shm pool", size), busbw("raw MPI", size)]
        for size in sizes]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"
    print(f"# all-reduce, float32 sum in place, {a.np} ranks, {a.w} warm-up + {a.n} timed "
          f"iterations; time = slowest rank's mean (us); busbw in GB/s")
    print(f"# {machine.describe()}")
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    doc = {"benchmark": "allreduce_compare", "date": time.strftime("%Y-%m-%d"),
           "machine": machine.describe(), "ranks": a.np, "sizes": sizes, "paths": paths}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    else:
        print(json.dumps({"benchmark": "allreduce_compare", "ranks": a.np,
                          "time_us": {n: {str(k): v for k, v in t.items()} for n, t in times.items()}}))
    skipped = {"lockstep hier"} if a.np % 2 else set()
    if a.no_torch:
        skipped.add("torch gloo")
    failed = [n for n, doc in paths.items() if doc is None and n not in skipped]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
