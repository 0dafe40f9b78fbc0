// runtime/cuda on a real device: streams, events, the caching allocator over
// cudaMalloc, pinned buffers and async copies ([gpu]: skipped without a GPU);
// and the checking macros of cuBLAS, cuDNN and NCCL ([cuda]: they need no device,
// only a CUDA build).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "lockstep/config.h"
#include "support/gpu_skip.h"

#if LOCKSTEP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/core/error_context.h"
#include "lockstep/runtime/cuda/cublas_api.h"
#include "lockstep/runtime/cuda/cublas_check.h"
#include "lockstep/runtime/cuda/cudnn_check.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/pinned.h"
#include "lockstep/runtime/cuda/stream.h"
#include "gpu/stream_gate.h"
#endif
#if LOCKSTEP_HAVE_NCCL
#include "lockstep/collectives/nccl/nccl_check.h"
#endif

#if LOCKSTEP_HAVE_CUDA
using namespace lockstep::runtime::cuda;

namespace {

// The message of the lockstep::Error that `fn` throws ("" if none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const lockstep::Error& e) {
    return e.what();
  }
  return {};
}

using lockstep::testing::StreamGate;

}  // namespace

TEST_CASE("the checking macros name the rank, file:line and the library's message", "[cuda]") {
  set_process_rank(2);
  std::string what = error_of([] { LOCKSTEP_CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED); });
  CHECK_THAT(what, Catch::StartsWith("cuBLAS error on rank 2 at "));
  CHECK_THAT(what, Catch::Contains("test_cuda_runtime.cpp:"));
  CHECK_THAT(what, Catch::Contains("CUBLAS_STATUS_NOT_INITIALIZED failed"));
  CHECK_THAT(what, Catch::Contains(lockstep::runtime::cuda::cublas().get_status_string(
                       CUBLAS_STATUS_NOT_INITIALIZED)));

  what = error_of([] { LOCKSTEP_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM); });
  CHECK_THAT(what, Catch::StartsWith("cuDNN error on rank 2 at "));
  CHECK_THAT(what, Catch::Contains("test_cuda_runtime.cpp:"));
  CHECK_THAT(what, Catch::Contains(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM)));

  what = error_of([] { LOCKSTEP_CUDA_CHECK(cudaErrorInvalidValue); });
  CHECK_THAT(what, Catch::StartsWith("CUDA error on rank 2 at "));
  CHECK_THAT(what, Catch::Contains("cudaErrorInvalidValue"));

#if LOCKSTEP_HAVE_NCCL
  what = error_of([] { LOCKSTEP_NCCL_CHECK(ncclInvalidArgument); });
  CHECK_THAT(what, Catch::StartsWith("NCCL error on rank 2 at "));
  CHECK_THAT(what, Catch::Contains("test_cuda_runtime.cpp:"));
  CHECK_THAT(what, Catch::Contains(ncclGetErrorString(ncclInvalidArgument)));
#endif

  // Success passes through without evaluating twice.
  int calls = 0;
  LOCKSTEP_CUBLAS_CHECK((++calls, CUBLAS_STATUS_SUCCESS));
  LOCKSTEP_CUDNN_CHECK((++calls, CUDNN_STATUS_SUCCESS));
  CHECK(calls == 2);
}
#endif

#if LOCKSTEP_HAVE_CUDA
TEST_CASE("cuBLAS opens on first use; a library that cannot serve is named with its reason",
          "[cuda]") {
  namespace lc = lockstep::runtime::cuda;
  const std::vector<std::string> candidates = lc::default_cublas_candidates();
  REQUIRE(candidates.size() == 2);
  CHECK_THAT(candidates[0], Catch::StartsWith("libcublas.so."));
  // No GPU needed: the library loads and answers without one.
  const lc::CublasApi& api = lc::cublas();
  CHECK(std::string(api.get_status_name(CUBLAS_STATUS_NOT_INITIALIZED)) ==
        "CUBLAS_STATUS_NOT_INITIALIZED");
  CHECK(&lc::cublas() == &api);  // once per process

  std::string what =
      error_of([] { lc::load_cublas({"libno-such-blas.so.1", "/no/such/dir/libcublas.so"}); });
  CHECK_THAT(what, Catch::Contains("cuBLAS (for matmul on CUDA) could not be loaded") &&
                       Catch::Contains("libno-such-blas.so.1: ") &&
                       Catch::Contains("/no/such/dir/libcublas.so: ") &&
                       Catch::Contains("LD_LIBRARY_PATH"));
  // A library that loads but is not cuBLAS: the first entry point it lacks.
  what = error_of([] { lc::load_cublas({"libz.so.1"}); });
  CHECK_THAT(what, Catch::Contains("libz.so.1: it has no cublasCreate_v2"));
}
#endif

