#include "lockstep/collectives/shm/shm_group.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include <fmt/format.h>

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

// Runs a group's collectives one at a time, in issue order, on its worker
// thread or on a thread that waits for one (see ShmWork). Shared with the
// Works, which may outlive the group.
class Executor {
 public:
  using Body = std::function<void(shm::Comm&, Clock::time_point deadline)>;
  struct Op {
    std::shared_ptr<Work> work;
    std::string description;
    std::string timeout_message;
    Clock::time_point deadline;
    Body body;
  };

  Executor(std::unique_ptr<shm::Comm> comm, std::string where)
      : comm_(std::move(comm)), where_(std::move(where)) {
    comm_->set_waiters(&waiters_);
  }

  void start() { worker_ = std::thread([this] { work_loop(); }); }

  void submit(Op op) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(op));
    }
    cv_.notify_all();
  }

  // Runs queued collectives on the calling thread until `work` is done, while
  // no other thread runs one; returns early when `deadline` passes.
  void help(Work& work, Clock::time_point deadline) {
    waiters_.fetch_add(1);
    struct Leave {
      std::atomic<int>& waiters;
      ~Leave() { waiters.fetch_sub(1); }
    } leave{waiters_};
    std::unique_lock lock(mutex_);
    while (!work.is_completed() && !stopping_) {
      if (running_) {
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) return;
        continue;
      }
      if (queue_.empty()) return;
      run_head(lock);
    }
  }

  // Marks the group unusable, here and on every rank.
  void fail(const std::string& reason) {
    {
      std::lock_guard lock(mutex_);
      if (failed_.empty()) failed_ = reason;
    }
    comm_->abort(reason);
  }

  // Fails what is still queued, aborts a running collective, joins the worker.
  void stop() {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    if (running_ || !queue_.empty()) {
      lock.unlock();
      fail(fmt::format("{} was destroyed with collectives unfinished", where_));
      lock.lock();
    }
    for (auto& op : queue_) {
      op.work->finish(std::make_exception_ptr(CollectiveError(fmt::format(
          "{} on {}: the group was destroyed before it ran", op.description, where_))));
    }
    queue_.clear();
    lock.unlock();
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
    lock.lock();
    cv_.wait(lock, [&] { return !running_; });  // a helping thread's collective
  }

  shm::Comm& comm() { return *comm_; }

 private:
  void work_loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || (!running_ && !queue_.empty()); });
      if (stopping_) return;
      run_head(lock);
    }
  }

  // Pops the head and runs it with the lock released.
  void run_head(std::unique_lock<std::mutex>& lock) {
    Op op = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    const std::string failed = failed_;
    lock.unlock();
    op.work->finish(run(op, failed));
    lock.lock();
    running_ = false;
    cv_.notify_all();
  }

  std::exception_ptr run(Op& op, const std::string& failed) {
    if (!failed.empty()) {
      return std::make_exception_ptr(CollectiveError(fmt::format(
          "{} on {}: the group is unusable after an earlier failure: {}", op.description, where_,
          failed)));
    }
    try {
      op.body(*comm_, op.deadline);
      return nullptr;
    } catch (const shm::WaitTimeout&) {
      fail(op.timeout_message);
      return std::make_exception_ptr(CollectiveError(op.timeout_message));
    } catch (const std::exception& e) {
      const std::string message = fmt::format("{} failed on {}: {}", op.description, where_, e.what());
      fail(message);
      return std::make_exception_ptr(CollectiveError(message));
    }
  }

  std::unique_ptr<shm::Comm> comm_;
  std::string where_;  // "rank 1 of group 'default' (shm, 4 ranks)"
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool running_ = false;
  bool stopping_ = false;
  std::string failed_;
  std::atomic<int> waiters_{0};  // threads blocked in help(): shm::Comm spins only then
  std::thread worker_;
};

