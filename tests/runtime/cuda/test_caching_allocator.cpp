// The caching allocator's bookkeeping on a fake backend (host memory, events
// completed by hand): runs on every machine, with or without CUDA.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lockstep/runtime/cuda/core/caching_allocator_core.h"
#include "lockstep/runtime/cuda/core/error_context.h"

namespace {

using namespace lockstep::runtime::cuda;

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * 1024;

class FakeBackend : public AllocatorBackend {
 public:
  ~FakeBackend() override {
    for (void* p : live) std::free(p);
  }

  void* allocate(int device, std::size_t bytes) override {
    ++allocate_calls;
    if (fail_allocations > 0) {
      --fail_allocations;
      return nullptr;
    }
    if (capacity && used + bytes > *capacity) return nullptr;
    void* p = std::malloc(bytes);
    live.insert(p);
    sizes[p] = bytes;
    used += bytes;
    devices[p] = device;
    return p;
  }
  void deallocate(int device, void* ptr) override {
    REQUIRE(live.count(ptr) == 1);
    CHECK(devices[ptr] == device);
    used -= sizes[ptr];
    live.erase(ptr);
    std::free(ptr);
    ++deallocate_calls;
  }
  EventKey record_event(int, StreamKey stream) override {
    if (fail_record_on == stream) throw lockstep::Error("fake: cannot record an event there");
    const auto id = ++next_event;
    events[id] = {stream, false};
    return reinterpret_cast<EventKey>(id);
  }
  bool event_completed(EventKey event) override { return events.at(key(event)).done; }
  void wait_event(EventKey event) override {
    ++wait_calls;
    events.at(key(event)).done = true;  // as if the host had blocked until the stream got there
  }
  void destroy_event(EventKey event) override { REQUIRE(events.erase(key(event)) == 1); }
  std::string describe_memory(int) override { return "the fake device has no more memory"; }

  // Completes every event recorded on `stream` so far.
  void complete(StreamKey stream) {
    for (auto& [id, e] : events) {
      if (e.stream == stream) e.done = true;
    }
  }

  struct FakeEvent {
    StreamKey stream;
    bool done;
  };
  std::set<void*> live;
  std::map<void*, std::size_t> sizes;
  std::map<void*, int> devices;
  std::map<std::uintptr_t, FakeEvent> events;
  std::uintptr_t next_event = 0;
  std::size_t used = 0;
  std::optional<std::size_t> capacity;
  int fail_allocations = 0;
  int allocate_calls = 0;
  int deallocate_calls = 0;
  int wait_calls = 0;
  std::optional<StreamKey> fail_record_on;  // record_event on this stream throws

 private:
  static std::uintptr_t key(EventKey e) { return reinterpret_cast<std::uintptr_t>(e); }
};

StreamKey stream(int i) { return reinterpret_cast<StreamKey>(static_cast<std::uintptr_t>(i)); }

}  // namespace

TEST_CASE("allocation sizes round to 512 B up to 1 MiB, then to 2 MiB", "[cuda_allocator]") {
  CHECK(round_allocation_size(0) == 512);
  CHECK(round_allocation_size(1) == 512);
  CHECK(round_allocation_size(512) == 512);
  CHECK(round_allocation_size(513) == 1024);
  CHECK(round_allocation_size(1 * MiB) == 1 * MiB);
  CHECK(round_allocation_size(1 * MiB + 1) == 2 * MiB);
  CHECK(round_allocation_size(2 * MiB) == 2 * MiB);
  CHECK(round_allocation_size(5 * MiB + 3) == 6 * MiB);
}

TEST_CASE("small blocks share 2 MiB segments; large ones get their own", "[cuda_allocator]") {
  FakeBackend backend;
  {
    CachingAllocatorCore alloc(backend);
    void* a = alloc.allocate(0, 1000, stream(1));
    void* b = alloc.allocate(0, 100, stream(1));
    CHECK(backend.allocate_calls == 1);
    CHECK(backend.sizes.begin()->second == 2 * MiB);
    CHECK(alloc.block_size(a) == 1024);
    CHECK(alloc.block_size(b) == 512);
    CHECK(static_cast<char*>(b) == static_cast<char*>(a) + 1024);  // split from the same segment

    void* big = alloc.allocate(0, 3 * MiB, stream(1));
    CHECK(backend.allocate_calls == 2);
    CHECK(alloc.block_size(big) == 4 * MiB);

    const AllocatorStats s = alloc.stats(0);
    CHECK(s.allocated_bytes == 1024 + 512 + 4 * MiB);
    CHECK(s.requested_bytes == 1000 + 100 + 3 * MiB);
    CHECK(s.reserved_bytes == 6 * MiB);
    CHECK(s.backend_allocs == 2);
    CHECK(s.cache_hits == 1);  // b came from the first segment's free rest
    CHECK(s.active_blocks == 3);
    alloc.free(a);
    alloc.free(b);
    alloc.free(big);
  }
  CHECK(backend.live.empty());  // the destructor returns every segment
}

