#include "lockstep/collectives/cuda_staging/host_tensor_pool.h"

namespace lockstep::collectives {

runtime::Tensor HostTensorPool::take(runtime::DType dtype, int64_t numel) {
  {
    std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      // use_count() == 1: no one else (e.g. a backend thread that ran the
      // collective and has not dropped its handle yet) still holds it.
      if (it->dtype() != dtype || it->numel() != numel || it->use_count() != 1) continue;
      runtime::Tensor t = std::move(*it);
      free_.erase(it);
      cached_bytes_ -= nbytes(t);
      return t;
    }
  }
  return runtime::Tensor::empty({numel}, dtype);
}

void HostTensorPool::give_back(runtime::Tensor t) {
  if (!t.defined() || nbytes(t) > max_cached_bytes_) return;
  std::lock_guard lock(mutex_);
  cached_bytes_ += nbytes(t);
  free_.push_back(std::move(t));
  while (cached_bytes_ > max_cached_bytes_) {
    cached_bytes_ -= nbytes(free_.front());
    free_.pop_front();
  }
}

size_t HostTensorPool::cached_bytes() {
  std::lock_guard lock(mutex_);
  return cached_bytes_;
}

}  // namespace lockstep::collectives
