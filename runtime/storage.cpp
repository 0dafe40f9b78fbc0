#include "lockstep/runtime/storage.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <utility>

#include "lockstep/runtime/cpu/host_cache.h"
#include "lockstep/runtime/device_backend.h"

namespace lockstep::runtime {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  if (!device.is_cpu()) {
    data_ = device_backend(device).allocate(nbytes, device);
    return;
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
  if (!device_.is_cpu()) {
    if (data_ == nullptr) return;
    try {
      device_backend(device_).free(data_, device_);
    } catch (const std::exception& e) {  // a destructor must not throw
      std::fprintf(stderr, "lockstep: warning: freeing %s storage failed: %s\n",
                   device_.str().c_str(), e.what());
    }
    return;
  }
  cpu::host_free(data_, nbytes_);
}

}  // namespace lockstep::runtime