TEST_CASE("a freed block is reused for the same class on the same stream", "[cuda_allocator]") {
  FakeBackend backend;
  CachingAllocatorCore alloc(backend);
  void* a = alloc.allocate(0, 4 * KiB, stream(1));
  alloc.free(a);
  void* b = alloc.allocate(0, 4000, stream(1));
  CHECK(b == a);
  void* big = alloc.allocate(0, 10 * MiB, stream(1));
  alloc.free(big);
  void* big2 = alloc.allocate(0, 9 * MiB, stream(1));
  CHECK(big2 == big);
  CHECK(alloc.block_size(big2) == 10 * MiB);
  const AllocatorStats s = alloc.stats(0);
  CHECK(s.backend_allocs == 2);
  CHECK(s.cache_hits == 2);
  CHECK(s.allocations == 4);
  CHECK(s.peak_allocated_bytes == 10 * MiB + 4 * KiB);
  alloc.free(b);
  alloc.free(big2);
}

TEST_CASE("freed neighbours merge back into a whole segment", "[cuda_allocator]") {
  FakeBackend backend;
  CachingAllocatorCore alloc(backend);
  void* a = alloc.allocate(0, 1 * MiB, stream(1));
  void* b = alloc.allocate(0, 512 * KiB, stream(1));
  void* c = alloc.allocate(0, 512 * KiB, stream(1));
  CHECK(backend.allocate_calls == 1);
  alloc.free(a);
  alloc.free(c);
  alloc.free(b);  // merges with both sides
  void* whole = alloc.allocate(0, 1 * MiB, stream(1));
  CHECK(whole == a);
  alloc.free(whole);
  alloc.empty_cache();
  CHECK(backend.live.empty());  // one segment again, so it could be returned
  CHECK(alloc.stats(0).backend_frees == 1);
}

TEST_CASE("memory is not shared across streams, devices or size classes", "[cuda_allocator]") {
  FakeBackend backend;
  CachingAllocatorCore alloc(backend);
  void* a = alloc.allocate(0, 4 * KiB, stream(1));
  alloc.free(a);
  void* other_stream = alloc.allocate(0, 4 * KiB, stream(2));
  void* other_device = alloc.allocate(1, 4 * KiB, stream(1));
  CHECK(other_stream != a);
  CHECK(other_device != a);
  CHECK(backend.devices[other_device] == 1);
  void* big = alloc.allocate(0, 2 * MiB, stream(1));  // a large request: not from the small segment
  CHECK(backend.allocate_calls == 4);
  CHECK(alloc.stats(0).backend_allocs == 3);
  CHECK(alloc.stats(1).backend_allocs == 1);
  alloc.free(other_stream);
  alloc.free(other_device);
  alloc.free(big);
}

TEST_CASE("a block used on other streams is reused only after their events complete",
          "[cuda_allocator]") {
  FakeBackend backend;
  CachingAllocatorCore alloc(backend);
  void* a = alloc.allocate(0, 64 * KiB, stream(1));
  alloc.record_stream(a, stream(2));
  alloc.record_stream(a, stream(3));
  alloc.record_stream(a, stream(2));  // recorded once
  alloc.record_stream(a, stream(1));  // its own stream: nothing to wait for
  alloc.free(a);
  CHECK(backend.events.size() == 2);
  CHECK(alloc.stats(0).pending_blocks == 1);
  CHECK(alloc.stats(0).allocated_bytes == 0);

  void* b = alloc.allocate(0, 64 * KiB, stream(1));
  CHECK(b != a);  // stream 2 and 3 may still use it
  backend.complete(stream(2));
  void* c = alloc.allocate(0, 64 * KiB, stream(1));
  CHECK(c != a);  // stream 3 still may
  CHECK(backend.events.size() == 1);
  backend.complete(stream(3));
  void* d = alloc.allocate(0, 64 * KiB, stream(1));
  CHECK(d == a);
  CHECK(backend.events.empty());
  CHECK(alloc.stats(0).pending_blocks == 0);
  for (void* p : {b, c, d}) alloc.free(p);
}

