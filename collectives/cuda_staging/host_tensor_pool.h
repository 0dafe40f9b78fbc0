// HostTensorPool: CPU tensors reused across calls, for staging CUDA tensors
// through a CPU backend. DDP stages the same bucket sizes every step; a fresh
// tensor would pay its first-touch page faults each time (about 30 ms for
// 64 MiB here). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>

#include "lockstep/runtime/tensor.h"

namespace lockstep::collectives {

class HostTensorPool {
 public:
  explicit HostTensorPool(size_t max_cached_bytes = size_t{1} << 30)
      : max_cached_bytes_(max_cached_bytes) {}

  // A contiguous 1-D CPU tensor of `numel` elements of `dtype`, contents
  // unspecified: a cached one that nothing else references, else a new one.
  runtime::Tensor take(runtime::DType dtype, int64_t numel);
  // Offers `t` (from take()) for reuse once its user is done with it. The
  // cache keeps at most max_cached_bytes, dropping the oldest first.
  void give_back(runtime::Tensor t);

  size_t cached_bytes();

 private:
  static size_t nbytes(const runtime::Tensor& t) {
    return static_cast<size_t>(t.numel()) * t.element_size();
  }

  std::mutex mutex_;
  std::deque<runtime::Tensor> free_;  // oldest first
  size_t cached_bytes_ = 0;
  size_t max_cached_bytes_;
};

}  // namespace lockstep::collectives
