#include "lockstep/collectives/nccl/nccl_comm.h"

#include <cstring>

#include <fmt/format.h>

#include "lockstep/collectives/nccl/nccl_check.h"
#include "lockstep/runtime/cuda/device_guard.h"

namespace lockstep::collectives::detail {
namespace {

// How long abort() waits for a use() to leave NCCL before aborting under it.
constexpr std::chrono::milliseconds kAbortGrace{200};
constexpr std::string_view kErrorPrefix = "error ";

ncclUniqueId fetch_unique_id(runtime::Store& store, int rank, const std::string& group,
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
    store.set(key, runtime::Bytes(bytes, bytes + sizeof id));
    return id;
  }
  try {
    store.wait({key}, timeout);
  } catch (const runtime::StoreTimeout&) {
    throw Error(fmt::format(
        "nccl group '{}': rank {} waited {:.3g} s for rank 0's NCCL unique id (store key '{}'); "
        "rank 0 may not have started, may have failed, or may not be making this group with "
        "the nccl backend",
        group, rank, static_cast<double>(timeout.count()) / 1000.0, key));
  }
  const runtime::Bytes bytes = store.get(key);
  const std::string text = runtime::to_string(bytes);
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

NcclComm::NcclComm(runtime::Store& store, int rank, int size, const std::string& group,
                   int device, std::chrono::milliseconds timeout)
    : device_(device), group_(group) {
  const int64_t instance = store.add(fmt::format("{}/nccl/instances/{}", group, rank), 1);
  const std::string key = fmt::format("{}/nccl/{}/unique_id", group, instance);
  const ncclUniqueId id = fetch_unique_id(store, rank, group, key, timeout);
  runtime::cuda::DeviceGuard guard(device);
  try {
    LOCKSTEP_NCCL_CHECK(ncclCommInitRank(&handle_, size, id, rank));
  } catch (const std::exception& e) {
    throw Error(fmt::format(
        "nccl group '{}': rank {} of {} could not create its communicator on cuda:{}: {}. Each "
        "rank needs its own GPU (NCCL refuses two ranks on one device); to share a GPU use "
        "the gloo or shm backend",
        group, rank, size, device, e.what()));
  }
}

NcclComm::~NcclComm() {
  if (aborted_.load() || handle_ == nullptr) return;
  std::lock_guard lock(mutex_);
  try {
    runtime::cuda::DeviceGuard guard(device_);
    if (const ncclResult_t r = ncclCommDestroy(handle_); r != ncclSuccess) {
      fmt::print(stderr, "lockstep: warning: ncclCommDestroy of group '{}' failed: {}\n", group_,
                 ncclGetErrorString(r));
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "lockstep: warning: destroying the NCCL communicator of group '{}': {}\n",
               group_, e.what());
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
  // Not acquired: a use() is stuck inside NCCL, which this abort unblocks.
  std::unique_lock lock(mutex_, std::defer_lock);
  (void)lock.try_lock_for(kAbortGrace);
  ncclResult_t r = ncclSuccess;
  try {
    runtime::cuda::DeviceGuard guard(device_);
    r = ncclCommAbort(handle_);
  } catch (const std::exception&) {  // the device could not be made current: abort anyway
    r = ncclCommAbort(handle_);
  }
  if (r != ncclSuccess) {
    fmt::print(stderr, "lockstep: warning: ncclCommAbort of group '{}' failed: {}\n", group_,
               ncclGetErrorString(r));
  }
}

void NcclComm::throw_if_aborted() const {
  LOCKSTEP_CHECK(!aborted_.load(),
                 "nccl group '{}': the communicator was aborted after an earlier failure", group_);
}

}  // namespace lockstep::collectives::detail
