#include "lockstep/collectives/shm/shm_group.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "lockstep/collectives/float_average.h"
#include "lockstep/collectives/serial_executor.h"
#include "lockstep/collectives/shm/shm_algorithms.h"
#include "lockstep/collectives/shm/shm_comm.h"
#include "lockstep/collectives/shm/shm_rendezvous.h"
#include "lockstep/config.h"

#if LOCKSTEP_HAVE_GLOO
#include "lockstep/collectives/gloo/gloo_group.h"
#endif

namespace lockstep::collectives {
namespace {

using Clock = Work::Clock;
using std::chrono::milliseconds;

constexpr size_t kDefaultBufferBytes = size_t{1} << 20;
constexpr size_t kMinBufferBytes = 4096;
constexpr int kMaxRanks = 512;  // so that a 4 KiB buffer still holds 8 bytes per rank

shm::Span span_of(const Tensor& t) { return {t.raw_data(), static_cast<size_t>(t.numel()), t.dtype()}; }

class ShmGroup final : public ProcessGroup {
 public:
  ShmGroup(std::shared_ptr<distributed::Store> store, int rank, int size, const std::string& name,
           milliseconds timeout, const ShmOptions& options);
  ~ShmGroup() override {
    executor_->stop();
    comm_->leave();
  }

  std::string backend() const override { return "shm"; }

 protected:
  // The pool joins the group's collectives at this point of their sequence
  // on every rank, so all ranks agree on which collectives may read in place.
  std::shared_ptr<SharedTensorPool> make_shared_pool(size_t bytes) override {
    auto pool = shm::join_pool(*store_, prefix_, pools_++, rank(), size(), bytes, timeout());
    if (pool == nullptr) return nullptr;
    executor_->run_in_order("adding a shared pool", [comm = comm_, pool] { comm->add_pool(pool); });
    return pool;
  }

  std::shared_ptr<Work> run_allreduce(Call call, Tensor& tensor, ReduceOp op) override {
    return submit(std::move(call), [t = tensor, op](shm::Comm& c, Clock::time_point d) {
      const Tensor x = in_reduction_dtype(t, op);
      shm::allreduce(c, span_of(x), op, d);
      write_back(t, x);
    });
  }
  std::shared_ptr<Work> run_broadcast(Call call, Tensor& tensor, int root) override {
    return submit(std::move(call), [t = tensor, root](shm::Comm& c, Clock::time_point d) {
      shm::broadcast(c, span_of(t), root, d);
    });
  }
  std::shared_ptr<Work> run_reduce(Call call, Tensor& tensor, ReduceOp op,
                                   int root) override {
    return submit(std::move(call), [t = tensor, op, root](shm::Comm& c, Clock::time_point d) {
      const Tensor x = in_reduction_dtype(t, op);
      shm::reduce(c, span_of(x), op, root, d);
      write_back(t, x);
    });
  }
  std::shared_ptr<Work> run_allgather(Call call, Tensor& output,
                                      const Tensor& input) override {
    return submit(std::move(call), [out = output, in = input](shm::Comm& c, Clock::time_point d) {
      shm::allgather(c, span_of(in), out.raw_data(), d);
    });
  }
  std::shared_ptr<Work> run_reduce_scatter(Call call, Tensor& output, const Tensor& input,
                                           ReduceOp op) override {
    return submit(std::move(call), [out = output, in = input, op](shm::Comm& c, Clock::time_point d) {
      const Tensor x = in_reduction_dtype(out, op, /*with_values=*/false);
      shm::reduce_scatter(c, span_of(x), in_reduction_dtype(in, op).raw_data(), op, d);
      write_back(out, x);
    });
  }
  std::shared_ptr<Work> run_barrier(Call call) override {
    return submit(std::move(call), [](shm::Comm& c, Clock::time_point d) { c.barrier(d); });
  }
  std::shared_ptr<Work> run_send(Call call, const Tensor& tensor, int dst, int tag) override {
    return p2p("send").send(tensor, dst, {.tag = tag, .timeout = call.timeout});
  }
  std::shared_ptr<Work> run_recv(Call call, Tensor& tensor, int src, int tag) override {
    return p2p("recv").recv(tensor, src, {.tag = tag, .timeout = call.timeout});
  }