// A Work whose wait() first offers to run its collective on the waiting
// thread: a collective waited for at once then costs no hand-off to the
// worker thread and back, which is most of a small all-reduce's time.
class ShmWork final : public Work {
 public:
  ShmWork(std::string description, Clock::time_point deadline, std::string timeout_message,
          std::function<void()> on_timeout, std::weak_ptr<Executor> executor)
      : Work(std::move(description), deadline, std::move(timeout_message), std::move(on_timeout)),
        deadline_(deadline),
        executor_(std::move(executor)) {}

  void wait() override {
    if (auto executor = executor_.lock()) executor->help(*this, deadline_);
    Work::wait();
  }

 private:
  Clock::time_point deadline_;
  std::weak_ptr<Executor> executor_;
};

class ShmGroup final : public ProcessGroup {
 public:
  ShmGroup(std::shared_ptr<runtime::Store> store, int rank, int size, const std::string& name,
           milliseconds timeout, const ShmOptions& options);
  ~ShmGroup() override { executor_->stop(); }

  std::string backend() const override { return "shm"; }

  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts) override {
    check("allreduce", tensor);
    return submit(next("allreduce", &tensor, to_string(opts.op)), opts.timeout,
                  [t = tensor, op = opts.op](shm::Comm& c, Clock::time_point d) {
                    shm::allreduce(c, span_of(t), op, d);
                  });
  }

  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts) override {
    check("broadcast", tensor);
    check_root("broadcast", opts.root);
    return submit(next("broadcast", &tensor, fmt::format("root {}", opts.root)), opts.timeout,
                  [t = tensor, root = opts.root](shm::Comm& c, Clock::time_point d) {
                    shm::broadcast(c, span_of(t), root, d);
                  });
  }

  std::shared_ptr<Work> reduce(Tensor& tensor, const ReduceOptions& opts) override {
    check("reduce", tensor);
    check_root("reduce", opts.root);
    return submit(next("reduce", &tensor, fmt::format("{}, root {}", to_string(opts.op), opts.root)),
                  opts.timeout,
                  [t = tensor, op = opts.op, root = opts.root](shm::Comm& c, Clock::time_point d) {
                    shm::reduce(c, span_of(t), op, root, d);
                  });
  }

  std::shared_ptr<Work> allgather(Tensor& output, const Tensor& input,
                                  const AllgatherOptions& opts) override {
    check("allgather", input);
    check("allgather", output);
    check_sizes("allgather", "output", output, "input", input);
    return submit(next("allgather", &input, ""), opts.timeout,
                  [out = output, in = input](shm::Comm& c, Clock::time_point d) {
                    shm::allgather(c, span_of(in), out.raw_data(), d);
                  });
  }

  std::shared_ptr<Work> reduce_scatter(Tensor& output, const Tensor& input,
                                       const ReduceScatterOptions& opts) override {
    check("reduce_scatter", input);
    check("reduce_scatter", output);
    check_sizes("reduce_scatter", "input", input, "output", output);
    return submit(next("reduce_scatter", &output, to_string(opts.op)), opts.timeout,
                  [out = output, in = input, op = opts.op](shm::Comm& c, Clock::time_point d) {
                    shm::reduce_scatter(c, span_of(out), in.raw_data(), op, d);
                  });
  }

  std::shared_ptr<Work> barrier(const BarrierOptions& opts) override {
    return submit(next("barrier", nullptr, ""), opts.timeout,
                  [](shm::Comm& c, Clock::time_point d) { c.barrier(d); });
  }

  // The pool joins the group's collectives at this point of their sequence
  // on every rank, so all ranks agree on which collectives may read in place.
  std::shared_ptr<SharedTensorPool> reserve_shared_pool(size_t bytes) override {
    auto pool = shm::join_pool(*store_, prefix_, pools_++, rank(), size(), bytes, timeout());
    if (pool == nullptr) return nullptr;
    submit(fmt::format("adding shared pool #{}", pools_), {},
           [pool](shm::Comm& c, Clock::time_point) { c.add_pool(pool); })
        ->wait();
    return pool;
  }

  std::shared_ptr<Work> send(const Tensor& tensor, int dst, const SendRecvOptions& opts) override {
    return p2p("send").send(tensor, dst, opts);
  }
  std::shared_ptr<Work> recv(Tensor& tensor, int src, const SendRecvOptions& opts) override {
    return p2p("recv").recv(tensor, src, opts);
  }

 private:
  void check(std::string_view op, const Tensor& t) const {
    check_tensor(op, t);
    LOCKSTEP_CHECK(t.device().is_cpu(),
                   "{} on group '{}': the shm backend takes CPU tensors, got one on {}; move it "
                   "to the CPU or use nccl for CUDA tensors",
                   op, name(), t.device().str());
  }

  // `big` must hold size() times `small`'s elements, of the same dtype.
  void check_sizes(std::string_view op, std::string_view big_name, const Tensor& big,
                   std::string_view small_name, const Tensor& small) const {
    LOCKSTEP_CHECK(big.dtype() == small.dtype(),
                   "{} on group '{}': {} has dtype {} but {} has {}; they must match", op, name(),
                   big_name, runtime::dtype_name(big.dtype()), small_name,
                   runtime::dtype_name(small.dtype()));
    LOCKSTEP_CHECK(big.numel() == small.numel() * size(),
                   "{} on group '{}': {} has {} elements but needs size() * {}.numel() = {} * {} "
                   "= {}",
                   op, name(), big_name, big.numel(), small_name, size(), small.numel(),
                   small.numel() * size());
  }

  std::string next(std::string_view op, const Tensor* t, std::string_view extra) {
    next_seq();
    return describe(op, t, extra);
  }

  std::shared_ptr<Work> submit(std::string description, const Timeout& timeout, Executor::Body body);
  ProcessGroup& p2p(std::string_view op);

  std::shared_ptr<runtime::Store> store_;
  std::string prefix_;  // of this group's keys in the store
  int pools_ = 0;       // reserved so far
  std::shared_ptr<Executor> executor_;
  std::shared_ptr<ProcessGroup> p2p_;  // gloo, for send and recv
};

