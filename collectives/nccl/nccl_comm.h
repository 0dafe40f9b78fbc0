// NcclComm: one NCCL communicator (RAII), made through the store, and the
// rules for using and aborting it from several threads.
//
// The communicator is non-blocking (NCCL 2.14+): creating it and enqueuing
// on it return at once, possibly with ncclInProgress, and are then polled
// (ncclCommGetAsyncError) until done. So a rank whose peers never come fails
// its creation after the timeout, naming itself, instead of hanging inside
// ncclCommInitRank.
//
// Threads: the issuing thread enqueues through use(); the watchdog thread
// polls async_error() and may abort() while a use() is still waiting for an
// enqueue to finish. abort() first waits for the issuing thread to leave
// use(), which notices the abort at its next poll, so that the handle is not
// freed under a running call (it gives up waiting after 10 s).
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

#include <nccl.h>

#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives::detail {

class NcclComm {
 public:
  // Rank 0 makes the ncclUniqueId and publishes it under
  // "<group>/nccl/<instance>/unique_id" (instance: this rank's count of nccl
  // groups of that name, so a group made again under an old name does not
  // read a stale id); every rank then calls ncclCommInitRankConfig on
  // `device`. Waits at most `timeout` for rank 0's id, and as long again for
  // NCCL to connect the ranks; throws naming this rank on either timeout.
  NcclComm(distributed::Store& store, int rank, int size, const std::string& group, int device,
           std::chrono::milliseconds timeout);
  // ncclCommDestroy when healthy; nothing once aborted (abort freed it).
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Runs fn(handle) while holding the communicator, then waits until NCCL
  // has finished enqueuing what fn asked for; throws lockstep::Error if the
  // communicator was aborted or NCCL reports an error. fn's NCCL calls may
  // return ncclInProgress (check them with LOCKSTEP_NCCL_CHECK_ASYNC).
  template <class Fn>
  void use(Fn&& fn) {
    std::lock_guard lock(mutex_);
    throw_if_aborted();
    fn(handle_);
    wait_until_ready();
    throw_if_aborted();  // aborted while fn ran: what it enqueued may never run
  }

  // ncclCommGetAsyncError; ncclSuccess once aborted, and while a use() holds
  // the communicator (this is polled again soon).
  ncclResult_t async_error();
  // ncclCommAbort: stops this rank's NCCL kernels of this communicator and
  // frees it. Idempotent and thread-safe; never throws.
  void abort() noexcept;
  bool aborted() const { return aborted_.load(); }
  int device() const { return device_; }

 private:
  void throw_if_aborted() const;
  // Polls ncclCommGetAsyncError while it says ncclInProgress; throws on an
  // error, or once abort() was called.
  void wait_until_ready();
  void destroy() noexcept;

  std::timed_mutex mutex_;
  ncclComm_t handle_ = nullptr;
  std::atomic<bool> aborted_{false};
  int device_ = 0;
  std::string group_;
};

}  // namespace lockstep::collectives::detail
