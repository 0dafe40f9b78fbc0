// Work to run when the current backward pass ends (PyTorch's
// Variable._execution_engine.queue_callback). DDP's reducer queues its
// "wait for every bucket and write the averaged gradients" step here from the
// first gradient hook of each backward.
#pragma once

#include <functional>

namespace lockstep::runtime {

class Node;

// True while a backward pass runs on this thread (inside hooks and nodes).
bool in_backward();

// The node the backward pass running on this thread started from (the
// loss's grad_fn; a leaf's AccumulateGrad where backward() was called on a
// leaf), or null when none runs. Its edges stay while the pass runs, so the
// graph that the pass can reach is walkable from it: DDP's reducer learns
// from it which parameters this backward gives a gradient to.
const Node* current_backward_root();

// Runs `fn` once the backward pass running on this thread has applied every
// node, in the order queued; a callback may queue more. An exception from a
// callback propagates out of backward() and drops the remaining callbacks,
// as one from a node or hook drops them all: a dropped callback is destroyed
// unrun, so what it captures can tell (DDP's reducer learns so that a
// backward failed part-way).
// Throws Error when no backward pass is running.
void queue_backward_callback(std::function<void()> fn);

}  // namespace lockstep::runtime