std::shared_ptr<Work> ShmGroup::submit(std::string description, const Timeout& timeout,
                                       Executor::Body body) {
  const milliseconds t = timeout_of(timeout);
  const auto deadline = Clock::now() + t;
  std::string message = timeout_message(description, t);
  std::weak_ptr<Executor> weak = executor_;
  auto work = std::make_shared<ShmWork>(
      description, deadline, message,
      [weak, message] {
        if (auto executor = weak.lock()) executor->fail(message);
      },
      weak);
  executor_->submit({work, std::move(description), std::move(message), deadline, std::move(body)});
  return work;
}

ProcessGroup& ShmGroup::p2p(std::string_view op) {
  LOCKSTEP_CHECK(p2p_ != nullptr,
                 "{} on group '{}': the shm backend sends point to point through gloo, which is "
                 "not built in; {}",
                 op, name(), LOCKSTEP_HAVE_GLOO ? "this group was made without it" : "build gloo in");
  return *p2p_;
}

ShmGroup::ShmGroup(std::shared_ptr<runtime::Store> store, int rank, int size,
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
  executor_ = std::make_shared<Executor>(
      shm::join_group(*store, prefix_, name, rank, size, timeout, buffer, spin),
      fmt::format("rank {} of group '{}' (shm, {} ranks)", rank, name, size));
#if LOCKSTEP_HAVE_GLOO
  if (options.p2p) p2p_ = make_gloo_group(store, rank, size, name + "/p2p", timeout, "127.0.0.1");
#endif
  executor_->start();
}

}  // namespace

std::shared_ptr<ProcessGroup> make_shm_group(std::shared_ptr<runtime::Store> store, int rank,
                                             int size, const std::string& name,
                                             milliseconds timeout, const ShmOptions& options) {
  return std::make_shared<ShmGroup>(std::move(store), rank, size, name, timeout, options);
}

}  // namespace lockstep::collectives
