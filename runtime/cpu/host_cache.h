// A cache of large host blocks for CPU tensor storage.
//
// glibc serves a large request with fresh mmap()ed pages, or trims the heap
// once such a block is freed, so a training loop that frees and allocates the
// same activation sizes every step pays a page fault (about 2 us on a VM) for
// every 4 KiB of them, every step: a sixth of a small CNN's step time. Blocks
// of at least kMinCachedBytes are kept when freed, in one list per size
// class, and handed out again for the next request of the same class; a
// request is rounded up to its class, at most 1/8 larger. Smaller requests go
// straight to malloc, whose bins already reuse memory.
//
// Cached (free) memory is bounded: LOCKSTEP_HOST_CACHE_MB, 1024 by default,
// 0 turns caching off; a freed block that would pass the bound goes back to
// the system. When the system is out of memory the cache is emptied and the
// allocation tried once more. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::runtime::cpu {

inline constexpr std::size_t kMinCachedBytes = std::size_t{64} << 10;

// The bytes a request occupies: its class for cached sizes, else itself.
std::size_t host_block_size(std::size_t bytes);

// 64-byte aligned memory for at least `bytes` bytes (> 0); nullptr when the
// system has none even after the cache was emptied.
void* host_alloc(std::size_t bytes);
// Gives back memory from host_alloc(bytes), with the same `bytes`.
void host_free(void* ptr, std::size_t bytes);

// Returns every cached block to the system.
void host_empty_cache();

struct HostCacheStats {
  std::size_t cached_bytes = 0;  // free blocks held
  std::size_t limit_bytes = 0;   // the bound on cached_bytes
  std::uint64_t hits = 0;        // cacheable requests served from the cache
  std::uint64_t misses = 0;      // ... that went to the system
  std::size_t in_use_bytes = 0;  // handed out by host_alloc, not yet freed
  std::size_t peak_bytes = 0;    // the most in use since the last reset_host_peak()
};
HostCacheStats host_cache_stats();
// Starts a new peak: peak_bytes becomes in_use_bytes.
void reset_host_peak();

// Sets the bound (tests; LOCKSTEP_HOST_CACHE_MB sets it at first use) and
// releases cached blocks beyond it.
void set_host_cache_limit(std::size_t bytes);

}  // namespace lockstep::runtime::cpu
