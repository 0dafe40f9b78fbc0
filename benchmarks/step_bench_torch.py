#!/usr/bin/env python3
"""PyTorch peer for step_bench: times forward + backward + SGD step of the
Fashion-MNIST MLP or CNN on the CPU and prints one JSON object.

Refuses to report (exit 3) when PyTorch is not running on OpenBLAS, since a
comparison against the reference BLAS would be meaningless.

torch.set_num_threads() does not reach OpenBLAS (it keeps one thread per
core), so the thread count is also set through the environment before torch
loads, and the count OpenBLAS really uses is read back and reported."""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time


def threads_from_argv():
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


# Must happen before torch (and with it OpenBLAS) is loaded.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = threads_from_argv()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(),
                         nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def loaded_blas():
    """The BLAS library this process has mapped (after a matmul has run)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path)
            if "blas" in name or "lapack" in name:
                libs.add(os.path.realpath(path))
    return sorted(libs)


def openblas_threads(blas):
    """Threads the loaded OpenBLAS uses, or None when it cannot be asked."""
    for path in blas:
        try:
            return ctypes.CDLL(path).openblas_get_num_threads()
        except (OSError, AttributeError):
            continue
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn"], required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = mlp() if a.model == "mlp" else cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x = torch.randn(a.batch_size, 1, 28, 28)
    y = torch.randint(0, 10, (a.batch_size,))
    loss_fn = nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)

    blas = loaded_blas()
    on_openblas = any("openblas" in b for b in blas)
    blas_threads = openblas_threads(blas)
    result = {"blas_threads": blas_threads,"peer": "pytorch", "version": torch.__version__, "model": a.model,
              "batch_size": a.batch_size, "threads": a.threads,
              "median_ms": statistics.median(times) * 1e3, "blas": blas,
              "on_openblas": on_openblas}
    print(json.dumps(result))
    if not on_openblas:
        print("step_bench_torch: PyTorch is not using OpenBLAS (loaded: %s). Install "
              "libopenblas0 so Debian's alternatives point libblas.so.3 at it; the reference "
              "BLAS is ~15x slower and the comparison would be meaningless." % (blas or "none"),
              file=sys.stderr)
        return 3
    if blas_threads is not None and blas_threads != a.threads:
        print("step_bench_torch: OpenBLAS uses %d threads, asked for %d" % (blas_threads, a.threads),
              file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
