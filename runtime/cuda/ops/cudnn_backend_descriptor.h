// RAII for one cuDNN backend (graph API) descriptor: created in the
// constructor, destroyed in the destructor (errors there are ignored:
// destroying a valid descriptor cannot fail). Move-only, so that a finished
// execution plan and the descriptors it was built from can live in a cache.
//
// Setters and getters wrap cudnnBackendSetAttribute / cudnnBackendGetAttribute
// and throw through LOCKSTEP_CUDNN_CHECK. The typed setters fix the C++ type
// that goes with each cuDNN attribute type (an int where cuDNN reads an
// int64_t would be read past); set() takes anything else as cuDNN spells it.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <span>
#include <utility>

#include "lockstep/runtime/cuda/cudnn_check.h"

namespace lockstep::runtime::cuda {

class BackendDescriptor {
 public:
  explicit BackendDescriptor(cudnnBackendDescriptorType_t type) {
    LOCKSTEP_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~BackendDescriptor() { reset(); }
  BackendDescriptor(BackendDescriptor&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  BackendDescriptor& operator=(BackendDescriptor&& other) noexcept {
    if (this != &other) {
      reset();
      d_ = std::exchange(other.d_, nullptr);
    }
    return *this;
  }
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }

  // `count` values of `type` stored at `values`.
  void set(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t count,
           const void* values) {
    LOCKSTEP_CUDNN_CHECK(cudnnBackendSetAttribute(d_, attr, type, count, values));
  }
  void set_int64(cudnnBackendAttributeName_t attr, int64_t value) {
    set(attr, CUDNN_TYPE_INT64, 1, &value);
  }
  void set_int64s(cudnnBackendAttributeName_t attr, std::span<const int64_t> values) {
    set(attr, CUDNN_TYPE_INT64, static_cast<int64_t>(values.size()), values.data());
  }
  void set_data_type(cudnnBackendAttributeName_t attr, cudnnDataType_t value) {
    set(attr, CUDNN_TYPE_DATA_TYPE, 1, &value);
  }
  void set_handle(cudnnBackendAttributeName_t attr, cudnnHandle_t value) {
    set(attr, CUDNN_TYPE_HANDLE, 1, &value);
  }
  // Another descriptor; keep it alive as long as this one (cuDNN may refer to it).
  void set_descriptor(cudnnBackendAttributeName_t attr, const BackendDescriptor& value) {
    const cudnnBackendDescriptor_t d = value.get();
    set(attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  }

  // Reads up to `capacity` values of `type` into `out`; returns how many the
  // attribute has (capacity 0 and a null `out`: just the count). For
  // CUDNN_TYPE_BACKEND_DESCRIPTOR, `out` holds descriptors created by the
  // caller, which cuDNN fills in.
  int64_t get(cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type, int64_t capacity,
              void* out) const {
    int64_t count = 0;
    LOCKSTEP_CUDNN_CHECK(cudnnBackendGetAttribute(d_, attr, type, capacity, &count, out));
    return count;
  }
  int64_t get_int64(cudnnBackendAttributeName_t attr) const {
    int64_t value = 0;
    get(attr, CUDNN_TYPE_INT64, 1, &value);
    return value;
  }

  void finalize() { LOCKSTEP_CUDNN_CHECK(cudnnBackendFinalize(d_)); }
  // finalize() for a descriptor cuDNN may refuse as a matter of course (an
  // engine config that cannot run this graph): returns the status instead of
  // throwing, and drops cuDNN's message about the refusal so that it does not
  // show up in the report of a later, unrelated error.
  cudnnStatus_t try_finalize() {
    const cudnnStatus_t status = cudnnBackendFinalize(d_);
#if CUDNN_MAJOR >= 9  // cuDNN 8 keeps no last-error message
    if (status != CUDNN_STATUS_SUCCESS) {
      char discarded[256];
      cudnnGetLastErrorString(discarded, sizeof discarded);
    }
#endif
    return status;
  }

 private:
  void reset() noexcept {
    if (d_ != nullptr) cudnnBackendDestroyDescriptor(d_);
    d_ = nullptr;
  }

  cudnnBackendDescriptor_t d_ = nullptr;
};

}  // namespace lockstep::runtime::cuda
