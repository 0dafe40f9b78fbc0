// Whether this process can use CUDA. Builds with and without LOCKSTEP_CUDA.
#pragma once

namespace lockstep::runtime {

// False when lockstep was built without CUDA (LOCKSTEP_CUDA off) or no CUDA
// device is usable here; otherwise true. Throws lockstep::Error only for an
// unexpected CUDA failure, never for a missing GPU or driver.
bool cuda_available();

}  // namespace lockstep::runtime
