// SerialExecutor: runs a group's collectives one at a time, in issue order
// (the same on every rank), on the group's worker thread or on a thread that
// waits for one. A collective waited for at once then costs no hand-off to
// the worker and back, which is most of a small all-reduce's time on shared
// memory. The shm, gloo and hierarchical backends run on it.
//
// A body that throws fails its call's Work and makes the group unusable: the
// executor calls Hooks::fail (the group's abort(), which keeps the reason and
// tells the peers where the backend can), and every queued or later call
// fails at once without running. What a body throws is worded so:
//   CollectiveError   passes as it is (the backend worded it);
//   DeadlineExceeded  the timeout message (call.h), with what() as its detail;
//   anything else     "<description> failed on <where>: <what()>".
// Shared (shared_ptr) with the Works, which may outlive the group. The hooks
// may use the group: none is called once stop() has returned, so a group
// that calls stop() first in its destructor is safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "lockstep/collectives/abort_state.h"
#include "lockstep/collectives/call.h"
#include "lockstep/collectives/work.h"

namespace lockstep::collectives {

class SerialExecutor : public std::enable_shared_from_this<SerialExecutor> {
 public:
  using Body = std::function<void(const Call&)>;
  struct Hooks {
    std::string where;  // "rank 1 of group 'default' (shm, 4 ranks)"
    std::shared_ptr<AbortState> abort;
    // Makes the group unusable with `reason` and tells the peers.
    std::function<void(const std::string& reason)> fail;
    // Optional, thread-safe: whom the running call waits for. A thread that
    // waits on a Work while another runs the call prints one line once the
    // call has run its stall_report (call.h's stall_message).
    std::function<std::string()> waiting_on;
    // Whether a waiting thread may run queued calls itself. Off, calls run
    // on the worker alone and waiting threads can report stalls.
    bool run_on_waiter = true;
  };

  // How long after a call's deadline its Work gives up by itself. Bodies
  // honour the deadline, so their error, which says who did not arrive,
  // normally comes first; this only guards against a body that is stuck.
  static constexpr std::chrono::milliseconds kWorkerGrace{2000};

  explicit SerialExecutor(Hooks hooks);
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void start();
  // Queues `body` for `call`; the Work it returns runs the queue on the
  // waiting thread when no other thread is running it.
  std::shared_ptr<Work> submit(Call call, Body body);
  // Runs something that must happen at this point of the call sequence on
  // every rank (shm: adding a pool) and waits for it. `what`: a literal.
  void run_in_order(std::string_view what, const std::function<void()>& fn);
  // Fails what is still queued, makes a running call fail (through the
  // group's abort), joins the worker. Called by the group's destructor.
  void stop();

  // Runs queued calls on this thread until `work` is done, while no other
  // thread runs one; returns when `deadline` passes.
  void help(Work& work, Work::Clock::time_point deadline);
  // Makes the group unusable as a failed call does (a Work whose wait()
  // gave up calls it).
  void fail(const std::string& reason);
  // How many threads are blocked in help(), waiting for a result: shm's
  // waits spin only then.
  const std::atomic<int>* waiters() const { return &waiters_; }

 private:
  struct Op {
    std::shared_ptr<Work> work;
    Call call;
    Body body;
  };

  void work_loop();
  void run_head(std::unique_lock<std::mutex>& lock);
  std::exception_ptr run(Op& op);
  void report_stall(std::unique_lock<std::mutex>& lock);

  Hooks hooks_;
  std::shared_ptr<const std::string> where_;  // hooks_.where, shared with the Works
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  bool running_ = false;
  bool stopping_ = false;
  // The running call and its Work (valid while running_), when it started,
  // and whether a waiter reported its stall.
  const Call* running_call_ = nullptr;
  Work* running_work_ = nullptr;
  Work::Clock::time_point running_since_{};
  bool stall_reported_ = false;
  std::atomic<int> waiters_{0};
  std::mutex hooks_mutex_;  // guards calls of hooks_.fail against stop()
  bool stopped_ = false;    // guarded by hooks_mutex_
  std::thread worker_;
};

}  // namespace lockstep::collectives