TEST_CASE("empty_cache returns only cached segments with nothing in use", "[cuda_allocator]") {
  FakeBackend backend;
  CachingAllocatorCore alloc(backend);
  void* kept = alloc.allocate(0, 4 * KiB, stream(1));        // segment 1 stays in use
  void* small_free = alloc.allocate(0, 4 * KiB, stream(2));  // segment 2: cached
  void* large_free = alloc.allocate(0, 8 * MiB, stream(1));  // segment 3: cached
  void* pending = alloc.allocate(0, 4 * MiB, stream(1));     // segment 4: waits for stream 5
  alloc.record_stream(pending, stream(5));
  alloc.free(small_free);
  alloc.free(large_free);
  alloc.free(pending);
  CHECK(alloc.stats(0).reserved_bytes == 2 * MiB + 2 * MiB + 8 * MiB + 4 * MiB);

  alloc.empty_cache();
  AllocatorStats s = alloc.stats(0);
  CHECK(backend.live.size() == 2);
  CHECK(s.reserved_bytes == 2 * MiB + 4 * MiB);
  CHECK(s.backend_frees == 2);
  CHECK(s.allocated_bytes == 4 * KiB);

  backend.complete(stream(5));
  alloc.empty_cache(1);  // another device: nothing happens here
  CHECK(backend.live.size() == 2);
  alloc.empty_cache(0);
  CHECK(backend.live.size() == 1);
  CHECK(alloc.stats(0).reserved_bytes == 2 * MiB);
  alloc.free(kept);
}

TEST_CASE("peak statistics follow the high-water mark and can be reset", "[cuda_allocator]") {
  FakeBackend backend;
  CachingAllocatorCore alloc(backend);
  void* a = alloc.allocate(0, 6 * MiB, stream(1));
  void* b = alloc.allocate(0, 2 * MiB, stream(1));
  alloc.free(a);
  AllocatorStats s = alloc.stats(0);
  CHECK(s.allocated_bytes == 2 * MiB);
  CHECK(s.peak_allocated_bytes == 8 * MiB);
  CHECK(s.peak_reserved_bytes == 8 * MiB);
  alloc.reset_peak_stats(0);
  alloc.empty_cache();
  s = alloc.stats(0);
  CHECK(s.peak_allocated_bytes == 2 * MiB);
  CHECK(s.peak_reserved_bytes == 8 * MiB);
  CHECK(s.reserved_bytes == 2 * MiB);
  alloc.free(b);
}

TEST_CASE("out of memory empties the cache and retries once", "[cuda_allocator]") {
  FakeBackend backend;
  backend.capacity = 10 * MiB;
  CachingAllocatorCore alloc(backend);
  void* cached = alloc.allocate(0, 6 * MiB, stream(1));
  alloc.free(cached);
  // 6 MiB are cached on stream 1; 6 MiB for stream 2 only fit once they are returned.
  void* p = alloc.allocate(0, 6 * MiB, stream(2));
  REQUIRE(p != nullptr);
  AllocatorStats s = alloc.stats(0);
  CHECK(s.oom_retries == 1);
  CHECK(s.backend_frees == 1);
  CHECK(s.reserved_bytes == 6 * MiB);
  alloc.free(p);

  SECTION("a backend that fails only the first attempt") {
    backend.fail_allocations = 1;
    void* q = alloc.allocate(0, 1 * KiB, stream(3));
    CHECK(q != nullptr);
    CHECK(alloc.stats(0).oom_retries == 2);
    alloc.free(q);
  }
  SECTION("failing again throws with the statistics and advice") {
    set_process_rank(3);
    void* held = alloc.allocate(0, 4 * MiB, stream(2));  // from the cache
    try {
      alloc.allocate(0, 7 * MiB, stream(2));
      FAIL("no OutOfMemoryError");
    } catch (const OutOfMemoryError& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("CUDA out of memory on rank 3, device 0"));
      CHECK_THAT(what, Catch::Contains("cannot allocate 7.00 MiB (a 8.00 MiB block"));
      CHECK_THAT(what, Catch::Contains("4.00 MiB allocated in 1 blocks"));
      CHECK_THAT(what, Catch::Contains("6.00 MiB reserved"));
      CHECK_THAT(what, Catch::Contains("the fake device has no more memory"));
      CHECK_THAT(what, Catch::Contains("Reduce the batch"));
    }
    CHECK(alloc.stats(0).allocated_bytes == 4 * MiB);
    alloc.free(held);
  }
}

