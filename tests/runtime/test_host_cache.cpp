// runtime/cpu/host_cache: size classes, reuse of freed large blocks (also
// through tensor storage), the bound on cached memory, and empty_cache.
// The cache is process-wide, so each case uses sizes of its own and checks
// differences of the statistics.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>

#include "lockstep/runtime/cpu/host_cache.h"
#include "lockstep/runtime/tensor.h"

using namespace lockstep::runtime;
using namespace lockstep::runtime::cpu;

namespace {

// Restores the default bound when a case ends.
struct LimitGuard {
  std::size_t saved = host_cache_stats().limit_bytes;
  ~LimitGuard() { set_host_cache_limit(saved); }
};

}  // namespace

TEST_CASE("host cache: size classes are at most 1/8 larger than the request", "[host_cache]") {
  CHECK(host_block_size(1) == 64);
  CHECK(host_block_size(100) == 128);
  CHECK(host_block_size(kMinCachedBytes - 64) == kMinCachedBytes - 64);  // below: malloc's own
  CHECK(host_block_size(kMinCachedBytes) == kMinCachedBytes);
  CHECK(host_block_size(kMinCachedBytes + 1) == kMinCachedBytes + kMinCachedBytes / 8);
  CHECK(host_block_size(std::size_t{6} << 20) == std::size_t{6} << 20);
  std::size_t previous = 0;
  for (std::size_t bytes = kMinCachedBytes; bytes < (std::size_t{64} << 20);
       bytes = bytes * 9 / 8 + 4093) {
    const std::size_t size = host_block_size(bytes);
    INFO(bytes);
    CHECK(size >= bytes);
    CHECK(size % 64 == 0);
    CHECK(size - bytes <= bytes / 8 + 64);
    CHECK(size >= previous);
    CHECK(host_block_size(size) == size);  // a class maps to itself
    previous = size;
  }
}

TEST_CASE("host cache: a freed large block serves the next request of its class", "[host_cache]") {
  LimitGuard guard;
  set_host_cache_limit(std::size_t{256} << 20);
  const std::size_t bytes = (std::size_t{3} << 20) + 12345;
  void* first = host_alloc(bytes);
  REQUIRE(first != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(first) % 64 == 0);
  std::memset(first, 1, bytes);
  host_free(first, bytes);
  const HostCacheStats before = host_cache_stats();
  CHECK(before.cached_bytes >= host_block_size(bytes));

  void* again = host_alloc(bytes - 100);  // same class
  CHECK(again == first);
  const HostCacheStats after = host_cache_stats();
  CHECK(after.hits == before.hits + 1);
  CHECK(after.cached_bytes == before.cached_bytes - host_block_size(bytes));

  void* other = host_alloc(bytes * 2);  // another class: not the cached block
  CHECK(other != first);
  host_free(other, bytes * 2);
  host_free(again, bytes - 100);
}

TEST_CASE("host cache: tensor storage goes through the cache", "[host_cache]") {
  LimitGuard guard;
  set_host_cache_limit(std::size_t{256} << 20);
  const void* data = nullptr;
  {
    Tensor t = Tensor::empty({517, 1031});  // 2 MiB of f32
    data = t.raw_data();
  }
  const auto hits = host_cache_stats().hits;
  Tensor u = Tensor::empty({1031, 517});
  CHECK(u.raw_data() == data);
  CHECK(host_cache_stats().hits == hits + 1);
}

TEST_CASE("host cache: the bound on cached memory and empty_cache", "[host_cache]") {
  LimitGuard guard;
  const std::size_t bytes = (std::size_t{5} << 20) + 777;
  const std::size_t size = host_block_size(bytes);

  set_host_cache_limit(0);  // off: a freed block goes back to the system
  CHECK(host_cache_stats().cached_bytes == 0);
  void* p = host_alloc(bytes);
  host_free(p, bytes);
  CHECK(host_cache_stats().cached_bytes == 0);

  set_host_cache_limit(size + size / 2);  // room for one block of this class, not two
  void* a = host_alloc(bytes);
  void* b = host_alloc(bytes);
  host_free(a, bytes);
  host_free(b, bytes);
  CHECK(host_cache_stats().cached_bytes == size);

  set_host_cache_limit(std::size_t{256} << 20);
  host_empty_cache();
  CHECK(host_cache_stats().cached_bytes == 0);
  const auto misses = host_cache_stats().misses;
  void* c = host_alloc(bytes);
  CHECK(host_cache_stats().misses == misses + 1);
  host_free(c, bytes);
}
