// Storage: one owned allocation on a device, with the version counter that
// autograd uses to detect in-place changes. On the CPU 64-byte aligned host
// memory (large blocks are reused: cpu/host_cache.h); on a CUDA device a
// block of the caching allocator (cuda/caching_allocator.h) for the device's
// current stream. Memory owned elsewhere (a shared-memory pool, say) can be
// adopted with a release callback that runs when the storage dies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "lockstep/runtime/dtype.h"

namespace lockstep::runtime {

class Storage {
 public:
  Storage(size_t nbytes, Device device);
  // Adopts `nbytes` at `data` on `device`; `release` runs once, on whichever
  // thread drops the last reference.
  Storage(void* data, size_t nbytes, Device device, std::function<void()> release);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // Shared by every view of this storage; bumped by each in-place write.
  uint64_t version() const { return version_; }
  void bump_version() { ++version_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  uint64_t version_ = 0;
  std::function<void()> release_;  // adopted memory only
};

}  // namespace lockstep::runtime
