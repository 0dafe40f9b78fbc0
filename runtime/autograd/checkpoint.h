// Activation checkpointing, as torch.utils.checkpoint (non-reentrant): trade
// compute for memory by keeping only a region's inputs in the forward and
// recomputing its activations in backward.
//
//   Tensor y = runtime::checkpoint([&](const Tensor& x) { return (*block)(x); }, x);
//
// The forward runs `fn` once, with grad on, so the graph is whole (DDP's
// unused-parameter walk sees every parameter, and each gradient is accumulated
// once, by the normal engine), but every tensor an op inside saves for
// backward is dropped and kept as its position in the region. The first
// backward node that needs one reruns `fn` on the saved inputs, collecting
// what each op saves, in order; the recomputed graph is discarded.
//
// The recomputation sees what the forward saw: the same autocast state, and
// the same random draws (each generator's reservations are recorded in the
// forward and replayed, whichever generator and whatever other threads drew
// meanwhile; generators are not moved by the replay, and one `fn` seeds is
// put back afterwards, as PyTorch's fork_rng; a generator `fn` creates and
// seeds itself replays as well). It must record the same
// ops: a `fn` whose structure changes between runs throws, as does a `fn` that
// changes its inputs in place, or a generator re-seeded between forward and
// backward. A tensor an op saved that is changed in place before backward (a
// parameter stepped too early) throws, as it does without checkpointing, and
// so does a parameter any op in the region read (under autocast the ops save
// a cast copy, and the recomputation would cast the stepped parameter).
// A tensor the function captures rather than takes as an input (a mask, a
// constant) that a recorded op read and that is changed in place before
// backward throws too, naming its shape; the recomputation would read the new
// values. (An op that records nothing, none of its inputs needing a gradient,
// is not seen: pass such tensors as inputs.) Module train/eval mode is read
// again: do not switch it between forward and backward. Regions do not nest,
// and backward() inside the function is not supported (clear errors: the
// recomputation would run it again). Thread-safe: a region recomputes once,
// under its own lock.
#pragma once

#include <functional>
#include <vector>

#include "lockstep/runtime/tensor.h"

namespace lockstep::runtime {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// fn(inputs), keeping only `inputs` for backward. Without grad mode, fn(inputs).
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

// True on a thread running a checkpoint region's forward or recomputation.
bool in_checkpoint();
// True on a thread running a region's recomputation only: a module with side
// effects beyond its outputs (BatchNorm's running statistics) makes them in
// the forward and not again here.
bool in_checkpoint_recomputation();

}  // namespace lockstep::runtime
