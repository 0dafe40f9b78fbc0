#include "lockstep/collectives/serial_executor.h"

#include <fmt/format.h>

namespace lockstep::collectives {
namespace {

using Clock = Work::Clock;

// A Work whose wait() first offers to run the queue on the waiting thread.
// Its timeout message is worded only if it times out; it holds what that
// takes (the call, and where), not the group, which may be gone by then.
class ExecutorWork final : public Work {
 public:
  ExecutorWork(const Call& call, std::shared_ptr<const std::string> where,
               std::weak_ptr<SerialExecutor> executor)
      : Work(call.description(), call.deadline + SerialExecutor::kWorkerGrace, ""),
        call_(call),
        where_(std::move(where)),
        executor_(std::move(executor)) {}

 protected:
  void wait_until_done() override {
    if (auto executor = executor_.lock()) executor->help(*this, call_.deadline);
    Work::wait_until_done();
  }

  std::string timeout_text() override { return timeout_message(call_, *where_, ""); }
  void timed_out(const std::string& message) override {
    if (auto executor = executor_.lock()) executor->fail(message);
  }

 private:
  Call call_;
  std::shared_ptr<const std::string> where_;
  std::weak_ptr<SerialExecutor> executor_;
};

}  // namespace

SerialExecutor::SerialExecutor(Hooks hooks)
    : hooks_(std::move(hooks)), where_(std::make_shared<const std::string>(hooks_.where)) {}

SerialExecutor::~SerialExecutor() { stop(); }

void SerialExecutor::start() {
  worker_ = std::thread([this] { work_loop(); });
}

std::shared_ptr<Work> SerialExecutor::submit(Call call, Body body) {
  auto work = std::make_shared<ExecutorWork>(call, where_, weak_from_this());
  {
    std::lock_guard lock(mutex_);
    queue_.push_back({work, std::move(call), std::move(body)});
  }
  cv_.notify_all();
  return work;
}

void SerialExecutor::run_in_order(std::string_view what, const std::function<void()>& fn) {
  Call call;
  call.op = what;
  call.has_tensor = false;
  call.timeout = std::chrono::hours(24);
  call.deadline = Clock::now() + call.timeout;
  submit(std::move(call), [&fn](const Call&) { fn(); })->wait();
}

void SerialExecutor::help(Work& work, Clock::time_point deadline) {
  waiters_.fetch_add(1);
  struct Leave {
    std::atomic<int>& waiters;
    ~Leave() { waiters.fetch_sub(1); }
  } leave{waiters_};
  std::unique_lock lock(mutex_);
  while (!work.is_completed() && !stopping_) {
    if (running_ || !hooks_.run_on_waiter) {
      auto until = deadline;
      const bool may_report = running_ && hooks_.waiting_on && !stall_reported_;
      if (may_report) until = std::min(until, running_since_ + running_call_->stall_report);
      if (cv_.wait_until(lock, until) == std::cv_status::timeout) {
        if (Clock::now() >= deadline) return;
        if (may_report && running_ && !stall_reported_) report_stall(lock);
      }
      continue;
    }
    if (queue_.empty()) return;
    run_head(lock);
  }
}

// Prints the stall line of the running call; the lock is released meanwhile
// (waiting_on takes the backend's own lock).
void SerialExecutor::report_stall(std::unique_lock<std::mutex>& lock) {
  stall_reported_ = true;
  const Call call = *running_call_;
  const auto waited = Clock::now() - running_since_;
  lock.unlock();
  fmt::print(stderr, "{}\n", stall_message(call, hooks_.where, waited, hooks_.waiting_on()));
  std::fflush(stderr);
  lock.lock();
}

void SerialExecutor::fail(const std::string& reason) {
  std::lock_guard lock(hooks_mutex_);
  if (stopped_) {
    hooks_.abort->set(reason);
  } else {
    hooks_.fail(reason);
  }
}

void SerialExecutor::stop() {
  std::unique_lock lock(mutex_);
  if (stopping_ && !worker_.joinable()) return;
  stopping_ = true;
  // A running call whose Work has completed is over: its caller may drop the
  // group before the worker has marked it no longer running.
  if ((running_ && !running_work_->is_completed()) || !queue_.empty()) {
    lock.unlock();
    fail(fmt::format("{} was destroyed with collectives unfinished", hooks_.where));
    lock.lock();
  }
  for (auto& op : queue_) {
    op.work->finish(std::make_exception_ptr(CollectiveError(fmt::format(
        "{} on {}: the group was destroyed before it ran", op.call.description(), hooks_.where))));
  }
  queue_.clear();
  lock.unlock();
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  lock.lock();
  cv_.wait(lock, [&] { return !running_; });  // a helping thread's call
  lock.unlock();
  std::lock_guard hooks_lock(hooks_mutex_);
  stopped_ = true;
}

void SerialExecutor::work_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || (!running_ && !queue_.empty()); });
    if (stopping_) return;
    run_head(lock);
  }
}

// Pops the head and runs it with the lock released.
void SerialExecutor::run_head(std::unique_lock<std::mutex>& lock) {
  Op op = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  running_call_ = &op.call;
  running_work_ = op.work.get();
  running_since_ = Clock::now();
  stall_reported_ = false;
  // Waiters that do not run calls themselves time their stall reports from now.
  if (!hooks_.run_on_waiter) cv_.notify_all();
  lock.unlock();
  op.work->finish(run(op));
  lock.lock();
  running_ = false;
  running_call_ = nullptr;
  running_work_ = nullptr;
  cv_.notify_all();
}

std::exception_ptr SerialExecutor::run(Op& op) {
  if (hooks_.abort->is_set()) {
    return std::make_exception_ptr(
        CollectiveError(fmt::format("{} on {} did not run: the group is unusable because {}",
                                    op.call.description(), hooks_.where, hooks_.abort->reason())));
  }
  std::string message;
  std::exception_ptr error;
  try {
    op.body(op.call);
    return nullptr;
  } catch (const CollectiveError& e) {
    message = e.what();
    error = std::current_exception();
  } catch (const DeadlineExceeded& e) {
    message = timeout_message(op.call, hooks_.where, e.what());
    error = std::make_exception_ptr(CollectiveError(message));
  } catch (const std::exception& e) {
    message = fmt::format("{} failed on {}: {}", op.call.description(), hooks_.where, e.what());
    error = std::make_exception_ptr(CollectiveError(message));
  }
  fail(message);
  return error;
}

}  // namespace lockstep::collectives
