// NcclComm: one NCCL communicator (RAII), made through the store, and the
// rules for using and aborting it from several threads.
//
// Threads: the issuing thread enqueues through use(); the watchdog thread
// polls async_error() and may abort() while a use() is blocked inside NCCL
// (a blocking communicator can wait on the host for peers that never come:
// aborting from another thread is NCCL's way to unblock it). abort() first
// waits a short while for the issuing thread to leave NCCL, so that in the
// usual case the handle is never freed under a running call.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

#include <nccl.h>

#include "lockstep/runtime/store/store.h"

namespace lockstep::collectives::detail {

class NcclComm {
 public:
  // Rank 0 makes the ncclUniqueId and publishes it under
  // "<group>/nccl/<instance>/unique_id" (instance: this rank's count of nccl
  // groups of that name, so a group made again under an old name does not
  // read a stale id); every rank then calls ncclCommInitRank on `device`.
  // Waits at most `timeout` for rank 0's id.
  NcclComm(runtime::Store& store, int rank, int size, const std::string& group, int device,
           std::chrono::milliseconds timeout);
  // ncclCommDestroy when healthy; nothing once aborted (abort freed it).
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Runs fn(handle) while holding the communicator; throws lockstep::Error
  // if it was aborted.
  template <class Fn>
  void use(Fn&& fn) {
    std::lock_guard lock(mutex_);
    throw_if_aborted();
    fn(handle_);
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

  std::timed_mutex mutex_;
  ncclComm_t handle_ = nullptr;
  std::atomic<bool> aborted_{false};
  int device_ = 0;
  std::string group_;
};

}  // namespace lockstep::collectives::detail
