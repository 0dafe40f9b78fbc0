// The nccl backend: collectives on CUDA tensors through NCCL. One process, one
// device, one communicator per process group.
//
// Rendezvous: rank 0's ncclUniqueId goes through the store (nccl_comm.h).
// Ordering: each collective runs on the group's own non-blocking
// communication stream, which first waits on an event recorded on the
// caller's current stream: the collective sees all the caller queued before
// the call, and overlaps with what it queues after. Work::wait() orders the
// caller's current stream after the collective without blocking the host
// (nccl_work.h), so results are read in stream order; a barrier's wait()
// blocks the host. The tensors are held by the Work until the collective is
// done, so the caching allocator cannot reuse their memory early.
// Errors and timeouts: a watchdog thread aborts the communicator and fails the
// Works (nccl_watchdog.h); the group is unusable afterwards. By default the
// process then ends, naming the op, the rank and the reason (async_error.h).
// CPU tensors are staged through the group's device (nccl_host_staging.h):
// their wait() blocks the host until the results are back in host memory.
// That serves small control tensors (DDP's parameter checks, checkpoint
// flags); keep gradients and parameters on the device.
// Point to point: NCCL matches the sends and recvs between two ranks in issue
// order only; `tag` is accepted but does not reorder them. Each runs alone on
// the communication stream, so two ranks that both send before they recv may
// deadlock once a message exceeds NCCL's buffers.
// The call check: NCCL offers no cheap way to compare the ranks' calls before
// a collective runs without a host synchronisation on every call, so nccl
// groups compare them only under LOCKSTEP_DEBUG=detail (debug_group.h).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nccl.h>

#include "lockstep/collectives/abort_state.h"
#include "lockstep/collectives/async_error.h"
#include "lockstep/collectives/process_group.h"
#include "lockstep/runtime/cuda/caching_allocator.h"
#include "lockstep/runtime/cuda/stream.h"
#include "lockstep/distributed/store/store.h"

namespace lockstep::collectives {

namespace detail {
class NcclComm;
class NcclWatchdog;
class NcclWork;
}  // namespace detail

struct NcclOptions {
  int device = -1;  // the communicator's CUDA device; -1: the calling thread's current one
  bool high_priority_stream = true;  // communication ahead of compute when both are ready
  // What a timeout or an asynchronous NCCL error does to the process
  // (async_error.h); default: LOCKSTEP_ASYNC_ERROR_HANDLING, else end-process.
  std::optional<AsyncErrorHandling> async_errors;
};

class NcclGroup final : public ProcessGroup {
 public:
  // Every rank must call this (it rendezvouses); waits at most `timeout`.
  NcclGroup(std::shared_ptr<distributed::Store> store, int rank, int size, const std::string& name,
            std::chrono::milliseconds timeout, const NcclOptions& options = {});
  // Lets the collectives in flight complete (or time out), then destroys the
  // communicator.
  ~NcclGroup() override;

  std::string backend() const override { return "nccl"; }
  int device() const { return device_; }
  runtime::cuda::StreamView comm_stream() const { return stream_.view(); }

  // Every tensor all-reduced in place, all in one ncclGroupStart/ncclGroupEnd
  // (one launch for many small buckets), with one Work. Dtypes and sizes may
  // differ; all tensors are on this group's device (or all on the CPU).
  std::shared_ptr<Work> allreduce_coalesced(std::vector<Tensor>& tensors,
                                            const AllreduceOptions& opts = {});

 protected:
  std::shared_ptr<Work> run_allreduce(Call call, Tensor& tensor, ReduceOp op) override;
  std::shared_ptr<Work> run_broadcast(Call call, Tensor& tensor, int root) override;
  std::shared_ptr<Work> run_reduce(Call call, Tensor& tensor, ReduceOp op,
                                   int root) override;
  std::shared_ptr<Work> run_allgather(Call call, Tensor& output,
                                      const Tensor& input) override;
  std::shared_ptr<Work> run_reduce_scatter(Call call, Tensor& output, const Tensor& input,
                                           ReduceOp op) override;
  // An all-reduce of one element, then wait() blocks the host until it is done.
  std::shared_ptr<Work> run_barrier(Call call) override;
  std::shared_ptr<Work> run_send(Call call, const Tensor& tensor, int dst,
                                 int tag) override;
  std::shared_ptr<Work> run_recv(Call call, Tensor& tensor, int src, int tag) override;
  // CUDA tensors on this group's device, and CPU tensors (staged).
  void check_device(std::string_view op, const Tensor& tensor) const override;
  // The watchdog aborts the communicator: peers blocked in a collective
  // with this rank fail at their own watchdog's deadline.
  void abort_peers(const std::string& reason) override;

 private:
  using Enqueue = std::function<void(ncclComm_t comm, cudaStream_t stream)>;

  // Enqueues `call` on the communication stream (tensors on the device).
  std::shared_ptr<Work> enqueue(const Call& call, std::vector<Tensor> tensors, bool host_wait,
                                const Enqueue& enqueue);

  int device_;
  std::unique_ptr<detail::NcclComm> comm_;
  runtime::cuda::Stream stream_;
  runtime::cuda::Event ready_;  // recorded on the caller's stream, waited for by stream_
  std::unique_ptr<detail::NcclWatchdog> watchdog_;
  runtime::cuda::DeviceBuffer barrier_buffer_;  // the one element a barrier all-reduces
};

std::shared_ptr<NcclGroup> make_nccl_group(std::shared_ptr<distributed::Store> store, int rank,
                                           int size, const std::string& name,
                                           std::chrono::milliseconds timeout,
                                           const NcclOptions& options = {});

}  // namespace lockstep::collectives
