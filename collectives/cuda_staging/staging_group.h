// make_cuda_staging_group(): lets a CPU backend (gloo, shm, mpi, shm+gloo) take
// CUDA tensors by staging them through host memory, so that e.g. two
// processes sharing one GPU can run DDP on CUDA over gloo (NCCL refuses two
// ranks on one device). init.cpp wraps every CPU backend in it when CUDA is
// built in. Built only with LOCKSTEP_HAVE_CUDA.
//
// For each CUDA tensor of a call:
//   issue   its contents are copied, on the caller's current stream after what
//           is queued there, through a pinned buffer into a host tensor; the
//           host waits for that copy (for the tensor's producers, that is);
//           the inner group then runs the collective on the host tensors.
//   wait()  waits on the host for the inner Work, then queues the copy of each
//           result back to its CUDA tensor (through a pinned buffer, so the
//           host does not wait) on the caller's current stream: work queued
//           there afterwards sees the result.
// CPU tensors go straight through, as does everything else of the inner group
// (backend(), errors, timeouts). Host tensors come from a pool and are reused
// by later calls of the same dtype and size.
#pragma once

#include <memory>

#include "lockstep/collectives/process_group.h"

namespace lockstep::collectives {

std::shared_ptr<ProcessGroup> make_cuda_staging_group(std::shared_ptr<ProcessGroup> inner);

}  // namespace lockstep::collectives
