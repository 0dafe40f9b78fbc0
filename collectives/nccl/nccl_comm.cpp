#include "lockstep/collectives/nccl/nccl_comm.h"

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "lockstep/collectives/nccl/nccl_check.h"
#include "lockstep/runtime/cuda/device_guard.h"

namespace lockstep::collectives::detail {
namespace {

// How long abort() waits for a use() to leave before aborting under it. A
// use() leaves within one poll of the abort (non-blocking calls do not wait
// on peers), so this only bounds a thread stuck for another reason; long, so
// that a descheduled issuing thread is not left polling a freed handle.
constexpr std::chrono::seconds kAbortGrace{10};
// How long the destructor lets NCCL finish its work before aborting instead.
constexpr std::chrono::seconds kFinalizeWait{10};
// Between two polls of a communicator that is still in progress.
constexpr std::chrono::microseconds kPollInterval{50};

// NCCL's last error message for `comm` (may be null), never empty.
std::string last_error(ncclComm_t comm) {
  const char* m = ncclGetLastError(comm);
  return m != nullptr && *m != '\0' ? m : "NCCL gave no detail";
}

// ncclCommGetAsyncError's answer, or its own failure.
ncclResult_t state_of(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  return r != ncclSuccess ? r : state;
}
constexpr std::string_view kErrorPrefix = "error ";

ncclUniqueId fetch_unique_id(distributed::Store& store, int rank, const std::string& group,
                             const std::string& key, std::chrono::milliseconds timeout) {
  ncclUniqueId id{};
  if (rank == 0) {
    try {
      LOCKSTEP_NCCL_CHECK(ncclGetUniqueId(&id));
    } catch (const std::exception& e) {
      store.set(key, fmt::format("{}{}", kErrorPrefix, e.what()));  // the others fail at once
      throw;
    }
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set(key, distributed::Bytes(bytes, bytes + sizeof id));
    return id;
  }
  try {
    store.wait({key}, timeout);
  } catch (const distributed::StoreTimeout&) {
    throw Error(fmt::format(
        "nccl group '{}': rank {} waited {:.3g} s for rank 0's NCCL unique id (store key '{}'); "
        "rank 0 may not have started, may have failed, or may not be making this group with "
        "the nccl backend",
        group, rank, static_cast<double>(timeout.count()) / 1000.0, key));
  }
  const distributed::Bytes bytes = store.get(key);
  const std::string text = distributed::to_string(bytes);
  LOCKSTEP_CHECK(text.rfind(kErrorPrefix, 0) != 0,
                 "nccl group '{}': rank 0 could not create the NCCL unique id: {}", group,
                 text.substr(kErrorPrefix.size()));
  LOCKSTEP_CHECK(bytes.size() == sizeof id,
                 "nccl group '{}': the NCCL unique id under '{}' has {} bytes, expected {}; is "
                 "another job using the same store?",
                 group, key, bytes.size(), sizeof id);
  std::memcpy(&id, bytes.data(), sizeof id);
  return id;
}

}  // namespace

NcclComm::NcclComm(distributed::Store& store, int rank, int size, const std::string& group,
                   int device, std::chrono::milliseconds timeout)
    : device_(device), group_(group) {
  const int64_t instance = store.add(fmt::format("{}/nccl/instances/{}", group, rank), 1);
  const std::string key = fmt::format("{}/nccl/{}/unique_id", group, instance);
  const ncclUniqueId id = fetch_unique_id(store, rank, group, key, timeout);
  runtime::cuda::DeviceGuard guard(device);
  const auto fail = [&](const std::string& why) {
    if (handle_ != nullptr) (void)ncclCommAbort(handle_);
    handle_ = nullptr;
    return Error(fmt::format(
        "nccl group '{}': rank {} of {} could not create its communicator on cuda:{}: {}", group,
        rank, size, device, why));
  };
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // see the header
  ncclResult_t state = ncclCommInitRankConfig(&handle_, size, id, rank, &config);
  if (state == ncclSuccess) state = state_of(handle_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (state == ncclInProgress) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw fail(fmt::format(
          "NCCL did not connect the {} ranks within {:.3g} s; a rank may have died or not be "
          "making this group, or the ranks cannot reach each other (check NCCL_SOCKET_IFNAME "
          "and the firewall; NCCL_DEBUG=INFO shows what NCCL tried)",
          size, static_cast<double>(timeout.count()) / 1000.0));
    }
    std::this_thread::sleep_for(kPollInterval);
    state = state_of(handle_);
  }
  if (state != ncclSuccess) {
    throw fail(fmt::format("{} ({}). Each rank needs its own GPU (NCCL refuses two ranks on one "
                           "device); to share a GPU use the gloo or shm backend",
                           ncclGetErrorString(state), last_error(handle_)));
  }
}

