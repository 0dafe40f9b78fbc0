#include "lockstep/collectives/shm/shm_pool.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "lockstep/runtime/error.h"

namespace lockstep::collectives::shm {
namespace {

// Tensors start on cache lines, so that two never share one.
constexpr size_t kAlign = 64;

size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

Pool::Pool(int rank, std::vector<Segment> segments) : rank_(rank), segments_(std::move(segments)) {
  LOCKSTEP_ASSERT(rank_ >= 0 && static_cast<size_t>(rank_) < segments_.size());
  const size_t usable = segments_[static_cast<size_t>(rank_)].size() / kAlign * kAlign;
  if (usable > 0) free_[0] = usable;
}

size_t Pool::segment_bytes(size_t bytes) { return round_up(bytes); }

// First fit: a pool holds a few large buckets, allocated in the same order
// every iteration, so the free list stays short.
runtime::Tensor Pool::empty(const runtime::Shape& shape, runtime::DType dtype) {
  const size_t nbytes = static_cast<size_t>(runtime::shape_numel(shape)) * runtime::dtype_size(dtype);
  const size_t bytes = round_up(std::max<size_t>(nbytes, 1));
  size_t offset = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = free_.begin();
    while (it != free_.end() && it->second < bytes) ++it;
    if (it == free_.end()) return {};
    offset = it->first;
    const size_t left = it->second - bytes;
    free_.erase(it);
    if (left > 0) free_[offset + bytes] = left;
    used_ += bytes;
  }
  auto storage = std::make_shared<runtime::Storage>(
      at(rank_, static_cast<int64_t>(offset)), nbytes, runtime::Device::cpu(),
      [pool = shared_from_this(), offset, bytes] { pool->release(offset, bytes); });
  return runtime::Tensor(std::make_shared<runtime::TensorImpl>(
      std::move(storage), shape, runtime::contiguous_strides(shape), 0, dtype));
}

void Pool::release(size_t offset, size_t bytes) {
  std::lock_guard lock(mutex_);
  used_ -= bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + bytes == next->first) {  // join the block after
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {  // join the block before
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += bytes;
      return;
    }
  }
  free_[offset] = bytes;
}

bool Pool::holds(const runtime::Tensor& t) const {
  return t.defined() && t.device().is_cpu() &&
         offset_of(t.raw_data(), static_cast<size_t>(t.numel()) * t.element_size()) >= 0;
}

size_t Pool::capacity_bytes() const { return segments_[static_cast<size_t>(rank_)].size(); }

size_t Pool::used_bytes() const {
  std::lock_guard lock(mutex_);
  return used_;
}

int64_t Pool::offset_of(const void* data, size_t bytes) const {
  const auto base = reinterpret_cast<uintptr_t>(segments_[static_cast<size_t>(rank_)].data());
  const auto p = reinterpret_cast<uintptr_t>(data);
  if (p < base || p + bytes > base + capacity_bytes()) return -1;
  return static_cast<int64_t>(p - base);
}

std::byte* Pool::at(int q, int64_t offset) const {
  return static_cast<std::byte*>(segments_[static_cast<size_t>(q)].data()) + offset;
}

}  // namespace lockstep::collectives::shm
