#include "lockstep/runtime/storage.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <utility>

#include "lockstep/config.h"
#include "lockstep/runtime/cpu/host_cache.h"
#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/device.h"
#endif

namespace lockstep::runtime {

namespace {
#if LOCKSTEP_HAVE_CUDA
// CUDA memory comes from the caching allocator, for use on the device's
// current stream (where ops queue their kernels).
void* cuda_alloc(size_t nbytes, Device device) {
  const int count = cuda_device_count();
  LOCKSTEP_CHECK(count > 0, "cannot allocate {} bytes on {}: {}", nbytes, device.str(),
                 cuda_unavailable_reason());
  LOCKSTEP_CHECK(device.index >= 0 && device.index < count,
                 "cannot allocate on {}: this process sees {} CUDA device(s) (cuda:0 to cuda:{}); "
                 "check the device index and CUDA_VISIBLE_DEVICES",
                 device.str(), count, count - 1);
  return cuda::device_alloc(nbytes, cuda::current_stream(device.index));
}
#endif
}  // namespace

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (device.is_cuda()) {
#if LOCKSTEP_HAVE_CUDA
    if (nbytes > 0) data_ = cuda_alloc(nbytes, device);
    return;
#else
    throw Error(fmt::format("cannot allocate {} bytes on {}: this lockstep was built without "
                            "CUDA; rebuild with -DLOCKSTEP_CUDA=ON or use Device::cpu()",
                            nbytes, device.str()));
#endif
  }
  if (nbytes == 0) return;
  data_ = cpu::host_alloc(nbytes);
  if (data_ == nullptr)
    throw Error(fmt::format("out of host memory allocating {} bytes", nbytes));
}

Storage::Storage(void* data, size_t nbytes, Device device, std::function<void()> release)
    : data_(data), nbytes_(nbytes), device_(device), release_(std::move(release)) {}

Storage::~Storage() {
  if (release_) {
    release_();
    return;
  }
#if LOCKSTEP_HAVE_CUDA
  if (device_.is_cuda()) {
    if (data_ == nullptr) return;
    try {
      cuda::device_free(data_);
    } catch (const std::exception& e) {  // a destructor must not throw
      std::fprintf(stderr, "lockstep: warning: freeing CUDA storage failed: %s\n", e.what());
    }
    return;
  }
#endif
  cpu::host_free(data_, nbytes_);
}

}  // namespace lockstep::runtime