NcclComm::~NcclComm() {
  if (aborted_.load() || handle_ == nullptr) return;
  std::lock_guard lock(mutex_);
  try {
    runtime::cuda::DeviceGuard guard(device_);
    destroy();
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep: warning: destroying the NCCL communicator of group '{}': {}\n",
               group_, e.what());
  }
}

// Finalize (flushes this rank's outstanding work, non-blocking), then free.
// A finalize that fails or does not finish in time is given up for an abort.
void NcclComm::destroy() noexcept {
  ncclResult_t r = ncclCommFinalize(handle_);
  const auto deadline = std::chrono::steady_clock::now() + kFinalizeWait;
  while (r == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(kPollInterval);
    r = state_of(handle_);
  }
  if (r != ncclSuccess) {
    fmt::print(stderr, "lockstep: warning: ncclCommFinalize of group '{}' {}; aborting it\n",
               group_, r == ncclInProgress ? "did not finish" : ncclGetErrorString(r));
    (void)ncclCommAbort(handle_);
    return;
  }
  // Destroy and abort free local resources only; a non-blocking communicator
  // may still answer ncclInProgress for them, which is no failure.
  if (r = ncclCommDestroy(handle_); r != ncclSuccess && r != ncclInProgress) {
    fmt::print(stderr, "lockstep: warning: ncclCommDestroy of group '{}' failed: {}\n", group_,
               ncclGetErrorString(r));
  }
}

ncclResult_t NcclComm::async_error() {
  std::unique_lock lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || aborted_.load()) return ncclSuccess;
  ncclResult_t error = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(handle_, &error);
  return r != ncclSuccess ? r : error;
}

void NcclComm::abort() noexcept {
  if (aborted_.exchange(true) || handle_ == nullptr) return;
  // Not acquired: a use() did not leave in time (stuck inside NCCL); abort anyway.
  std::unique_lock lock(mutex_, std::defer_lock);
  (void)lock.try_lock_for(kAbortGrace);
  ncclResult_t r = ncclSuccess;
  try {
    runtime::cuda::DeviceGuard guard(device_);
    r = ncclCommAbort(handle_);
  } catch (const std::exception&) {  // the device could not be made current: abort anyway
    r = ncclCommAbort(handle_);
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    fmt::print(stderr, "lockstep: warning: ncclCommAbort of group '{}' failed: {}\n", group_,
               ncclGetErrorString(r));
  }
}

void NcclComm::wait_until_ready() {
  for (ncclResult_t state = state_of(handle_); state != ncclSuccess; state = state_of(handle_)) {
    if (state != ncclInProgress)
      throw_nccl_error(state, "ncclCommGetAsyncError", __FILE__, __LINE__);
    // The watchdog gave up on this operation: leave the handle to its abort.
    throw_if_aborted();
    std::this_thread::sleep_for(kPollInterval);
  }
}

void NcclComm::throw_if_aborted() const {
  LOCKSTEP_CHECK(!aborted_.load(),
                 "nccl group '{}': the communicator was aborted after an earlier failure", group_);
}

}  // namespace lockstep::collectives::detail
