// SharedTensorPool: memory that one process group's collectives can read in
// place on every rank (ProcessGroup::reserve_shared_pool). On the shm backend
// it lies in shared memory that every rank of the group has mapped, so an
// all-reduce of a tensor taken from it needs no staging copies.
#pragma once

#include <cstddef>

#include "lockstep/runtime/tensor.h"

namespace lockstep::collectives {

class SharedTensorPool {
 public:
  virtual ~SharedTensorPool() = default;
  // A contiguous, uninitialised CPU tensor inside the pool; an undefined
  // Tensor when the pool has no room left (use an ordinary one then). The
  // memory returns to the pool when the last view of the tensor is gone; the
  // pool outlives its group while any tensor of it lives.
  virtual runtime::Tensor empty(const runtime::Shape& shape, runtime::DType dtype) = 0;
  // Whether `t`'s elements lie in this rank's part of the pool.
  virtual bool holds(const runtime::Tensor& t) const = 0;
  virtual size_t capacity_bytes() const = 0;
  virtual size_t used_bytes() const = 0;
};

}  // namespace lockstep::collectives
