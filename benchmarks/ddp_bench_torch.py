#!/usr/bin/env python3
"""PyTorch peer for ddp_bench: times a data-parallel training step
(forward + loss + backward + SGD step) of the Fashion-MNIST MLP or CNN, or
ResNet-18 for 32x32 inputs, under torch.nn.parallel.DistributedDataParallel
over gloo (or nccl with --device cuda), one process per rank, and prints one
JSON object (rank 0).

    ddp_bench_torch.py --np 2 --model mlp             starts 2 ranks itself
    torchrun --nproc_per_node 2 ddp_bench_torch.py    or under a launcher

Each rank trains on its own synthetic batches (1x28x28, or 3x32x32 for
resnet18; 10 classes), with SGD (lr 0.01, momentum 0.9), as ddp_bench does.
--device cuda: rank r on cuda:(LOCAL_RANK % GPUs), backend nccl, each step
ends with torch.cuda.synchronize(), cudnn.benchmark on, TF32 off (lockstep's
default); the BLAS checks below are skipped.
The step time reported is the slowest rank's mean; communication figures come
from DDP's own runtime statistics (sampled every iteration here): comm_ms is
the span from the first bucket's all-reduce launch to the end of backward's
wait for all buckets (backward computation in between included, so it is
longer than the all-reduces' busy time even at world size 1), exposed_comm_ms
the part of it after backward's computation ended, hidden_fraction the rest
over comm_ms; each per step from the rank that finished backward last (the
others' longer wait is load imbalance, imbalance_ms), as ddp_bench does.

The BLAS thread count (--threads, default 1) is set through the environment
before torch loads, and checked: exit 3 when PyTorch is not on OpenBLAS, 4 when
OpenBLAS ignored the count (see step_bench_torch.py)."""
import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Importing step_bench_torch first pins the BLAS threads from --threads
# through the environment before torch (and with it OpenBLAS) is loaded.
sys.path.insert(0, HERE)
from step_bench_torch import (INPUT_SHAPES, MODELS, loaded_blas, openblas_core,  # noqa: E402
                              openblas_threads)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import result_file  # noqa: E402

NUM_BATCHES = 4  # distinct batches per rank, used in turn


def parse_caps(text):
    return [float(c) for c in text.split(",") if c]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a):
    """Starts a.np copies of this script as ranks 0..np-1; returns rank 0's exit code."""
    port = str(free_port())
    # Drop --np N / --np=N so the children run as ranks.
    child_args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if arg == "--np":
            skip = True
            continue
        if arg.startswith("--np="):
            continue
        child_args.append(arg)
    procs = []
    for rank in range(a.np):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(a.np), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(a.np), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + child_args,
                                      stdout=subprocess.PIPE if rank else None, env=env))
    codes = []
    for p in procs:
        if p.stdout is not None:
            p.stdout.read()
        codes.append(p.wait())
    bad = [c for c in codes if c != 0]
    return codes[0] if codes[0] != 0 else (bad[0] if bad else 0)


