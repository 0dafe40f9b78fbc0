// NcclWork: the Work of an NCCL collective, which runs on the group's
// communication stream.
//
//   wait()          makes the calling thread's current stream (of the group's
//                   device) wait for the collective's end event; the host is
//                   not blocked (a barrier's Work does block the host). Throws
//                   the error or timeout the watchdog reported so far; one it
//                   reports later surfaces in exception() and fails every
//                   later call on the group.
//   is_completed()  queries the end event; true too once the watchdog failed it.
//
// The tensors stay referenced until the collective completed (after an abort:
// until the communication stream is idle; see nccl_watchdog.h), so the
// caching allocator cannot hand their memory to anyone else while the
// communication stream may still use it.
#pragma once

#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "lockstep/collectives/abort_state.h"
#include "lockstep/collectives/work.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::collectives::detail {

class NcclWork final : public Work {
 public:
  // `host_wait`: wait() blocks the host until the collective is done (barrier).
  // `abort`: the group's; once it is set, an end event that completes is no
  // success (the abort may have cut the kernel short).
  NcclWork(std::string description, Clock::time_point deadline, std::string timeout_message,
           int device, bool host_wait, std::shared_ptr<AbortState> abort);

  bool is_completed() override;
  void wait_until_done() override;
  bool waits_on_device() const override { return !host_wait_; }

  // Set up by the group while it issues the collective, before arm().
  runtime::cuda::Event& end_event() { return end_; }
  void keep_alive(std::vector<runtime::Tensor> tensors) { tensors_ = std::move(tensors); }
  // The end event is recorded: completion can be read from it from now on.
  void arm() { armed_.store(true, std::memory_order_release); }

  // For the watchdog: finishes the Work once its end event completed; true
  // when it has finished (either way). May throw a CUDA error.
  bool poll();
  bool finished() { return Work::is_completed(); }  // never touches CUDA
  // Hands over the tensors (the watchdog drops them once nothing can touch them).
  std::vector<runtime::Tensor> take_tensors() { return std::exchange(tensors_, {}); }
  Clock::time_point deadline() const { return deadline_; }
  const std::string& timeout_message() const { return timeout_message_; }

 private:
  runtime::cuda::Event end_;
  std::atomic<bool> armed_{false};
  std::vector<runtime::Tensor> tensors_;  // owned by the issuing thread, then the watchdog
  Clock::time_point deadline_;
  std::string timeout_message_;
  int device_;
  bool host_wait_;
  std::shared_ptr<AbortState> abort_;
};

}  // namespace lockstep::collectives::detail
