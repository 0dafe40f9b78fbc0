#include "lockstep/collectives/nccl/nccl_group.h"

#include <cuda_runtime_api.h>

#include <fmt/format.h>

#include "lockstep/collectives/nccl/nccl_check.h"
#include "lockstep/collectives/nccl/nccl_comm.h"
#include "lockstep/collectives/nccl/nccl_host_staging.h"
#include "lockstep/collectives/nccl/nccl_types.h"
#include "lockstep/collectives/nccl/nccl_watchdog.h"
#include "lockstep/collectives/nccl/nccl_work.h"
#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"

namespace lockstep::collectives {
namespace {

using std::chrono::milliseconds;
using detail::nccl_dtype;
using detail::nccl_op;

size_t count(const Tensor& t) { return static_cast<size_t>(t.numel()); }

int resolve_device(int device, const std::string& name) {
  const int devices = runtime::cuda_device_count();
  LOCKSTEP_CHECK(devices > 0,
                 "nccl group '{}': the nccl backend needs a CUDA device and this process has "
                 "none ({}); use gloo or shm, which take CPU tensors (and CUDA tensors, staged "
                 "through host memory)",
                 name, runtime::cuda_unavailable_reason());
  if (device < 0) device = runtime::cuda::current_device();
  LOCKSTEP_CHECK(device < devices, "nccl group '{}': device cuda:{} does not exist ({} devices)",
                 name, device, devices);
  return device;
}

distributed::Store& require_store(const std::shared_ptr<distributed::Store>& store,
                              const std::string& name) {
  LOCKSTEP_CHECK(store != nullptr, "nccl group '{}': a store is needed for the rendezvous", name);
  return *store;
}

runtime::cuda::StreamOptions stream_options(int device, bool high_priority) {
  if (!high_priority) return {};
  runtime::cuda::DeviceGuard guard(device);
  int least = 0;
  int greatest = 0;
  LOCKSTEP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return {.priority = greatest};
}

}  // namespace

NcclGroup::NcclGroup(std::shared_ptr<distributed::Store> store, int rank, int size,
                     const std::string& name, milliseconds timeout, const NcclOptions& options)
    : ProcessGroup(rank, size, name, timeout),
      device_(resolve_device(options.device, name)),
      comm_(std::make_unique<detail::NcclComm>(require_store(store, name), rank, size, name,
                                               device_, timeout)),
      stream_(device_, stream_options(device_, options.high_priority_stream)) {
  barrier_buffer_ = runtime::cuda::DeviceBuffer(sizeof(float), stream_);
  {
    runtime::cuda::DeviceGuard guard(device_);
    LOCKSTEP_CUDA_CHECK(
        cudaMemsetAsync(barrier_buffer_.data(), 0, sizeof(float), stream_.handle()));
  }
  watchdog_ = std::make_unique<detail::NcclWatchdog>(
      *comm_, stream_, abort_state(),
      fmt::format("rank {} of group '{}' (nccl, {} ranks)", rank, name, size),
      options.async_errors.value_or(async_error_handling_from_env()));
}

NcclGroup::~NcclGroup() { watchdog_->stop(); }

void NcclGroup::check_device(std::string_view op, const Tensor& tensor) const {
  if (tensor.device().is_cpu()) return;  // staged through the device
  LOCKSTEP_CHECK(tensor.device().index == device_,
                 "{} on group '{}': the tensor is on {}, but this group's communicator is on "
                 "cuda:{} (one process, one device); move it with .to(Device::cuda({}))",
                 op, name(), tensor.device().str(), device_, device_);
}

void NcclGroup::abort_peers(const std::string& reason) { watchdog_->request_abort(reason); }

// Enqueues one collective on the communication stream, after the work the
// caller queued on its current stream so far. The Work is watched from before
// the enqueue, so a host blocked inside NCCL is caught by the deadline too.
std::shared_ptr<Work> NcclGroup::enqueue(const Call& call, std::vector<Tensor> tensors,
                                         bool host_wait, const Enqueue& enqueue) {
  auto work = std::make_shared<detail::NcclWork>(call.description(), call.deadline,
                                                 timeout_message(call), device_, host_wait,
                                                 abort_state());
  // Kept alive until done instead of record_stream() on the caching allocator:
  // this holds for any storage, and the watchdog drops them only once no
  // kernel can touch them.
  work->keep_alive(std::move(tensors));
  runtime::cuda::DeviceGuard guard(device_);
  watchdog_->watch(work);
  try {
    // Numbered already: a failure from here on must make the group unusable,
    // or this rank would skip a collective its peers run.
    ready_.record(runtime::cuda::current_stream(device_));
    ready_.wait(stream_);
    comm_->use([&](ncclComm_t comm) { enqueue(comm, stream_.handle()); });
    work->end_event().record(stream_);
  } catch (const std::exception& e) {
    work->finish(std::make_exception_ptr(CollectiveError(
        fmt::format("{} failed on {}: {}; the group is unusable now", call.description(), where(),
                    e.what()))));
    watchdog_->request_abort(fmt::format("{} failed to start: {}", call.description(), e.what()));
    return work;
  }
  work->arm();
  return work;
}

std::shared_ptr<Work> NcclGroup::run_allreduce(Call call, Tensor& tensor, ReduceOp op) {
  detail::NcclHostStaging s(device_);
  Tensor t = s.stage(tensor, true);
  auto work = enqueue(call, {t}, false, [&](ncclComm_t comm, cudaStream_t stream) {
    if (t.numel() == 0) return;
    LOCKSTEP_NCCL_CHECK_ASYNC(ncclAllReduce(t.raw_data(), t.raw_data(), count(t),
                                            nccl_dtype(t.dtype()), nccl_op(op), comm, stream));
  });
  return s.wrap(std::move(work));
}

std::shared_ptr<Work> NcclGroup::allreduce_coalesced(std::vector<Tensor>& tensors,
                                                     const AllreduceOptions& opts) {
  detail::NcclHostStaging s(device_);
  std::vector<Tensor> staged;
  int64_t elements = 0;
  for (const Tensor& t : tensors) {
    LOCKSTEP_CHECK(t.defined() && t.is_contiguous(),
                   "allreduce_coalesced on group '{}': every tensor must be defined and "
                   "contiguous",
                   name());
    check_device("allreduce_coalesced", t);
    staged.push_back(s.stage(t, true));
    elements += t.numel();
  }
  const std::string extra = fmt::format("{} tensors, {} elements, {}", tensors.size(), elements,
                                        to_string(opts.op));
  const CallSignature signature{.kind = CollectiveKind::allreduce,
                                .dtype = tensors.empty() ? runtime::DType::f32 : tensors[0].dtype(),
                                .count = elements,
                                .op = opts.op};
  auto work = issue(signature, "allreduce_coalesced", nullptr, extra, opts.timeout,
                    [&](const Call& call) {
                      return enqueue(call, staged, false, [&](ncclComm_t comm, cudaStream_t stream) {
                        LOCKSTEP_NCCL_CHECK_ASYNC(ncclGroupStart());
                        try {
                          for (Tensor& t : staged) {
                            if (t.numel() == 0) continue;
                            LOCKSTEP_NCCL_CHECK_ASYNC(ncclAllReduce(
                                t.raw_data(), t.raw_data(), count(t), nccl_dtype(t.dtype()),
                                nccl_op(opts.op), comm, stream));
                          }
                        } catch (...) {
                          (void)ncclGroupEnd();  // close the group before reporting the first error
                          throw;
                        }
                        LOCKSTEP_NCCL_CHECK_ASYNC(ncclGroupEnd());
                      });
                    });
  return s.wrap(std::move(work));
}

std::shared_ptr<Work> NcclGroup::run_broadcast(Call call, Tensor& tensor, int root) {
  detail::NcclHostStaging s(device_);
  Tensor t = s.stage(tensor, rank() != root);
  auto work = enqueue(call, {t}, false, [&](ncclComm_t comm, cudaStream_t stream) {
    if (t.numel() == 0) return;
    LOCKSTEP_NCCL_CHECK_ASYNC(ncclBroadcast(t.raw_data(), t.raw_data(), count(t),
                                            nccl_dtype(t.dtype()), root, comm, stream));
  });
  return s.wrap(std::move(work));
}

std::shared_ptr<Work> NcclGroup::run_reduce(Call call, Tensor& tensor, ReduceOp op,
                                            int root) {
  detail::NcclHostStaging s(device_);
  Tensor t = s.stage(tensor, true);
  auto work = enqueue(call, {t}, false, [&](ncclComm_t comm, cudaStream_t stream) {
    if (t.numel() == 0) return;
    LOCKSTEP_NCCL_CHECK_ASYNC(ncclReduce(t.raw_data(), t.raw_data(), count(t),
                                         nccl_dtype(t.dtype()), nccl_op(op), root, comm, stream));
  });
  return s.wrap(std::move(work));
}

std::shared_ptr<Work> NcclGroup::run_allgather(Call call, Tensor& output,
                                               const Tensor& input) {
  detail::NcclHostStaging s(device_);
  Tensor out = s.stage(output, true);
  const Tensor in = s.stage(input, false);
  auto work = enqueue(call, {out, in}, false, [&](ncclComm_t comm, cudaStream_t stream) {
    if (in.numel() == 0) return;
    LOCKSTEP_NCCL_CHECK_ASYNC(ncclAllGather(in.raw_data(), out.raw_data(), count(in),
                                            nccl_dtype(in.dtype()), comm, stream));
  });
  return s.wrap(std::move(work));
}

std::shared_ptr<Work> NcclGroup::run_reduce_scatter(Call call, Tensor& output,
                                                    const Tensor& input, ReduceOp op) {
  detail::NcclHostStaging s(device_);
  Tensor out = s.stage(output, true);
  const Tensor in = s.stage(input, false);
  auto work = enqueue(call, {out, in}, false, [&](ncclComm_t comm, cudaStream_t stream) {
    if (out.numel() == 0) return;
    LOCKSTEP_NCCL_CHECK_ASYNC(ncclReduceScatter(in.raw_data(), out.raw_data(), count(out),
                                                nccl_dtype(out.dtype()), nccl_op(op), comm,
                                                stream));
  });
  return s.wrap(std::move(work));
}

std::shared_ptr<Work> NcclGroup::run_barrier(Call call) {
  return enqueue(call, {}, true, [&](ncclComm_t comm, cudaStream_t stream) {
    LOCKSTEP_NCCL_CHECK_ASYNC(ncclAllReduce(barrier_buffer_.data(), barrier_buffer_.data(), 1,
                                            ncclFloat32, ncclSum, comm, stream));
  });
}

std::shared_ptr<Work> NcclGroup::run_send(Call call, const Tensor& tensor, int dst,
                                          int /*tag*/) {
  detail::NcclHostStaging s(device_);
  const Tensor t = s.stage(tensor, false);
  auto work = enqueue(call, {t}, false, [&](ncclComm_t comm, cudaStream_t stream) {
    if (t.numel() == 0) return;
    LOCKSTEP_NCCL_CHECK_ASYNC(
        ncclSend(t.raw_data(), count(t), nccl_dtype(t.dtype()), dst, comm, stream));
  });
  return s.wrap(std::move(work));
}

std::shared_ptr<Work> NcclGroup::run_recv(Call call, Tensor& tensor, int src,
                                          int /*tag*/) {
  detail::NcclHostStaging s(device_);
  Tensor t = s.stage(tensor, true);
  auto work = enqueue(call, {t}, false, [&](ncclComm_t comm, cudaStream_t stream) {
    if (t.numel() == 0) return;
    LOCKSTEP_NCCL_CHECK_ASYNC(
        ncclRecv(t.raw_data(), count(t), nccl_dtype(t.dtype()), src, comm, stream));
  });
  return s.wrap(std::move(work));
}

std::shared_ptr<NcclGroup> make_nccl_group(std::shared_ptr<distributed::Store> store, int rank,
                                           int size, const std::string& name,
                                           milliseconds timeout, const NcclOptions& options) {
  return std::make_shared<NcclGroup>(std::move(store), rank, size, name, timeout, options);
}

}  // namespace lockstep::collectives
