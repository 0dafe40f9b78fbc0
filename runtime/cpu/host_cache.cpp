#include "lockstep/runtime/cpu/host_cache.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <functional>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "lockstep/runtime/env.h"

namespace lockstep::runtime::cpu {
namespace {

constexpr std::size_t kAlignment = 64;
constexpr std::size_t kDefaultLimitMb = 1024;

class HostCache {
 public:
  HostCache() {
    const auto mb = read_host_cache_mb();
    limit_ = (mb ? static_cast<std::size_t>(*mb) : kDefaultLimitMb) << 20;
  }

  void* allocate(std::size_t bytes) {
    const std::size_t size = host_block_size(bytes);
    if (size >= kMinCachedBytes) {
      std::lock_guard lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        ++hits_;
        note_alloc(size);
        return p;
      }
      ++misses_;
    }
    void* p = std::aligned_alloc(kAlignment, size);
    if (p == nullptr && size >= kMinCachedBytes) {
      empty();
      p = std::aligned_alloc(kAlignment, size);
    }
    if (p != nullptr) note_alloc(size);
    return p;
  }

  void release(void* ptr, std::size_t bytes) {
    const std::size_t size = host_block_size(bytes);
    in_use_.fetch_sub(size, std::memory_order_relaxed);
    if (size >= kMinCachedBytes) {
      std::lock_guard lock(mutex_);
      if (cached_ + size <= limit_) {
        free_[size].push_back(ptr);
        cached_ += size;
        return;
      }
    }
    std::free(ptr);
  }

  void empty() { trim_to(0); }

  void set_limit(std::size_t bytes) {
    {
      std::lock_guard lock(mutex_);
      limit_ = bytes;
    }
    trim_to(bytes);
  }

  HostCacheStats stats() {
    std::lock_guard lock(mutex_);
    return {cached_, limit_, hits_, misses_, in_use_.load(), peak_.load()};
  }

  void reset_peak() { peak_ = in_use_.load(); }

 private:
  // Frees cached blocks, largest classes first, until at most `bytes` remain.
  void trim_to(std::size_t bytes) {
    std::vector<void*> doomed;
    {
      std::lock_guard lock(mutex_);
      std::vector<std::size_t> sizes;
      for (const auto& [size, blocks] : free_) sizes.push_back(size);
      std::sort(sizes.begin(), sizes.end(), std::greater<>());
      for (std::size_t size : sizes) {
        auto& blocks = free_[size];
        while (cached_ > bytes && !blocks.empty()) {
          doomed.push_back(blocks.back());
          blocks.pop_back();
          cached_ -= size;
        }
      }
    }
    for (void* p : doomed) std::free(p);
  }

  // Counted outside the mutex: small blocks never take it.
  void note_alloc(std::size_t size) {
    const std::size_t now = in_use_.fetch_add(size, std::memory_order_relaxed) + size;
    std::size_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
  }

  std::atomic<std::size_t> in_use_{0};
  std::atomic<std::size_t> peak_{0};
  std::mutex mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;  // by block size
  std::size_t cached_ = 0;
  std::size_t limit_ = 0;
  std::uint64_t hits_ = 0;
  std::uint64_t misses_ = 0;
};

// Never destroyed: tensors in static objects may be freed after it would be.
HostCache& cache() {
  static HostCache* instance = new HostCache();
  return *instance;
}

}  // namespace

std::size_t host_block_size(std::size_t bytes) {
  const std::size_t aligned = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (aligned < kMinCachedBytes) return aligned;
  const std::size_t step = std::bit_floor(aligned) >> 3;  // 8 classes per doubling
  return (aligned + step - 1) / step * step;
}

void* host_alloc(std::size_t bytes) { return cache().allocate(bytes); }
void host_free(void* ptr, std::size_t bytes) {
  if (ptr != nullptr) cache().release(ptr, bytes);
}
void host_empty_cache() { cache().empty(); }
HostCacheStats host_cache_stats() { return cache().stats(); }
void reset_host_peak() { cache().reset_peak(); }
void set_host_cache_limit(std::size_t bytes) { cache().set_limit(bytes); }

}  // namespace lockstep::runtime::cpu