TEST_CASE("DeviceGuard and StreamGuard set and restore the device and stream", "[gpu][cuda]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  LOCKSTEP_CUDA_CHECK(cudaSetDevice(0));
  {
    DeviceGuard guard(0);
    CHECK(current_device() == 0);
  }
  CHECK(current_stream(0) == StreamView{nullptr, 0});  // legacy default stream
  Stream side(0);
  CHECK(side.handle() != nullptr);
  {
    StreamGuard guard(side);
    CHECK(current_stream() == side.view());
    {
      StreamGuard inner(StreamView{nullptr, 0});
      CHECK(current_stream(0).handle == nullptr);
    }
    CHECK(current_stream(0) == side.view());
  }
  CHECK(current_stream(0).handle == nullptr);
  // Another thread has its own current stream.
  StreamGuard guard(side);
  StreamView seen{side.handle(), 9};
  std::thread([&] { seen = current_stream(0); }).join();
  CHECK(seen.handle == nullptr);
#endif
}

TEST_CASE("streams and events order, query and time work", "[gpu][cuda]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  int least = 0;
  int greatest = 0;
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  Stream high(0, {.priority = greatest});
  CHECK(high.priority() == greatest);
  CHECK_THROWS_WITH(Stream(0, {.priority = greatest - 1}), Catch::Contains("outside"));

  Stream a(0);
  Stream b(0);
  Event start({.timing = true});
  Event done({.timing = true});
  CHECK(done.query());  // nothing recorded yet
  start.record(a);
  StreamGate blocker(a);
  done.record(a);
  done.wait(b);  // b now waits for a
  Event b_done;
  b_done.record(b);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(done.query());
  CHECK_FALSE(b_done.query());
  CHECK_FALSE(a.query());
  blocker.release();
  b_done.synchronize();
  CHECK(done.query());
  CHECK(a.query());
  CHECK(start.elapsed_ms(done) >= 10.0f);
  CHECK_THROWS_WITH(start.elapsed_ms(b_done), Catch::Contains("timing"));
#endif
}

TEST_CASE("the CUDA caching allocator reuses blocks per stream and waits for other streams",
          "[gpu][cuda]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  Stream s1(0);
  Stream s2(0);
  const AllocatorStats before = memory_stats(0);
  void* a = device_alloc(100'000, s1);
  device_free(a);
  void* b = device_alloc(100'000, s1);
  CHECK(b == a);
  void* other = device_alloc(100'000, s2);
  CHECK(other != a);
  CHECK(memory_stats(0).cache_hits >= before.cache_hits + 1);

  // b is used on s2, which is held: freed, it must not come back until s2 ran.
  StreamGate blocker(s2);
  record_stream(b, s2);
  device_free(b);
  void* c = device_alloc(100'000, s1);
  CHECK(c != b);
  blocker.release();
  s2.synchronize();
  void* d = device_alloc(100'000, s1);
  CHECK(d == b);
  for (void* p : {c, d, other}) device_free(p);

  // Blocks other tests left alive may keep their segments: judge empty_cache
  // by the segment of one buffer, made when nothing free is cached.
  empty_cache();
  const auto reserved_before = memory_stats(0).reserved_bytes;
  {
    DeviceBuffer buffer(8 << 20, s1);
    CHECK(memory_stats(0).allocated_bytes >= (8u << 20));
    CHECK(memory_stats(0).reserved_bytes >= reserved_before + (8u << 20));
    LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(buffer.data(), 0, buffer.size(), s1.handle()));
    s1.synchronize();
  }
  CHECK(memory_stats(0).reserved_bytes >= reserved_before + (8u << 20));  // cached, not freed
  empty_cache();
  CHECK(memory_stats(0).reserved_bytes <= reserved_before);  // its segment went back to CUDA

  std::string what;
  try {
    device_alloc(std::size_t{1} << 50, s1);  // 1 PiB
  } catch (const OutOfMemoryError& e) {
    what = e.what();
  }
  CHECK_THAT(what, Catch::Contains("CUDA out of memory on rank"));
  CHECK_THAT(what, Catch::Contains("free of"));
#endif
}

TEST_CASE("pinned buffers round-trip through the device asynchronously", "[gpu][cuda]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  constexpr std::size_t n = 1 << 20;
  Stream stream(0);
  PinnedBuffer host(n * sizeof(float));
  auto* values = static_cast<float*>(host.data());
  std::iota(values, values + n, 0.25f);
  PinnedBuffer back(n * sizeof(float));
  std::memset(back.data(), 0, back.size());

  DeviceBuffer device(n * sizeof(float), stream);
  copy_to_device_async(device.data(), host, n * sizeof(float), stream);
  copy_to_host_async(back, device.data(), n * sizeof(float), stream);
  stream.synchronize();
  CHECK(std::memcmp(back.data(), host.data(), n * sizeof(float)) == 0);

  // Given back after the stream finished, a buffer is reused for the same size.
  void* first = back.data();
  back.reset();        // records an event on `stream` for the copy that used it
  stream.synchronize();  // ... and lets it complete before the next allocation looks
  PinnedBuffer again(n * sizeof(float));
  CHECK(again.data() == first);
  CHECK(pinned_stats().cache_hits >= 1);
  CHECK_THROWS_WITH(copy_to_host_async(again, device.data(), 2 * n * sizeof(float), stream),
                    Catch::Contains("pinned buffer of"));
#endif
}
