// DistributedDataParallel's options and the communication-hook interface.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::nn {

struct DdpOptions {
  // Bucket sizes: the first bucket (the last parameters, whose gradients are
  // ready first) is small so its all-reduce starts early; the rest are larger
  // so that per-call overhead is paid rarely. PyTorch's defaults.
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  // Copy rank 0's buffers (BatchNorm running statistics) to every rank at
  // construction and before each training forward; false: each rank keeps
  // its own, as PyTorch.
  bool broadcast_buffers = true;
  // When backward begins, walk its graph from the tensor it started from and
  // mark the parameters it does not reach as ready, so their buckets are not
  // waited for forever (PyTorch walks from forward's outputs instead).
  bool find_unused_parameters = false;
  // param.grad becomes a view into its bucket: no copy back after the
  // all-reduce, and one copy of the gradients in memory instead of two.
  bool gradient_as_bucket_view = false;
  // The set of used parameters never changes: the graph is walked only until
  // the first averaged backward, whose walk is kept (forwards that no backward
  // follows, evaluations with grad mode on, count for nothing), so parameters
  // it found unused need no find_unused_parameters (as PyTorch: with a static
  // graph that option does not matter).
  bool static_graph = false;
  // Take CPU buckets from memory that the process group's collectives read in
  // place on every rank, where it has such memory (shm backend: a shared pool
  // of twice the gradients' bytes per rank in /dev/shm), so an all-reduce
  // skips its staging copies. Off, or where the pool cannot be had: ordinary
  // memory, staged as before. The results are the same bits either way.
  bool buckets_in_shared_memory = true;
  // Every this many training forwards, check that every rank holds the same
  // parameter bits (a hash of each, one all-gather; verify_replicas_identical
  // in replica_sync.h) and fail on every rank, naming the first parameter
  // that differs and the ranks that hold other bits, so silent corruption or
  // a nondeterministic kernel is caught near where it starts. 0: never.
  int64_t verify_every = 0;
  // Under an nn::Join (uneven inputs), the divisor of the summed gradients.
  // false: the ranks that had a real batch this iteration, so the averaged
  // gradient is the one-process gradient over the concatenation of their
  // batches, as with no Join (after no_sync() iterations, the mean of their
  // counts and this one's; a forward no backward follows counts for
  // nothing). true: always the world size (PyTorch's name
  // and PyTorch's default), so once ranks have joined, their zero gradients
  // shrink the average by active/world. Without a Join both divide by the
  // world size.
  bool divide_by_initial_world_size = false;
};

// One bucket as a communication hook sees it. `buffer` is flat, of one dtype
// and device, and holds this rank's gradients already scaled by 1/divisor
// (the world size, or under a Join the ranks with a real batch; see
// divide_by_initial_world_size); the hook must leave the sum over ranks of
// every rank's buffer in it, or put a tensor holding that sum, of as many
// elements on the same device, in `buffer` (as PyTorch's hooks return
// theirs; it is converted to the bucket's dtype). The GradBucket lives until
// the hook's `then` has run, so `then` may refer to it.
struct GradBucket {
  int index = 0;
  runtime::Tensor buffer;
  std::vector<runtime::Tensor> parameters;  // in bucket order
  std::vector<std::string> names;
  collectives::ProcessGroup& group;  // the DDP's, for the hook's collective
};

// What a hook returns: the collective it started, and what to run once that
// collective has completed (e.g. decompress into bucket.buffer); may be empty.
struct CommHookResult {
  std::shared_ptr<collectives::Work> work;
  std::function<void()> then;
};

using CommHook = std::function<CommHookResult(GradBucket&)>;

namespace comm_hooks {
// The default: all-reduce (sum) of the buffer in place.
CommHook allreduce();
// Compress to f16 or bf16, all-reduce, decompress into the buffer: half the
// bytes on the wire at the cost of rounding. Each rank's contribution is
// rounded once to the wire format (8 significant bits for bf16, 11 for f16:
// a relative error up to 2^-9 or 2^-12) and each of the N - 1 additions once
// more, so an element is off by at most about N * 2^-9 (bf16) or N * 2^-12
// (f16) of the sum of its contributions' magnitudes; the test at 2 ranks
// checks 1.6e-2 and 2e-3 of the expected gradient. f16's range (65504) holds
// gradients already divided by the ranks' count, but not those a GradScaler
// scaled (65536 by default): their sums come back inf and the scaler skips
// steps until its scale fits, as with PyTorch's fp16_compress_hook. Without a
// hook the buckets stay in the parameters' dtype, f32 under autocast too.
CommHook fp16_compress();
CommHook bf16_compress();
}  // namespace comm_hooks

}  // namespace lockstep::nn
