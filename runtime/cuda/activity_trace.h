// The CUDA backend's DeviceActivityTrace, over CUPTI's activity API: every
// kernel, memcpy and memset of the process with its device start and end
// times, as PyTorch's profiler (Kineto) records them. CUPTI is opened with
// dlopen when the first trace starts, so that lockstep needs it only then.
#pragma once

#include <memory>

#include "lockstep/runtime/device_backend.h"

namespace lockstep::runtime::cuda {

// Starts a trace. Throws, saying why, where another trace is running, this
// build found no CUPTI headers, or CUPTI cannot be opened: it is looked for
// by its soname, then where this build found it; LOCKSTEP_CUPTI_LIBRARY
// names the file to use instead (e.g. from Python's nvidia-cuda-cupti wheel).
std::unique_ptr<DeviceActivityTrace> start_activity_trace();

}  // namespace lockstep::runtime::cuda
