"""PyTorch's gloo all_reduce, timed like allreduce_perf (the peer in
allreduce_compare.py). One process per rank; reads RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT; rank 0 prints a JSON document on stdout.

    allreduce_torch.py --sizes 4096,1048576 --warmup 5 --iters 20
"""
import argparse
import json
import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    sys.exit(f"{os.path.basename(sys.argv[0])}: no PyTorch for {sys.executable} ({e}; "
             "apt-get install python3-torch)")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", required=True, help="comma-separated sizes in bytes (float32)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    results = []
    for size in (int(s) for s in a.sizes.split(",")):
        count = size // 4
        t = torch.ones(count, dtype=torch.float32)
        for _ in range(a.warmup):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(a.iters):
            dist.all_reduce(t)
        local = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(local, op=dist.ReduceOp.MAX)
        seconds = local.item() / a.iters
        algbw = count * 4 / seconds / 1e9
        results.append({"size_bytes": count * 4, "count": count, "time_us": seconds * 1e6,
                        "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (n - 1) / n})
    if rank == 0:
        print(json.dumps({"benchmark": "allreduce_torch", "backend": "torch-gloo",
                          "torch": torch.__version__, "ranks": n, "results": results}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
