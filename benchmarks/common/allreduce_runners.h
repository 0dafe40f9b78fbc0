// The all-reduce paths allreduce_perf times: lockstep's process groups and,
// as peers, the libraries they wrap called directly (no lockstep layer).
//
//   gloo, mpi, shm, nccl
//                 lockstep::collectives::init_process_group() with that backend;
//                 on a CUDA device nccl takes the tensor as is, the others stage
//                 it through pinned host memory
//   raw-mpi       MPI_Allreduce(MPI_IN_PLACE, ...) on MPI_COMM_WORLD
//   raw-gloo      gloo::allreduce on a gloo context of its own (gloo's file
//                 store under /tmp for rendezvous, the same TCP transport)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "lockstep/collectives/types.h"
#include "lockstep/runtime/dtype.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::bench {

class AllreduceRunner {
 public:
  virtual ~AllreduceRunner() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place on the contiguous tensor `data` (on the runner's device). On the
  // CPU it returns when complete; on a CUDA device it may return once the
  // all-reduce is queued (nccl's Work::wait() does not block the host), so
  // synchronize the device before reading the clock.
  virtual void allreduce(runtime::Tensor& data, collectives::ReduceOp op) = 0;
  virtual void barrier() = 0;
  // The maximum of `value` over all ranks (for timings).
  virtual double max_over_ranks(double value) = 0;
  // Collective: a CPU tensor of `count` elements from the group's shared
  // pool, which its all-reduce reads in place (lockstep's shm and shm+gloo);
  // undefined where there is none.
  virtual runtime::Tensor shared_tensor(int64_t /*count*/, runtime::DType /*dtype*/) { return {}; }
};

// Backends this build can run, for --help.
std::vector<std::string> runner_names();

// Throws lockstep::Error naming the backend and what is missing. With a CUDA
// `device` (already the current device) only lockstep's groups run; the raw
// library runners take CPU memory.
std::unique_ptr<AllreduceRunner> make_runner(const std::string& backend,
                                             const runtime::Device& device = runtime::Device::cpu());

}  // namespace lockstep::bench
