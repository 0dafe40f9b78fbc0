// A shared tensor pool of a shm group (ProcessGroup::reserve_shared_pool):
// every rank has a segment of its own, where its pool tensors live, and maps
// every other rank's segment beside it, so a collective reads a peer's tensor
// in place given where in the peer's segment it lies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "lockstep/collectives/shared_pool.h"
#include "lockstep/collectives/shm/shm_segment.h"

namespace lockstep::collectives::shm {

class Pool final : public SharedTensorPool, public std::enable_shared_from_this<Pool> {
 public:
  // segments[q]: rank q's segment, all of one size; segments[rank] is this
  // rank's own.
  Pool(int rank, std::vector<Segment> segments);

  // The segment size whose pool holds a tensor of `bytes`: tensors start on
  // cache lines, so only whole cache lines of a segment are used.
  static size_t segment_bytes(size_t bytes);

  runtime::Tensor empty(const runtime::Shape& shape, runtime::DType dtype) override;
  bool holds(const runtime::Tensor& t) const override;
  size_t capacity_bytes() const override;
  size_t used_bytes() const override;

  // Where [data, data + bytes) lies in this rank's segment, or -1.
  int64_t offset_of(const void* data, size_t bytes) const;
  // The byte at `offset` of rank q's segment.
  std::byte* at(int q, int64_t offset) const;

 private:
  void release(size_t offset, size_t bytes);

  int rank_;
  std::vector<Segment> segments_;
  mutable std::mutex mutex_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  size_t used_ = 0;
};

}  // namespace lockstep::collectives::shm
