// ProcessGroup: the ranks of a job and the collectives among them.
//
// All ranks must issue the same collectives, with the same dtype and count,
// in the same order (LOCKSTEP_DEBUG=detail checks this; see debug_group.h).
// Every call returns a Work at once; the tensors must stay alive and
// untouched until Work::wait() returns. Tensors must be contiguous, on this
// backend's device, of dtype f32, f64, bf16, f16, i32 or i64 (anything else
// is refused with a clear error before anything is sent).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "lockstep/collectives/shared_pool.h"
#include "lockstep/collectives/types.h"
#include "lockstep/collectives/work.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::collectives {

using runtime::Tensor;

class ProcessGroup {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(10);

  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // e.g. "default"
  virtual std::string backend() const = 0;           // "gloo", "mpi", ...
  std::chrono::milliseconds timeout() const { return timeout_; }

  // In place: every rank ends with the reduction of all ranks' `tensor`.
  virtual std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts = {}) = 0;
  // In place: every rank ends with `root`'s `tensor`.
  virtual std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts = {}) = 0;
  // In place on `root` (the reduction of all ranks); others' tensors are left
  // unspecified.
  virtual std::shared_ptr<Work> reduce(Tensor& tensor, const ReduceOptions& opts = {}) = 0;
  // `output` holds size() * input.numel() elements: rank r's `input` at
  // offset r * input.numel() (PyTorch's all_gather_into_tensor).
  virtual std::shared_ptr<Work> allgather(Tensor& output, const Tensor& input,
                                          const AllgatherOptions& opts = {}) = 0;
  // `input` holds size() * output.numel() elements; rank r's `output` gets
  // the reduction over ranks of input's r-th chunk.
  virtual std::shared_ptr<Work> reduce_scatter(Tensor& output, const Tensor& input,
                                               const ReduceScatterOptions& opts = {}) = 0;
  virtual std::shared_ptr<Work> barrier(const BarrierOptions& opts = {}) = 0;
  // Point to point; matched by (peer, tag) in issue order.
  virtual std::shared_ptr<Work> send(const Tensor& tensor, int dst, const SendRecvOptions& opts = {}) = 0;
  virtual std::shared_ptr<Work> recv(Tensor& tensor, int src, const SendRecvOptions& opts = {}) = 0;

  // Collective (every rank, the same `bytes`, at the same point among the
  // group's calls): sets aside `bytes` per rank from which to take tensors
  // that this group's all-reduce and reduce read in place on every rank,
  // skipping their staging copies (shm: memory all ranks map). nullptr, on
  // every rank alike, where the backend has no such memory or it could not be
  // had (a full /dev/shm); ordinary tensors work as before either way.
  virtual std::shared_ptr<SharedTensorPool> reserve_shared_pool(size_t bytes);

 protected:
  ProcessGroup(int rank, int size, std::string name, std::chrono::milliseconds timeout);

  // The deadline of a call: its own timeout, else the group's.
  std::chrono::milliseconds timeout_of(const Timeout& t) const { return t.value_or(timeout_); }
  // "allreduce #12 (f32, 1000 elements, sum)" style descriptions and the
  // timeout message "... timed out after 600 s on rank 1 of group 'default'
  // (gloo, 4 ranks)". seq is the group's running count of collectives.
  std::string describe(std::string_view op, const Tensor* tensor, std::string_view extra) const;
  std::string timeout_message(const std::string& description, std::chrono::milliseconds t) const;
  // Validates dtype and contiguity (backends check the device they serve);
  // throws naming the op and what to do.
  void check_tensor(std::string_view op, const Tensor& tensor) const;
  void check_root(std::string_view op, int root) const;
  uint64_t next_seq() { return ++seq_; }
  uint64_t seq() const { return seq_; }

 private:
  int rank_;
  int size_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
};

}  // namespace lockstep::collectives
