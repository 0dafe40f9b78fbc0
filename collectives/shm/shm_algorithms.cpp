#include "lockstep/collectives/shm/shm_algorithms.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "lockstep/collectives/reduce_kernels.h"

namespace lockstep::collectives::shm {
namespace {

std::byte* at(void* base, size_t elements, size_t element_size) {
  return static_cast<std::byte*>(base) + elements * element_size;
}

const std::byte* at(const void* base, size_t elements, size_t element_size) {
  return static_cast<const std::byte*>(base) + elements * element_size;
}

// [begin, end) of rank q's share of a block of k elements starting at b0.
struct Slice {
  size_t begin;
  size_t end;
  size_t size() const { return end - begin; }
};

Slice slice_of(size_t b0, size_t k, int q, int n) {
  return {b0 + k * static_cast<size_t>(q) / static_cast<size_t>(n),
          b0 + k * (static_cast<size_t>(q) + 1) / static_cast<size_t>(n)};
}

/* One round for small messages (latency first).
 *
 *   every rank copies its whole input into its staging buffer; barrier;
 *   every rank (or only the root, for reduce) reduces all the staged copies,
 *   in rank order, into its own output.
 *
 * One barrier, and each rank reads N copies: cheap when the message fits in
 * cache, and the rank order gives every rank the same bits. */
void reduce_one_round(Comm& comm, Span data, ReduceOp op, int root, Clock::time_point deadline) {
  const size_t bytes = data.count * runtime::dtype_size(data.dtype);
  const int half = comm.next_half();
  std::memcpy(comm.buffer(comm.rank(), half), data.data, bytes);
  comm.barrier(deadline);
  if (root >= 0 && comm.rank() != root) return;
  combine(data.dtype, op, data.data, comm.buffer(0, half), comm.buffer(1, half), data.count);
  for (int q = 2; q < comm.size(); ++q) {
    combine(data.dtype, op, data.data, data.data, comm.buffer(q, half), data.count);
  }
  if (op == ReduceOp::Avg) divide_by(data.data, data.dtype, data.count, comm.size());
}

/* Reduce-scatter then all-gather, a buffer-sized block per round.
 *
 * A block of k elements is cut into N slices; rank r owns slice r.
 *   1. every rank stages the slices it does not own; barrier;
 *   2. rank r reduces slice r: its own input plus every other rank's staged
 *      slice r, written into its output and staged where its own slice would
 *      have been; barrier;
 *   3. every rank copies the other ranks' reduced slices into its output
 *      (for reduce: only the root).
 * Each rank reduces 1/N of the data, and every byte crosses shared memory
 * once on the way in and once on the way out. */
void reduce_in_slices(Comm& comm, Span data, ReduceOp op, int root, Clock::time_point deadline) {
  const size_t e = runtime::dtype_size(data.dtype);
  const size_t per_round = comm.buffer_bytes() / e;
  const int n = comm.size();
  const int r = comm.rank();
  for (size_t b0 = 0; b0 < data.count; b0 += per_round) {
    const size_t k = std::min(per_round, data.count - b0);
    const int half = comm.next_half();
    std::byte* mine = comm.buffer(r, half);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const Slice s = slice_of(b0, k, q, n);
      std::memcpy(at(mine, s.begin - b0, e), at(data.data, s.begin, e), s.size() * e);
    }
    comm.barrier(deadline);
    const Slice own = slice_of(b0, k, r, n);
    std::byte* out = at(data.data, own.begin, e);
    for (int q = 0; q < n; ++q) {
      if (q != r) combine(data.dtype, op, out, out, at(comm.buffer(q, half), own.begin - b0, e), own.size());
    }
    if (op == ReduceOp::Avg) divide_by(out, data.dtype, own.size(), n);
    std::memcpy(at(mine, own.begin - b0, e), out, own.size() * e);
    comm.barrier(deadline);
    if (root >= 0 && r != root) continue;
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      const Slice s = slice_of(b0, k, q, n);
      std::memcpy(at(data.data, s.begin, e), at(comm.buffer(q, half), s.begin - b0, e), s.size() * e);
    }
  }
}

// Pieces of the in-place reduce: small enough to stay in L1 between being
// reduced and being written to the other ranks.
constexpr size_t kInPlacePieceBytes = 16 << 10;

/* In place, when every rank's data lies in a shared tensor pool: nothing is
 * staged. Rank r owns slice r of the whole message.
 *   every rank publishes where its data lies; barrier; if some rank's data
 *   lies in no pool, every rank sees it and they take the staged path;
 *   rank r reduces slice r a cache-sized piece at a time, in place: its own
 *   data, then every other rank's slice r read where that rank's data lies,
 *   in rank order; while the piece is still in cache it writes it into every
 *   other rank's data (for reduce: only the root's);
 *   barrier, so that no rank returns before its data is complete, or changes
 *   it while another still reads it.
 * Only rank r reads or writes anyone's slice r, so one barrier suffices
 * between publishing and returning. Against reduce_in_slices this saves the
 * staging of the input and of the result and the reading back of the other
 * ranks' results, with the same bits out. */
