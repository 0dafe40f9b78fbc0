#include "lockstep/collectives/cuda_staging/staging_group.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

#include "lockstep/collectives/cuda_staging/host_tensor_pool.h"
#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/pinned.h"
#include "lockstep/runtime/cuda/stream.h"

namespace lockstep::collectives {
namespace {

namespace cuda = runtime::cuda;
using Clock = Work::Clock;

size_t nbytes(const Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

cuda::StreamView stream_of(const Tensor& t) { return cuda::current_stream(t.device().index); }

// A CUDA tensor of a call and the host tensor that stands in for it.
struct Staged {
  Tensor device;
  Tensor host;
  bool copy_back = false;  // an output: wait() copies `host` back into `device`
};

// The inner group's Work, plus the copies back (see staging_group.h).
class StagingWork final : public Work {
 public:
  StagingWork(std::shared_ptr<Work> inner, std::vector<Staged> staged,
              std::shared_ptr<HostTensorPool> pool)
      : Work(inner->description(), Clock::time_point::max(), ""),
        inner_(std::move(inner)),
        staged_(std::move(staged)),
        pool_(std::move(pool)) {}

  // The collective has finished; its results reach the CUDA tensors in wait().
  bool is_completed() override {
    if (Work::is_completed()) return true;
    if (!inner_->is_completed()) return false;
    mirror(inner_->exception());
    return true;
  }

  void wait_until_done() override {
    std::lock_guard lock(wait_mutex_);
    if (!copied_back_) {
      try {
        inner_->wait();
      } catch (...) {
        mirror(std::current_exception());
        staged_.clear();  // no results to copy; the memory may still be in the backend's hands
        copied_back_ = true;
        throw;
      }
      mirror(nullptr);
      copy_back();
      copied_back_ = true;
    }
    if (const auto error = exception()) std::rethrow_exception(error);
  }

 private:
  // Finishes this Work as the inner one finished, at the same time.
  void mirror(std::exception_ptr error) {
    finish(std::move(error));
    const auto at = inner_->finished_at();
    std::lock_guard lock(mutex_);
    if (at != Clock::time_point{}) finished_at_ = at;
  }

  // Each result through a pinned buffer, which the pinned cache reuses only
  // once the copy is done: the host does not wait for it.
  void copy_back() {
    for (Staged& s : staged_) {
      if (!s.copy_back || s.host.numel() == 0) continue;
      const size_t bytes = nbytes(s.host);
      cuda::PinnedBuffer pinned(bytes);
      std::memcpy(pinned.data(), s.host.raw_data(), bytes);
      const cuda::StreamView stream = stream_of(s.device);
      cuda::copy_to_device_async(s.device.raw_data(), pinned, bytes, stream);
      // The caller's current stream now may not be the one the tensor's
      // memory was allocated for: if the tensor dies before the copy is done,
      // the allocator must not hand the block to that stream's next user.
      cuda::record_stream(s.device.storage()->data(), stream);
    }
    for (Staged& s : staged_) pool_->give_back(std::move(s.host));
    staged_.clear();
  }

  std::shared_ptr<Work> inner_;
  std::mutex wait_mutex_;
  bool copied_back_ = false;  // guarded by wait_mutex_
  std::vector<Staged> staged_;
  std::shared_ptr<HostTensorPool> pool_;
};

class StagingGroup final : public ProcessGroup {
 public:
  explicit StagingGroup(std::shared_ptr<ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size(), inner->name(), inner->timeout()),
        inner_(std::move(inner)) {
    wraps(*inner_);
  }

  std::string backend() const override { return inner_->backend(); }

  // CPU tensors pass through untouched; CUDA tensors are staged.
  void check_device(std::string_view, const Tensor&) const override {}

 protected:
  // CPU tensors pass through untouched, so the inner group's pool serves them.
  std::shared_ptr<SharedTensorPool> make_shared_pool(size_t bytes) override {
    return inner_->reserve_shared_pool(bytes);
  }

  void abort_peers(const std::string& reason) override { inner_->abort(reason); }

  std::shared_ptr<Work> run_allreduce(Call call, Tensor& tensor, ReduceOp op) override {
    Stager s(*this);
    Tensor t = s.stage(tensor, true, true);
    return s.run([&] { return inner_->allreduce(t, {.op = op, .timeout = call.timeout}); });
  }
  std::shared_ptr<Work> run_broadcast(Call call, Tensor& tensor, int root) override {
    Stager s(*this);
    Tensor t = s.stage(tensor, rank() == root, true);
    return s.run([&] { return inner_->broadcast(t, {.root = root, .timeout = call.timeout}); });
  }
  std::shared_ptr<Work> run_reduce(Call call, Tensor& tensor, ReduceOp op,
                                   int root) override {
    Stager s(*this);
    Tensor t = s.stage(tensor, true, true);
    return s.run(
        [&] { return inner_->reduce(t, {.op = op, .root = root, .timeout = call.timeout}); });
  }
  std::shared_ptr<Work> run_allgather(Call call, Tensor& output,
                                      const Tensor& input) override {
    Stager s(*this);
    Tensor out = s.stage(output, false, true);
    const Tensor in = s.stage(input, true, false);
    return s.run([&] { return inner_->allgather(out, in, {.timeout = call.timeout}); });
  }
  std::shared_ptr<Work> run_reduce_scatter(Call call, Tensor& output, const Tensor& input,
                                           ReduceOp op) override {
    Stager s(*this);
    Tensor out = s.stage(output, false, true);
    const Tensor in = s.stage(input, true, false);
    return s.run(
        [&] { return inner_->reduce_scatter(out, in, {.op = op, .timeout = call.timeout}); });
  }
  std::shared_ptr<Work> run_barrier(Call call) override {
    return inner_->barrier({.timeout = call.timeout});
  }
  std::shared_ptr<Work> run_send(Call call, const Tensor& tensor, int dst,
                                 int tag) override {
    Stager s(*this);
    const Tensor t = s.stage(tensor, true, false);
    return s.run([&] { return inner_->send(t, dst, {.tag = tag, .timeout = call.timeout}); });
  }
  std::shared_ptr<Work> run_recv(Call call, Tensor& tensor, int src, int tag) override {
    Stager s(*this);
    Tensor t = s.stage(tensor, false, true);
    return s.run([&] { return inner_->recv(t, src, {.tag = tag, .timeout = call.timeout}); });
  }

 private:
  // The tensors of one call: stage() each, then run() the inner collective.
  class Stager {
   public:
    explicit Stager(StagingGroup& group) : group_(group) {}

    // What the inner group gets for `t`: `t` itself unless it is a CUDA
    // tensor, else a host tensor of its dtype and size. `in`: its contents
    // matter (copied at run()); `out`: it is written (copied back by wait()).
    Tensor stage(const Tensor& t, bool in, bool out) {
      // The front checked it is contiguous: its bytes are its elements.
      if (!t.defined() || !t.device().is_cuda()) return t;
      Tensor host = group_.pool_->take(t.dtype(), t.numel());
      staged_.push_back({t, host, out});
      if (in) inputs_.push_back(staged_.size() - 1);
      return host;
    }

    // Copies the inputs to the host, issues the inner collective, and wraps
    // its Work when anything was staged.
    std::shared_ptr<Work> run(const std::function<std::shared_ptr<Work>()>& issue) {
      copy_inputs();
      std::shared_ptr<Work> work = issue();
      if (staged_.empty()) return work;
      return std::make_shared<StagingWork>(std::move(work), std::move(staged_), group_.pool_);
    }

   private:
    // Device to pinned on each tensor's current stream, one host wait per
    // stream, then pinned to the host tensors.
    void copy_inputs() {
      std::vector<std::pair<cuda::PinnedBuffer, const Staged*>> copies;
      std::vector<cuda::StreamView> streams;
      for (size_t i : inputs_) {
        const Staged& s = staged_[i];
        if (s.host.numel() == 0) continue;
        cuda::PinnedBuffer pinned(nbytes(s.host));
        const cuda::StreamView stream = stream_of(s.device);
        cuda::copy_to_host_async(pinned, s.device.raw_data(), nbytes(s.host), stream);
        copies.emplace_back(std::move(pinned), &s);
        if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
          streams.push_back(stream);
        }
      }
      for (const auto& stream : streams) cuda::synchronize(stream);
      for (const auto& [pinned, s] : copies) {
        std::memcpy(s->host.raw_data(), pinned.data(), nbytes(s->host));
      }
    }

    StagingGroup& group_;
    std::vector<Staged> staged_;
    std::vector<size_t> inputs_;  // indices into staged_
  };

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<HostTensorPool> pool_ = std::make_shared<HostTensorPool>();
};

}  // namespace

std::shared_ptr<ProcessGroup> make_cuda_staging_group(std::shared_ptr<ProcessGroup> inner) {
  LOCKSTEP_CHECK(inner != nullptr, "make_cuda_staging_group: the group to wrap is null");
  return std::make_shared<StagingGroup>(std::move(inner));
}

}  // namespace lockstep::collectives
