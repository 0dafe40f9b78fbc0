// From lockstep's dtypes and reduction operators to MPI's.
//
// bf16 and f16 have no MPI datatype: they travel as MPI_UINT16_T and reduce
// through user-defined MPI_Ops that convert each element to float, combine,
// and round back (so a sum of values exact in 16 bits stays exact). Their ops,
// and Min and Max of f32 and f64, are reduce_kernels.h's (a NaN wins). u8 is
// MPI_UINT8_T; bool is MPI_C_BOOL, which MPI reduces only with MPI_LOR and
// MPI_LAND.
#pragma once

#include <mpi.h>

#include "lockstep/collectives/types.h"
#include "lockstep/runtime/dtype.h"

namespace lockstep::collectives::mpi {

// Every lockstep dtype has one.
MPI_Datatype mpi_datatype(runtime::DType dtype);

// The MPI_Op that reduces `dtype` with `op`. Avg maps to the sum: the backend
// divides by the group size afterwards. The user-defined ops (bf16, f16, u8) are
// created on first use; MPI must be initialised.
MPI_Op mpi_op(ReduceOp op, runtime::DType dtype);

}  // namespace lockstep::collectives::mpi
