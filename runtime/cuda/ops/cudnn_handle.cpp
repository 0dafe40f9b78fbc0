#include "lockstep/runtime/cuda/ops/cudnn_handle.h"

#include <mutex>
#include <unordered_map>
#include <vector>

#include "lockstep/runtime/cuda/cudnn_check.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/stream.h"

namespace lockstep::runtime::cuda {
namespace {

// Leaked on purpose: thread-local destructors may run after static ones.
std::mutex& pool_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_map<int, std::vector<cudnnHandle_t>>& pool() {
  static auto* p = new std::unordered_map<int, std::vector<cudnnHandle_t>>;
  return *p;
}

struct ThreadHandles {
  std::unordered_map<int, cudnnHandle_t> by_device;

  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    std::lock_guard<std::mutex> lock(pool_mutex());
    for (auto& [device, handle] : by_device) pool()[device].push_back(handle);
  }

  cudnnHandle_t get(int device) {
    auto it = by_device.find(device);
    if (it != by_device.end()) return it->second;
    cudnnHandle_t h = nullptr;
    {
      std::lock_guard<std::mutex> lock(pool_mutex());
      auto& free = pool()[device];
      if (!free.empty()) h = free.back(), free.pop_back();
    }
    if (h == nullptr) {
      DeviceGuard guard(device);
      LOCKSTEP_CUDNN_CHECK(cudnnCreate(&h));
    }
    by_device.emplace(device, h);
    return h;
  }
};

}  // namespace

cudnnHandle_t cudnn_handle(int device) {
  thread_local ThreadHandles handles;
  cudnnHandle_t h = handles.get(device);
  LOCKSTEP_CUDNN_CHECK(cudnnSetStream(h, current_stream(device).handle));
  return h;
}

cudnnDataType_t cudnn_data_type(DType dtype, const char* op) {
  switch (dtype) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f16: return CUDNN_DATA_HALF;
    default:
      throw Error(fmt::format("{} on CUDA: dtype {} is not supported; use f32, f64, bf16 or f16 "
                              "(convert with .to())",
                              op, dtype_name(dtype)));
  }
}

const void* cudnn_one(DType dtype) {
  static const float f = 1.0f;
  static const double d = 1.0;
  return dtype == DType::f64 ? static_cast<const void*>(&d) : static_cast<const void*>(&f);
}

const void* cudnn_zero(DType dtype) {
  static const float f = 0.0f;
  static const double d = 0.0;
  return dtype == DType::f64 ? static_cast<const void*>(&d) : static_cast<const void*>(&f);
}

}  // namespace lockstep::runtime::cuda
