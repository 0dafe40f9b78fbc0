// ForwardingGroup: a group that hands each call to another group's front,
// after a step of its own before each collective (DebugGroup compares every
// rank's call through the store; new_group's Subgroup checks the call as its
// parent's ranks). Point-to-point calls pass straight through: the inner group
// checks and names them.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "lockstep/collectives/process_group.h"

namespace lockstep::collectives {

class ForwardingGroup : public ProcessGroup {
 public:
  explicit ForwardingGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size(), inner->name(), inner->timeout()),
        inner_(std::move(inner)) {
    wraps(*inner_);
  }

  std::string backend() const override { return inner_->backend(); }

 protected:
  std::shared_ptr<SharedTensorPool> make_shared_pool(size_t bytes) override {
    return inner_->reserve_shared_pool(bytes);
  }

  // Runs on the caller's thread before the collective `call` is handed on.
  virtual void before_collective(const Call& call) = 0;
  ProcessGroup& inner() const { return *inner_; }

  void check_device(std::string_view, const Tensor&) const override {}  // the inner front checks
  void abort_peers(const std::string& reason) override { inner_->abort(reason); }

  std::shared_ptr<Work> run_allreduce(Call call, Tensor& tensor, ReduceOp op) final {
    before_collective(call);
    return inner_->allreduce(tensor, {.op = op, .timeout = call.timeout});
  }
  std::shared_ptr<Work> run_broadcast(Call call, Tensor& tensor, int root) final {
    before_collective(call);
    return inner_->broadcast(tensor, {.root = root, .timeout = call.timeout});
  }
  std::shared_ptr<Work> run_reduce(Call call, Tensor& tensor, ReduceOp op, int root) final {
    before_collective(call);
    return inner_->reduce(tensor, {.op = op, .root = root, .timeout = call.timeout});
  }
  std::shared_ptr<Work> run_allgather(Call call, Tensor& output, const Tensor& input) final {
    before_collective(call);
    return inner_->allgather(output, input, {.timeout = call.timeout});
  }
  std::shared_ptr<Work> run_reduce_scatter(Call call, Tensor& output, const Tensor& input,
                                           ReduceOp op) final {
    before_collective(call);
    return inner_->reduce_scatter(output, input, {.op = op, .timeout = call.timeout});
  }
  std::shared_ptr<Work> run_barrier(Call call) final {
    before_collective(call);
    return inner_->barrier({.timeout = call.timeout});
  }
  std::shared_ptr<Work> run_send(Call call, const Tensor& tensor, int dst, int tag) final {
    return inner_->send(tensor, dst, {.tag = tag, .timeout = call.timeout});
  }
  std::shared_ptr<Work> run_recv(Call call, Tensor& tensor, int src, int tag) final {
    return inner_->recv(tensor, src, {.tag = tag, .timeout = call.timeout});
  }

 private:
  std::shared_ptr<ProcessGroup> inner_;
};

}  // namespace lockstep::collectives