TEST_CASE("out of memory waits for blocks other streams still use", "[cuda_allocator]") {
  FakeBackend backend;
  backend.capacity = 8 * MiB;
  CachingAllocatorCore alloc(backend);
  void* a = alloc.allocate(0, 6 * MiB, stream(1));
  alloc.record_stream(a, stream(2));
  alloc.free(a);  // waits on stream 2's event, which has not completed
  CHECK(alloc.stats(0).pending_blocks == 1);
  // Only fits once a's segment is given back, which needs stream 2's event.
  void* b = alloc.allocate(0, 6 * MiB, stream(3));
  REQUIRE(b != nullptr);
  CHECK(backend.wait_calls == 1);
  CHECK(alloc.stats(0).pending_blocks == 0);
  CHECK(alloc.stats(0).backend_frees == 1);
  CHECK(backend.events.empty());
  alloc.free(b);
}

TEST_CASE("a request beyond any memory is refused before it is rounded", "[cuda_allocator]") {
  FakeBackend backend;
  CachingAllocatorCore alloc(backend);
  // Rounded up to 2 MiB, this size would wrap around to 0.
  const std::size_t huge = static_cast<std::size_t>(-1) - 5;
  CHECK_THROWS_AS(alloc.allocate(0, huge, stream(1)), OutOfMemoryError);
  CHECK_THROWS_WITH(alloc.allocate(0, huge, stream(1)),
                    Catch::Contains("larger than any device's memory"));
  CHECK(backend.allocate_calls == 0);
  CHECK(alloc.stats(0).active_blocks == 0);
}

TEST_CASE("a block whose event cannot be recorded stays allocated", "[cuda_allocator]") {
  FakeBackend backend;
  CachingAllocatorCore alloc(backend);
  void* a = alloc.allocate(0, 64 * KiB, stream(1));
  alloc.record_stream(a, stream(2));
  alloc.record_stream(a, stream(3));
  backend.fail_record_on = stream(3);
  CHECK_THROWS_WITH(alloc.free(a), Catch::Contains("cannot record an event"));
  CHECK(backend.events.empty());  // stream 2's event was destroyed again
  CHECK(alloc.stats(0).active_blocks == 1);
  CHECK(alloc.block_size(a) == 64 * KiB);  // still allocated: never handed out again
  void* b = alloc.allocate(0, 64 * KiB, stream(1));
  CHECK(b != a);
  backend.fail_record_on.reset();
  alloc.free(a);  // now it can be given back, waiting on both streams
  CHECK(backend.events.size() == 2);
  alloc.free(b);
}

TEST_CASE("freeing a foreign pointer or a block twice is an error", "[cuda_allocator]") {
  FakeBackend backend;
  CachingAllocatorCore alloc(backend);
  void* a = alloc.allocate(0, 1 * KiB, stream(1));
  void* b = alloc.allocate(0, 1 * KiB, stream(1));
  int local = 0;
  CHECK_THROWS_WITH(alloc.free(&local), Catch::Contains("not the start of a block"));
  CHECK_THROWS_WITH(alloc.free(static_cast<char*>(a) + 16),
                    Catch::Contains("not the start of a block"));
  alloc.free(a);
  CHECK_THROWS_WITH(alloc.free(a), Catch::Contains("double free"));
  CHECK_THROWS_WITH(alloc.record_stream(a, stream(2)), Catch::Contains("double free"));
  CHECK(alloc.stats(0).allocated_bytes == 1 * KiB);
  alloc.free(b);
  CHECK_THROWS_AS(alloc.allocate(-1, 1, stream(1)), lockstep::Error);
}

TEST_CASE("CUDA-side error messages carry the rank and file:line", "[cuda_allocator]") {
  set_process_rank(5);
  const std::string what =
      library_error_message("cuBLAS", "cublasCreate(&h)", "/a/b/handle.cpp", 42, "bad");
  CHECK(what == "cuBLAS error on rank 5 at /a/b/handle.cpp:42: cublasCreate(&h) failed: bad");
  CHECK(format_bytes(100) == "100 B");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(3 * MiB) == "3.00 MiB");
}
