// CUDA device basics through lockstep/runtime/cuda/device.h. Tagged [gpu]:
// skipped (not failed) where lockstep is built without CUDA or has no device.
#include <catch2/catch.hpp>

#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

#include "lockstep/config.h"
#include "lockstep/runtime/cuda_available.h"
#include "lockstep/runtime/device_backend.h"
#include "support/gpu_skip.h"

#if LOCKSTEP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "lockstep/runtime/cuda/device.h"
#endif

TEST_CASE("a CUDA device is found and round-trips a buffer", "[gpu][cuda]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
#if LOCKSTEP_HAVE_CUDA
  using namespace lockstep::runtime;
  REQUIRE(cuda_device_count() > 0);
  REQUIRE(cuda_available());
  LOCKSTEP_CUDA_CHECK(cudaSetDevice(0));

  constexpr std::size_t n = 1 << 20;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.5f);
  std::vector<float> back(n, -1.0f);

  void* device = nullptr;
  LOCKSTEP_CUDA_CHECK(cudaMalloc(&device, n * sizeof(float)));
  LOCKSTEP_CUDA_CHECK(cudaMemcpy(device, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  LOCKSTEP_CUDA_CHECK(cudaMemcpy(back.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost));
  LOCKSTEP_CUDA_CHECK(cudaFree(device));
  CHECK(back == host);
#endif
}

#if LOCKSTEP_HAVE_CUDA
// Runs everywhere CUDA is built in: the check macro's error must name the call
// and CUDA's message, and must not leave an error behind.
TEST_CASE("LOCKSTEP_CUDA_CHECK throws lockstep::Error with file:line", "[cuda]") {
  try {
    LOCKSTEP_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL("LOCKSTEP_CUDA_CHECK did not throw");
  } catch (const lockstep::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("test_cuda_device.cpp:") != std::string::npos);
    CHECK(what.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(what.find(cudaGetErrorString(cudaErrorInvalidValue)) != std::string::npos);
  }
}
#endif

TEST_CASE("cuda_available never throws for a missing GPU", "[cuda]") {
  bool available = false;
  REQUIRE_NOTHROW(available = lockstep::runtime::cuda_available());
  if (!LOCKSTEP_HAVE_CUDA) CHECK_FALSE(available);
}

// What init_process_group publishes to tell ranks' GPUs apart
// (collectives/backend_choice.h): nvidia-smi's UUID, one per GPU.
TEST_CASE("physical_id names each GPU by its UUID, as nvidia-smi does", "[gpu][cuda]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  using namespace lockstep::runtime;
  const DeviceBackend& backend = device_backend(Device::cuda(0));
  const int count = probe_gpus().count;
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i) {
    ids.push_back(backend.physical_id(Device::cuda(i)));
    INFO("cuda:" << i << ": " << ids.back());
    CHECK(ids.back().rfind("GPU-", 0) == 0);
    CHECK(ids.back().size() == 40);  // "GPU-" and 8-4-4-4-12 hex digits
    CHECK(backend.physical_id(Device::cuda(i)) == ids.back());
  }
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t j = i + 1; j < ids.size(); ++j) CHECK(ids[i] != ids[j]);
}

TEST_CASE("physical_id is empty for a device this process cannot see", "[cuda]") {
  using namespace lockstep::runtime;
  const Device absent = Device::cuda(4096);
  std::string id = "unset";
  REQUIRE_NOTHROW(id = device_backend(absent).physical_id(absent));
  CHECK(id.empty());
}