  void check_device(std::string_view op, const Tensor& t) const override {
    LOCKSTEP_CHECK(t.device().is_cpu(),
                   "{} on group '{}': the shm backend takes CPU tensors, got one on {}; move it "
                   "to the CPU or use nccl for CUDA tensors",
                   op, name(), t.device().str());
  }

  // The segment's abort word wakes every rank's wait at once; closing the
  // send/recv group's connections wakes a peer waiting in recv from this rank.
  void abort_peers(const std::string& reason) override {
    comm_->abort(reason);
    if (p2p_ != nullptr) p2p_->abort(reason);
  }

 private:
  // Runs `body(comm, deadline)` in issue order with the call check around
  // it: a collective that moved nothing (no elements) still arrives once, so
  // that every call is checked against the other ranks'.
  template <class Body>
  std::shared_ptr<Work> submit(Call call, Body body) {
    return executor_->submit(std::move(call), [comm = comm_, body = std::move(body)](const Call& c) {
      comm->begin_call(c);
      struct Leave {
        shm::Comm& comm;
        bool completed = false;
        ~Leave() { comm.end_call(completed); }
      } leave{*comm};
      body(*comm, c.deadline);
      if (comm->check_pending()) comm->barrier(c.deadline);
      leave.completed = true;
    });
  }
  ProcessGroup& p2p(std::string_view op);

  std::shared_ptr<distributed::Store> store_;
  std::string prefix_;  // of this group's keys in the store
  int pools_ = 0;       // reserved so far
  std::shared_ptr<shm::Comm> comm_;
  std::shared_ptr<SerialExecutor> executor_;
  std::shared_ptr<ProcessGroup> p2p_;  // gloo, for send and recv
};

ProcessGroup& ShmGroup::p2p(std::string_view op) {
  LOCKSTEP_CHECK(p2p_ != nullptr,
                 "{} on group '{}': the shm backend sends point to point through gloo, which is "
                 "not built in; {}",
                 op, name(), LOCKSTEP_HAVE_GLOO ? "this group was made without it" : "build gloo in");
  return *p2p_;
}

ShmGroup::ShmGroup(std::shared_ptr<distributed::Store> store, int rank, int size,
                   const std::string& name, milliseconds timeout, const ShmOptions& options)
    : ProcessGroup(rank, size, name, timeout), store_(store) {
  LOCKSTEP_CHECK(store != nullptr, "shm group '{}': a store is needed for the rendezvous", name);
  LOCKSTEP_CHECK(size <= kMaxRanks, "shm group '{}': {} ranks is more than the {} one node supports",
                 name, size, kMaxRanks);
  const size_t buffer = options.buffer_bytes == 0
                            ? kDefaultBufferBytes
                            : std::max(kMinBufferBytes, (options.buffer_bytes + 63) / 64 * 64);
  const auto spin = options.spin.count() >= 0 ? options.spin : shm::Comm::kDefaultSpin;
  prefix_ = shm::rendezvous_prefix(*store, name, rank);
  comm_ = shm::join_group(*store, prefix_, name, rank, size, this->timeout(), buffer, spin);
  executor_ = std::make_shared<SerialExecutor>(SerialExecutor::Hooks{
      .where = where(),
      .abort = abort_state(),
      .fail = [this](const std::string& reason) { abort(reason); },
  });
  comm_->set_waiters(executor_->waiters());
#if LOCKSTEP_HAVE_GLOO
  if (options.p2p) {
    p2p_ = make_gloo_group(store, rank, size, name + "/p2p", this->timeout(), "127.0.0.1");
  }
#endif
  executor_->start();
}

}  // namespace

std::shared_ptr<ProcessGroup> make_shm_group(std::shared_ptr<distributed::Store> store, int rank,
                                             int size, const std::string& name,
                                             milliseconds timeout, const ShmOptions& options) {
  return std::make_shared<ShmGroup>(std::move(store), rank, size, name, timeout, options);
}

}  // namespace lockstep::collectives