bool reduce_in_place(Comm& comm, Span data, ReduceOp op, int root, Clock::time_point deadline) {
  const size_t e = runtime::dtype_size(data.dtype);
  const int n = comm.size();
  const int r = comm.rank();
  comm.publish_view(data.data, data.count * e);
  comm.barrier(deadline);
  std::vector<std::byte*> peer(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    peer[static_cast<size_t>(q)] = comm.peer_view(q);
    if (peer[static_cast<size_t>(q)] == nullptr) return false;
  }
  const Slice own = slice_of(0, data.count, r, n);
  const size_t piece = std::max<size_t>(1, kInPlacePieceBytes / e);
  for (size_t i = own.begin; i < own.end; i += piece) {
    const size_t m = std::min(piece, own.end - i);
    std::byte* out = at(data.data, i, e);
    for (int q = 0; q < n; ++q) {
      if (q != r) combine(data.dtype, op, out, out, at(peer[static_cast<size_t>(q)], i, e), m);
    }
    if (op == ReduceOp::Avg) divide_by(out, data.dtype, m, n);
    for (int q = 0; q < n; ++q) {
      if (q != r && (root < 0 || q == root)) std::memcpy(at(peer[static_cast<size_t>(q)], i, e), out, m * e);
    }
  }
  comm.barrier(deadline);
  return true;
}

void reduce_any(Comm& comm, Span data, ReduceOp op, int root, Clock::time_point deadline) {
  if (data.count == 0 || comm.size() == 1) return;  // Avg over one rank divides by 1
  const size_t bytes = data.count * runtime::dtype_size(data.dtype);
  if (bytes <= std::min(kSmallAllreduceBytes, comm.buffer_bytes())) {
    reduce_one_round(comm, data, op, root, deadline);
  } else if (!comm.has_pools() || !reduce_in_place(comm, data, op, root, deadline)) {
    reduce_in_slices(comm, data, op, root, deadline);
  }
}

void copy_unless_same(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memmove(dst, src, bytes);
}

}  // namespace

void allreduce(Comm& comm, Span data, ReduceOp op, Clock::time_point deadline) {
  reduce_any(comm, data, op, -1, deadline);
}

void reduce(Comm& comm, Span data, ReduceOp op, int root, Clock::time_point deadline) {
  reduce_any(comm, data, op, root, deadline);
}

/* Broadcast: per round the root stages a buffer's worth; barrier; the others
 * copy it out. */
void broadcast(Comm& comm, Span data, int root, Clock::time_point deadline) {
  if (data.count == 0 || comm.size() == 1) return;
  const size_t bytes = data.count * runtime::dtype_size(data.dtype);
  for (size_t b0 = 0; b0 < bytes; b0 += comm.buffer_bytes()) {
    const size_t len = std::min(comm.buffer_bytes(), bytes - b0);
    const int half = comm.next_half();
    std::byte* chunk = static_cast<std::byte*>(data.data) + b0;
    if (comm.rank() == root) std::memcpy(comm.buffer(root, half), chunk, len);
    comm.barrier(deadline);
    if (comm.rank() != root) std::memcpy(chunk, comm.buffer(root, half), len);
  }
}

/* All-gather: per round every rank stages a block of its input; barrier;
 * every rank copies each rank's block to that rank's place in the output. */
void allgather(Comm& comm, Span input, void* output, Clock::time_point deadline) {
  const size_t e = runtime::dtype_size(input.dtype);
  const int r = comm.rank();
  if (comm.size() == 1 || input.count == 0) {
    copy_unless_same(at(output, static_cast<size_t>(r) * input.count, e), input.data, input.count * e);
    return;
  }
  const size_t per_round = comm.buffer_bytes() / e;
  for (size_t b0 = 0; b0 < input.count; b0 += per_round) {
    const size_t k = std::min(per_round, input.count - b0);
    const int half = comm.next_half();
    std::memcpy(comm.buffer(r, half), at(input.data, b0, e), k * e);
    comm.barrier(deadline);
    for (int q = 0; q < comm.size(); ++q) {
      const void* src = q == r ? static_cast<const void*>(at(input.data, b0, e)) : comm.buffer(q, half);
      copy_unless_same(at(output, static_cast<size_t>(q) * input.count + b0, e), src, k * e);
    }
  }
}

/* Reduce-scatter: per round every rank stages, for each other rank q, a block
 * of its input's q-th chunk; barrier; rank r reduces its own chunk's block
 * with what the others staged for it, in rank order. */
void reduce_scatter(Comm& comm, Span output, const void* input, ReduceOp op,
                    Clock::time_point deadline) {
  const size_t e = runtime::dtype_size(output.dtype);
  const int n = comm.size();
  const int r = comm.rank();
  const size_t k = output.count;
  const auto* own_chunk = at(input, static_cast<size_t>(r) * k, e);
  if (n == 1 || k == 0) {
    copy_unless_same(output.data, own_chunk, k * e);
    return;
  }
  const size_t per_round = comm.buffer_bytes() / (static_cast<size_t>(n) * e);
  for (size_t b0 = 0; b0 < k; b0 += per_round) {
    const size_t m = std::min(per_round, k - b0);
    const int half = comm.next_half();
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      std::memcpy(at(comm.buffer(r, half), static_cast<size_t>(q) * per_round, e),
                  at(input, static_cast<size_t>(q) * k + b0, e), m * e);
    }
    comm.barrier(deadline);
    std::byte* out = at(output.data, b0, e);
    const std::byte* first = at(own_chunk, b0, e);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      combine(output.dtype, op, out, first, at(comm.buffer(q, half), static_cast<size_t>(r) * per_round, e), m);
      first = out;
    }
    if (op == ReduceOp::Avg) divide_by(out, output.dtype, m, n);
  }
}

}  // namespace lockstep::collectives::shm
