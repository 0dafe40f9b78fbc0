// Work to run when the current backward pass ends (PyTorch's
// Variable._execution_engine.queue_callback). DDP's reducer queues its
// "wait for every bucket and write the averaged gradients" step here from the
// first gradient hook of each backward.
#pragma once

#include <functional>

namespace lockstep::runtime {

// True while a backward pass runs on this thread (inside hooks and nodes).
bool in_backward();

// Runs `fn` once the backward pass running on this thread has applied every
// node, in the order queued; a callback may queue more. An exception from a
// callback propagates out of backward() and drops the remaining callbacks,
// as one from a node or hook drops them all: a dropped callback is destroyed
// unrun, so what it captures can tell (DDP's reducer learns so that a
// backward failed part-way).
// Throws Error when no backward pass is running.
void queue_backward_callback(std::function<void()> fn);

}  // namespace lockstep::runtime
