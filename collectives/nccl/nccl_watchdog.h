// NcclWatchdog: the thread of an NCCL group that finishes its Works and turns
// NCCL errors and hangs into CollectiveErrors instead of a silent hang.
//
// Every millisecond while collectives are in flight (every 100 ms otherwise)
// it finishes the Works whose end event completed and drops their tensors,
// asks NCCL for an asynchronous error of the communicator (a peer died, the
// network failed, ...), and compares each Work's deadline with the clock. On
// an error or a passed deadline it found itself, under the default
// AsyncErrorHandling (end_process), it ends the process with a report
// (async_error.h) before anything else: no Work is seen failed, so no caller
// goes on with a partly reduced result. Otherwise (fail_works, or an abort
// request of the issuing thread) it aborts, in this order:
//   1. the group is marked unusable (AbortState): later calls throw;
//   2. every Work in flight fails with a CollectiveError naming its op and this
//      rank (the one whose deadline passed: the timeout message);
//   3. the communicator is aborted (ncclCommAbort), which ends this rank's
//      running kernels of it, so their end events complete; having failed the
//      Works first, such a completion never reads as success;
//   4. the Works' tensors are kept until the communication stream is idle:
//      work queued there behind a stalled event may still run and write them.
//      A group destroyed before that leaks them rather than let the caching
//      allocator hand out memory a late kernel writes.
// Only this thread aborts the communicator and drops tensors.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/collectives/abort_state.h"
#include "lockstep/collectives/async_error.h"
#include "lockstep/collectives/nccl/nccl_comm.h"
#include "lockstep/collectives/nccl/nccl_work.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::collectives::detail {

class NcclWatchdog {
 public:
  // `where`: "rank 1 of group 'default' (nccl, 4 ranks)", for messages.
  // `stream`: the communication stream; it and `comm` outlive the watchdog.
  NcclWatchdog(NcclComm& comm, const runtime::cuda::Stream& stream,
               std::shared_ptr<AbortState> abort, std::string where,
               AsyncErrorHandling handling);
  ~NcclWatchdog() { stop(); }
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  // Watches `work` from now on: registered before its collective is enqueued,
  // so that a host that blocks inside NCCL is caught by the deadline too.
  void watch(std::shared_ptr<NcclWork> work);
  // Called by the issuing thread when enqueuing failed: the group is marked
  // unusable at once and the watchdog aborts the communicator as above.
  void request_abort(const std::string& reason);
  // Lets the Works in flight complete or time out, then ends the thread.
  void stop();

 private:
  void run();
  // One round of the checks above; true when nothing is left to watch.
  void check(std::vector<std::shared_ptr<NcclWork>>& works);
  void abort_all(std::vector<std::shared_ptr<NcclWork>>& works, const std::string& reason,
                 const NcclWork* culprit, std::exception_ptr culprit_error);

  void drop_graveyard_when_idle(bool leak_if_busy);

  NcclComm& comm_;
  const runtime::cuda::Stream& stream_;
  std::shared_ptr<AbortState> abort_;
  std::string where_;
  AsyncErrorHandling handling_;
  std::vector<runtime::Tensor> graveyard_;  // tensors of aborted Works (this thread only)

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<NcclWork>> incoming_;  // guarded by mutex_
  std::string abort_request_;                         // guarded by mutex_
  bool stopping_ = false;                             // guarded by mutex_
  std::thread thread_;
};

}  // namespace lockstep::collectives::detail
