// The shm backend's collectives, each a sequence of rounds over the ranks'
// staging buffers (shm_comm.h).
//
// The rule that makes them safe without more synchronisation: round t stages
// in half t % 2 of each rank's buffer, every round has at least one barrier,
// and a rank reads round t's staged data only between a barrier of round t
// and its first arrival of round t + 1. A rank refills a half in round t + 2,
// after round t + 1's barrier, by which time every reader of round t is done.
// So ranks never wait for each other except at barriers, and one rank may be
// copying round t + 1 in while a slower one still copies round t out: the
// rounds pipeline. Messages larger than a buffer take several rounds, so a
// 64 MiB all-reduce needs no 64 MiB of scratch. An all-reduce or reduce of
// data that lies in a shared tensor pool on every rank (shm_pool.h) stages
// nothing: ranks read each other's data in place.
//
// Reductions are deterministic: every element is reduced by exactly one
// rank, or by every rank in rank order, so all ranks end with the same bits.
#pragma once

#include <cstddef>

#include "lockstep/collectives/shm/shm_comm.h"
#include "lockstep/collectives/types.h"
#include "lockstep/runtime/dtype.h"

namespace lockstep::collectives::shm {

// What a collective works on: `count` elements of `dtype`.
struct Span {
  void* data;
  size_t count;
  runtime::DType dtype;
};

// At or below this many bytes an all-reduce takes the one-round path.
constexpr size_t kSmallAllreduceBytes = 32 * 1024;

// In place; every rank ends with the reduction.
void allreduce(Comm& comm, Span data, ReduceOp op, Clock::time_point deadline);
// In place on `root`; the other ranks' data is left unspecified.
void reduce(Comm& comm, Span data, ReduceOp op, int root, Clock::time_point deadline);
void broadcast(Comm& comm, Span data, int root, Clock::time_point deadline);
// `output` holds size() * input.count elements, rank q's input at q * count.
void allgather(Comm& comm, Span input, void* output, Clock::time_point deadline);
// `input` holds size() * output.count elements; rank r gets the reduction of
// every rank's r-th chunk.
void reduce_scatter(Comm& comm, Span output, const void* input, ReduceOp op,
                    Clock::time_point deadline);

}  // namespace lockstep::collectives::shm
