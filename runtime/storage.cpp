#include "lockstep/runtime/storage.h"

#include <cstdlib>
#include <new>

namespace lockstep::runtime {

namespace {
constexpr size_t kAlignment = 64;  // a cache line; also enough for AVX-512 loads
}

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  LOCKSTEP_CHECK(device.is_cpu(),
                 "cannot allocate {} bytes on {}: this build of lockstep keeps tensors on the "
                 "CPU only (CUDA storage comes with the GPU path); use Device::cpu()",
                 nbytes, device.str());
  if (nbytes == 0) return;
  size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  data_ = std::aligned_alloc(kAlignment, rounded);
  if (data_ == nullptr)
    throw Error(fmt::format("out of host memory allocating {} bytes", nbytes));
}

Storage::~Storage() { std::free(data_); }

}  // namespace lockstep::runtime