def run_one(a, cap_mb, rank, world, device):
    cuda = device.type == "cuda"
    torch.manual_seed(a.seed)  # the same initial model on every rank (DDP broadcasts anyway)
    model = MODELS[a.model]().to(device)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_mb,
                                              device_ids=[device.index] if cuda else None)
    ddp._set_ddp_runtime_logging_sample_rate(1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(a.seed * 1000 + rank + 1)
    batches = [(torch.randn(a.batch, *INPUT_SHAPES[a.model], generator=g).to(device),
                torch.randint(0, 10, (a.batch,), generator=g).to(device))
               for _ in range(NUM_BATCHES)]

    def step(i):
        x, y = batches[i % NUM_BATCHES]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()

    for i in range(a.warmup):
        step(i)
    times, comm, overlap, fwd, bwd = [], [], [], [], []
    seen = None
    for i in range(a.iters + 1):
        t0 = time.perf_counter()
        step(a.warmup + i)
        t1 = time.perf_counter()
        # The statistics of the previous iteration's backward are recorded at
        # the next forward, so the one after the last timed step is untimed.
        if i < a.iters:
            times.append(t1 - t0)
        if i == 0:
            continue
        d = ddp._get_ddp_logging_data()
        start = d.get("backward_comm_time_start")
        if start is None or start == seen:
            continue
        seen = start
        comm.append(d.get("backward_comm_time", 0) / 1e6)
        overlap.append(d.get("backward_compute_comm_overlap_time", 0) / 1e6)
        fwd.append(d.get("forward_compute_time", 0) / 1e6)
        bwd.append(d.get("backward_compute_time", 0) / 1e6)
    d = ddp._get_ddp_logging_data()
    sizes = d.get("rebuilt_bucket_sizes") or d.get("bucket_sizes") or ""
    bucket_bytes = [int(s) for s in str(sizes).replace(",", " ").split()]

    mean_s = statistics.mean(times)
    t = torch.tensor([mean_s], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    step_s = t.item()
    exposed = [c - o for c, o in zip(comm, overlap)]
    rank0_comm_ms = statistics.mean(comm) if comm else None
    rank0_exposed_ms = statistics.mean(exposed) if comm else None
    last = last_rank_figures(comm, exposed)
    return {
        "impl": "pytorch", "model": a.model, "world_size": world,
        "backend": dist.get_backend(), "device": str(device),
        "batch": a.batch, "bucket_cap_mb": cap_mb, "iters": a.iters, "warmup": a.warmup,
        "step_ms": step_s * 1e3, "rank0_step_ms": mean_s * 1e3,
        "rank0_median_step_ms": statistics.median(times) * 1e3,
        "samples_per_s": world * a.batch / step_s,
        "forward_ms": statistics.mean(fwd) if fwd else None,
        "backward_ms": statistics.mean(bwd) if bwd else None,
        **last,
        "rank0_comm_ms": rank0_comm_ms, "rank0_exposed_comm_ms": rank0_exposed_ms,
        "buckets": len(bucket_bytes), "bucket_bytes": bucket_bytes,
    }


def last_rank_figures(comm, exposed):
    """Per step, the communication figures of the rank that finished backward
    last, i.e. waited least after it, as ddp_bench reports them: the other
    ranks' longer wait is load imbalance (they were ahead), not communication.
    imbalance_ms is the longest wait minus the shortest, per step."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (comm, exposed))
    steps = min(len(c) for c, _ in every)
    if steps == 0:
        return {"comm_ms": None, "exposed_comm_ms": None, "hidden_fraction": None,
                "imbalance_ms": None}
    last_comm, last_exposed, hidden, imbalance = [], [], [], []
    for i in range(steps):
        waits = [e[i] for _, e in every]
        q = min(range(len(every)), key=lambda k: waits[k])
        c, e = every[q][0][i], waits[q]
        last_comm.append(c)
        last_exposed.append(e)
        hidden.append(min(1.0, max(0.0, 1.0 - e / c)) if c > 0 else 0.0)
        imbalance.append(max(waits) - e)
    return {"comm_ms": statistics.mean(last_comm), "exposed_comm_ms": statistics.mean(last_exposed),
            "hidden_fraction": statistics.mean(hidden), "imbalance_ms": statistics.mean(imbalance)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="mlp")
    ap.add_argument("--batch", type=int, default=None,
                    help="samples per rank per step (default: 64; 256 for resnet18)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--bucket-cap-mb", default="25", help="comma-separated list, e.g. 1,5,25")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads per rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--np", type=int, default=0,
                    help="start this many ranks (else: run as one rank of a launcher)")
    ap.add_argument("--json", type=result_file.writable,
                    help="also write the JSON to this file (rank 0)")
    a = ap.parse_args()
    if a.batch is None:
        a.batch = 256 if a.model == "resnet18" else 64
    if a.iters < 1 or a.warmup < 0 or a.batch < 1:
        ap.error("--iters and --batch must be >= 1, --warmup >= 0")
    if a.np > 0 and "RANK" not in os.environ:
        return launch(a)

    torch.set_num_threads(a.threads)
    if "RANK" not in os.environ:  # alone: one rank
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    device = torch.device("cpu")
    if a.device == "cuda":
        if not torch.cuda.is_available():
            print("ddp_bench_torch: --device cuda, but torch.cuda.is_available() is False",
                  file=sys.stderr)
            return 5
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) %
                              torch.cuda.device_count())
        torch.cuda.set_device(device)  # before NCCL's communicator is made
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo",
                            timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    results = [run_one(a, cap, rank, world, device) for cap in parse_caps(a.bucket_cap_mb)]

    if a.device == "cuda":
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            doc = {"benchmark": "ddp_bench_torch", "peer": "pytorch", "version": torch.__version__,
                   "world_size": world, "device": "cuda",
                   "gpu": torch.cuda.get_device_name(device), "results": results}
            print(json.dumps(doc))
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(doc, f, indent=2)
        return 0  # OpenBLAS plays no part on the GPU

    blas = loaded_blas()
    on_openblas = any("openblas" in b for b in blas)
    blas_threads = openblas_threads(blas)
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return 0
    doc = {"benchmark": "ddp_bench_torch", "peer": "pytorch", "version": torch.__version__,
           "world_size": world, "threads": a.threads, "blas": blas, "blas_threads": blas_threads,
           "openblas_core": openblas_core(blas),
           "on_openblas": on_openblas, "results": results}
    print(json.dumps(doc))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    if not on_openblas:
        print("ddp_bench_torch: PyTorch is not using OpenBLAS (loaded: %s); the comparison "
              "would be meaningless. Install libopenblas0." % (blas or "none"), file=sys.stderr)
        return 3
    if blas_threads is not None and blas_threads != a.threads:
        print("ddp_bench_torch: OpenBLAS uses %d threads, asked for %d" % (blas_threads, a.threads),
              file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
