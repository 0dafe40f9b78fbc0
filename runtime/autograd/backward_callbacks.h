// Work to run when the current backward pass ends (PyTorch's
// Variable._execution_engine.queue_callback). DDP's reducer queues its
// "wait for every bucket and write the averaged gradients" step here from the
// first gradient hook of each backward.
#pragma once

#include <functional>
#include <vector>

namespace lockstep::runtime {

class Node;

// True while a backward pass runs on this thread (inside hooks and nodes).
bool in_backward();

// The nodes the backward passes running on this thread started from (the
// loss's grad_fn; a leaf's AccumulateGrad where backward() was called on a
// leaf), outermost first: a hook or a custom backward may run a backward of
// its own inside another. Empty when none runs. Their edges stay while the
// passes run, so the graph they can reach is walkable from them: DDP's
// reducer learns from it which parameters this backward gives a gradient to.
std::vector<const Node*> running_backward_roots();

// Runs `fn` once the backward pass running on this thread has applied every
// node, in the order queued; a callback may queue more. An exception from a
// callback propagates out of backward() and drops the remaining callbacks,
// as one from a node or hook drops them all: a dropped callback is destroyed
// unrun, so what it captures can tell (DDP's reducer learns so that a
// backward failed part-way).
// Throws Error when no backward pass is running.
void queue_backward_callback(std::function<void()> fn);

// As queue_backward_callback, but for the outermost backward pass running on
// this thread: a pass run inside it (a custom backward that recomputes its
// part and backpropagates it, as a reentrant checkpoint does) ends before
// the outer pass has given every gradient.
void queue_outermost_backward_callback(std::function<void()> fn);

}  // namespace lockstep::runtime
