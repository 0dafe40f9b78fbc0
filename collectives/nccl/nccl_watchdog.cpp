#include "lockstep/collectives/nccl/nccl_watchdog.h"

#include <utility>

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "lockstep/runtime/cuda/device.h"

namespace lockstep::collectives::detail {
namespace {

constexpr std::chrono::milliseconds kBusyPoll{1};
constexpr std::chrono::milliseconds kIdlePoll{100};

// NCCL's name for `error`, its last error message, and a hint.
std::string nccl_error_text(ncclResult_t error) {
  std::string text = ncclGetErrorString(error);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') text += fmt::format(" ({})", last);
  if (error == ncclRemoteError) {
    text += ": another rank probably exited or crashed; its own output says why";
  }
  return text;
}

}  // namespace

NcclWatchdog::NcclWatchdog(NcclComm& comm, const runtime::cuda::Stream& stream,
                           std::shared_ptr<AbortState> abort, std::string where,
                           AsyncErrorHandling handling)
    : comm_(comm),
      stream_(stream),
      abort_(std::move(abort)),
      where_(std::move(where)),
      handling_(handling) {
  thread_ = std::thread([this] { run(); });
}

void NcclWatchdog::watch(std::shared_ptr<NcclWork> work) {
  {
    std::lock_guard lock(mutex_);
    incoming_.push_back(std::move(work));
  }
  cv_.notify_one();
}

void NcclWatchdog::request_abort(const std::string& reason) {
  abort_->set(reason);
  {
    std::lock_guard lock(mutex_);
    if (abort_request_.empty()) abort_request_ = reason;
  }
  cv_.notify_one();
}

void NcclWatchdog::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void NcclWatchdog::run() {
  // The current device is per thread, and a new thread's is device 0: its
  // first event query would bind device 0's context, costing every rank of a
  // node hundreds of MiB on GPU 0, and each abort would switch back to it.
  if (const cudaError_t error = cudaSetDevice(comm_.device()); error != cudaSuccess) {
    runtime::detail::warn_cuda_error(error, "cudaSetDevice in the NCCL watchdog");
  }
  std::vector<std::shared_ptr<NcclWork>> works;  // in issue order
  for (;;) {
    std::string request;
    {
      std::unique_lock lock(mutex_);
      cv_.wait_for(lock, works.empty() ? kIdlePoll : kBusyPoll, [&] {
        return !incoming_.empty() || !abort_request_.empty() || (stopping_ && works.empty());
      });
      if (stopping_ && works.empty() && incoming_.empty() && abort_request_.empty()) break;
      for (auto& work : incoming_) works.push_back(std::move(work));
      incoming_.clear();
      request = std::exchange(abort_request_, {});
    }
    if (!request.empty()) {
      abort_all(works, request, nullptr, nullptr);
    } else if (comm_.aborted()) {
      // Issued around an abort (still incoming while abort_all ran): the
      // abort may have cut their kernels short, so their end events say
      // nothing. They fail like the rest.
      abort_all(works, abort_->reason(), nullptr, nullptr);
    } else {
      check(works);
    }
    drop_graveyard_when_idle(false);
  }
  drop_graveyard_when_idle(true);
}

void NcclWatchdog::drop_graveyard_when_idle(bool leak_if_busy) {
  if (graveyard_.empty()) return;
  bool idle = false;
  try {
    idle = stream_.query();
  } catch (const std::exception&) {  // a broken context: nothing will run any more
    idle = true;
  }
  if (idle) {
    graveyard_.clear();
  } else if (leak_if_busy) {
    fmt::print(stderr,
               "lockstep: warning: {}: the communication stream still has work queued after "
               "the abort; keeping {} tensors' memory for good rather than let it be reused\n",
               where_, graveyard_.size());
    (void)new std::vector<runtime::Tensor>(std::move(graveyard_));  // deliberately leaked
  }
}

void NcclWatchdog::check(std::vector<std::shared_ptr<NcclWork>>& works) {
  // Completions, in any order (a later op cannot finish before an earlier one
  // on one stream, but a failed enqueue finishes at once).
  try {
    for (const auto& work : works) work->poll();
  } catch (const std::exception& e) {  // a CUDA error while querying an end event
    const std::string reason = fmt::format("checking a collective's completion failed: {}", e.what());
    on_async_failure(handling_, {where_, reason});  // under end-process, does not return
    abort_all(works, reason, nullptr, nullptr);
    return;
  }
  std::erase_if(works, [&](const std::shared_ptr<NcclWork>& work) {
    if (!work->finished()) return false;
    // Failed on the issuing thread: its abort request is on its way, and the
    // tensors are dropped only after the communicator is aborted.
    if (work->exception() && !comm_.aborted()) return false;
    auto tensors = work->take_tensors();  // dropped here when it succeeded
    if (work->exception()) {
      for (auto& t : tensors) graveyard_.push_back(std::move(t));
    }
    return true;
  });

  const ncclResult_t error = comm_.async_error();
  if (error != ncclSuccess && error != ncclInProgress) {
    NcclWork* culprit = works.empty() ? nullptr : works.front().get();
    const std::string text = nccl_error_text(error);
    const std::string reason =
        culprit != nullptr
            ? fmt::format("{} failed: NCCL reported {}", culprit->description(), text)
            : fmt::format("NCCL reported {}", text);
    std::exception_ptr culprit_error;
    if (culprit != nullptr) {
      culprit_error = std::make_exception_ptr(CollectiveError(fmt::format(
          "{} failed on {}: NCCL reported {}; the communicator was aborted and the group is "
          "unusable: create a new process group on every rank (or restart the job)",
          culprit->description(), where_, text)));
    }
    on_async_failure(handling_, {where_, reason});
    abort_all(works, reason, culprit, culprit_error);
    return;
  }

  const auto now = Work::Clock::now();
  for (const auto& work : works) {
    if (now < work->deadline()) continue;
    const std::string timed_out = work->timeout_message();
    on_async_failure(handling_, {where_, timed_out});
    abort_all(works, fmt::format("{} timed out", work->description()), work.get(),
              std::make_exception_ptr(CollectiveError(
                  fmt::format("{} (nccl: this rank's communicator was aborted)", timed_out))));
    return;
  }
}

void NcclWatchdog::abort_all(std::vector<std::shared_ptr<NcclWork>>& works,
                             const std::string& reason, const NcclWork* culprit,
                             std::exception_ptr culprit_error) {
  abort_->set(reason);
  for (const auto& work : works) {
    if (work.get() == culprit) {
      work->finish(culprit_error);
    } else {
      work->finish(std::make_exception_ptr(CollectiveError(
          fmt::format("{} on {} was aborted: the group became unusable because {}",
                      work->description(), where_, reason))));
    }
  }
  comm_.abort();
  for (const auto& work : works) {
    for (auto& t : work->take_tensors()) graveyard_.push_back(std::move(t));
  }
  works.clear();
}

}  // namespace lockstep::collectives::detail
