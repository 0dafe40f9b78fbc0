// The calling thread's cuDNN handle for a device, shared by the cuDNN ops
// (convolutions, batch norm).
#pragma once

#include <cudnn.h>

#include "lockstep/runtime/dtype.h"

namespace lockstep::runtime::cuda {

// The calling thread's cuDNN handle for `device`, bound (cudnnSetStream) to
// the thread's current stream on that device. Call with `device` current.
// Handles come from a process-wide pool, one per device per thread (a handle
// must not be used by two threads at once, and creating one is slow); they
// go back to the pool when the thread ends and are never destroyed.
cudnnHandle_t cudnn_handle(int device);

// The cuDNN data type of a lockstep dtype (f32, f64, bf16, f16); throws
// naming `op` for any other.
cudnnDataType_t cudnn_data_type(DType dtype, const char* op);

// Pointers to 1 and 0 as cuDNN's alpha/beta scaling factors for data of
// `dtype`: double for f64, float for every other dtype.
const void* cudnn_one(DType dtype);
const void* cudnn_zero(DType dtype);

}  // namespace lockstep::runtime::cuda
