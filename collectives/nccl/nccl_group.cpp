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

runtime::Store& require_store(const std::shared_ptr<runtime::Store>& store,
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

NcclGroup::NcclGroup(std::shared_ptr<runtime::Store> store, int rank, int size,
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
      *comm_, stream_, abort_,
      fmt::format("rank {} of group '{}' (nccl, {} ranks)", rank, name, size));
}

NcclGroup::~NcclGroup() { watchdog_->stop(); }

void NcclGroup::check_cuda(std::string_view op, const Tensor& tensor) const {
  check_tensor(op, tensor);
  LOCKSTEP_CHECK(tensor.device().index == device_,
                 "{} on group '{}': the tensor is on {}, but this group's communicator is on "
                 "cuda:{} (one process, one device); move it with .to(Device::cuda({}))",
                 op, name(), tensor.device().str(), device_, device_);
}

// `big` must hold size() times `small`'s elements, of the same dtype.
void NcclGroup::check_pair(std::string_view op, std::string_view big_name, const Tensor& big,
                           std::string_view small_name, const Tensor& small) const {
  check_cuda(op, big);
  check_cuda(op, small);
  LOCKSTEP_CHECK(big.dtype() == small.dtype(),
                 "{} on group '{}': {} has dtype {} but {} has {}; they must match", op, name(),
                 big_name, runtime::dtype_name(big.dtype()), small_name,
                 runtime::dtype_name(small.dtype()));
  LOCKSTEP_CHECK(big.numel() == small.numel() * size(),
                 "{} on group '{}': {} has {} elements but needs size() * {}.numel() = {} * {} = "
                 "{}",
                 op, name(), big_name, big.numel(), small_name, size(), small.numel(),
                 small.numel() * size());
}

void NcclGroup::throw_if_aborted(std::string_view op) {
  const std::string reason = abort_->reason();
  if (reason.empty()) return;
  throw CollectiveError(fmt::format(
      "{} on rank {} of group '{}' (nccl): the group is unusable because {}; the ranks may now "
      "disagree on which collectives ran, so create a new process group on every rank (or "
      "restart the job)",
      op, rank(), name(), reason));
}

// Enqueues one collective on the communication stream, after the work the
// caller queued on its current stream so far. The Work is watched from before
// the enqueue, so a host blocked inside NCCL is caught by the deadline too.
std::shared_ptr<Work> NcclGroup::issue(std::string_view op, const Tensor* described,
                                       std::string_view extra, const Timeout& timeout,
                                       std::vector<Tensor> tensors, bool host_wait,
                                       const Enqueue& enqueue) {
  std::lock_guard lock(issue_mutex_);
  throw_if_aborted(op);
  // Sends and recvs are not numbered: only collectives count (as in gloo).
  const bool p2p = op == "send" || op == "recv";
  if (!p2p) next_seq();
  const std::string description =
      p2p ? fmt::format("{} ({}, {} elements, {})", op, runtime::dtype_name(described->dtype()),
                        described->numel(), extra)
          : describe(op, described, extra);
  const milliseconds t = timeout_of(timeout);
  auto work = std::make_shared<detail::NcclWork>(description, Work::Clock::now() + t,
                                                 timeout_message(description, t), device_,
                                                 host_wait, abort_);
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
    work->finish(std::make_exception_ptr(CollectiveError(fmt::format(
        "{} failed on rank {} of group '{}' (nccl, {} ranks): {}; the group is unusable now",
        description, rank(), name(), size(), e.what()))));
    watchdog_->request_abort(fmt::format("{} failed to start: {}", description, e.what()));
    return work;
  }
  work->arm();
  return work;
}

std::shared_ptr<Work> NcclGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  if (tensor.device().is_cpu()) {
    check_tensor("allreduce", tensor);
    detail::NcclHostStaging s(device_);
    Tensor staged = s.stage(tensor, true);
    return s.wrap(allreduce(staged, opts));
  }
  check_cuda("allreduce", tensor);
  return issue("allreduce", &tensor, to_string(opts.op), opts.timeout, {tensor}, false,
               [&](ncclComm_t comm, cudaStream_t stream) {
                 if (tensor.numel() == 0) return;
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclAllReduce(tensor.raw_data(), tensor.raw_data(),
                                                         count(tensor), nccl_dtype(tensor.dtype()),
                                                         nccl_op(opts.op), comm, stream));
               });
}

std::shared_ptr<Work> NcclGroup::allreduce_coalesced(std::vector<Tensor>& tensors,
                                                     const AllreduceOptions& opts) {
  detail::NcclHostStaging s(device_);
  std::vector<Tensor> staged;
  for (const Tensor& t : tensors) {
    check_tensor("allreduce_coalesced", t);
    staged.push_back(s.stage(t, true));
  }
  if (s.any()) return s.wrap(allreduce_coalesced(staged, opts));
  int64_t elements = 0;
  for (const Tensor& t : tensors) {
    check_cuda("allreduce_coalesced", t);
    elements += t.numel();
  }
  const std::string extra = fmt::format("{} tensors, {} elements, {}", tensors.size(), elements,
                                        to_string(opts.op));
  return issue("allreduce_coalesced", nullptr, extra, opts.timeout, tensors, false,
               [&](ncclComm_t comm, cudaStream_t stream) {
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclGroupStart());
                 try {
                   for (Tensor& t : tensors) {
                     if (t.numel() == 0) continue;
                     LOCKSTEP_NCCL_CHECK_ASYNC(ncclAllReduce(t.raw_data(), t.raw_data(), count(t),
                                                             nccl_dtype(t.dtype()),
                                                             nccl_op(opts.op), comm, stream));
                   }
                 } catch (...) {
                   (void)ncclGroupEnd();  // close the group before reporting the first error
                   throw;
                 }
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclGroupEnd());
               });
}

std::shared_ptr<Work> NcclGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  if (tensor.device().is_cpu()) {
    check_tensor("broadcast", tensor);
    detail::NcclHostStaging s(device_);
    Tensor staged = s.stage(tensor, rank() != opts.root);
    return s.wrap(broadcast(staged, opts));
  }
  check_cuda("broadcast", tensor);
  check_root("broadcast", opts.root);
  return issue("broadcast", &tensor, fmt::format("root {}", opts.root), opts.timeout, {tensor},
               false, [&](ncclComm_t comm, cudaStream_t stream) {
                 if (tensor.numel() == 0) return;
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclBroadcast(tensor.raw_data(), tensor.raw_data(),
                                                         count(tensor), nccl_dtype(tensor.dtype()),
                                                         opts.root, comm, stream));
               });
}

std::shared_ptr<Work> NcclGroup::reduce(Tensor& tensor, const ReduceOptions& opts) {
  if (tensor.device().is_cpu()) {
    check_tensor("reduce", tensor);
    detail::NcclHostStaging s(device_);
    Tensor staged = s.stage(tensor, true);
    return s.wrap(reduce(staged, opts));
  }
  check_cuda("reduce", tensor);
  check_root("reduce", opts.root);
  return issue("reduce", &tensor, fmt::format("{}, root {}", to_string(opts.op), opts.root),
               opts.timeout, {tensor}, false, [&](ncclComm_t comm, cudaStream_t stream) {
                 if (tensor.numel() == 0) return;
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclReduce(tensor.raw_data(), tensor.raw_data(),
                                                      count(tensor), nccl_dtype(tensor.dtype()),
                                                      nccl_op(opts.op), opts.root, comm, stream));
               });
}

std::shared_ptr<Work> NcclGroup::allgather(Tensor& output, const Tensor& input,
                                           const AllgatherOptions& opts) {
  if (output.device().is_cpu() || input.device().is_cpu()) {
    check_tensor("allgather", output);
    check_tensor("allgather", input);
    detail::NcclHostStaging s(device_);
    Tensor out = s.stage(output, true);
    const Tensor in = s.stage(input, false);
    return s.wrap(allgather(out, in, opts));
  }
  check_pair("allgather", "output", output, "input", input);
  return issue("allgather", &input, "", opts.timeout, {output, input}, false,
               [&](ncclComm_t comm, cudaStream_t stream) {
                 if (input.numel() == 0) return;
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclAllGather(input.raw_data(), output.raw_data(),
                                                         count(input), nccl_dtype(input.dtype()),
                                                         comm, stream));
               });
}

std::shared_ptr<Work> NcclGroup::reduce_scatter(Tensor& output, const Tensor& input,
                                                const ReduceScatterOptions& opts) {
  if (output.device().is_cpu() || input.device().is_cpu()) {
    check_tensor("reduce_scatter", output);
    check_tensor("reduce_scatter", input);
    detail::NcclHostStaging s(device_);
    Tensor out = s.stage(output, true);
    const Tensor in = s.stage(input, false);
    return s.wrap(reduce_scatter(out, in, opts));
  }
  check_pair("reduce_scatter", "input", input, "output", output);
  return issue("reduce_scatter", &output, to_string(opts.op), opts.timeout, {output, input},
               false, [&](ncclComm_t comm, cudaStream_t stream) {
                 if (output.numel() == 0) return;
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclReduceScatter(input.raw_data(), output.raw_data(),
                                                             count(output),
                                                             nccl_dtype(output.dtype()),
                                                             nccl_op(opts.op), comm, stream));
               });
}

std::shared_ptr<Work> NcclGroup::barrier(const BarrierOptions& opts) {
  return issue("barrier", nullptr, "", opts.timeout, {}, true,
               [&](ncclComm_t comm, cudaStream_t stream) {
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclAllReduce(barrier_buffer_.data(),
                                                         barrier_buffer_.data(), 1, ncclFloat32,
                                                         ncclSum, comm, stream));
               });
}

std::shared_ptr<Work> NcclGroup::send(const Tensor& tensor, int dst, const SendRecvOptions& opts) {
  if (tensor.device().is_cpu()) {
    check_tensor("send", tensor);
    detail::NcclHostStaging s(device_);
    const Tensor staged = s.stage(tensor, false);
    return s.wrap(send(staged, dst, opts));
  }
  check_cuda("send", tensor);
  LOCKSTEP_CHECK(dst >= 0 && dst < size() && dst != rank(),
                 "send on group '{}': peer {} must be another rank of this group of {} ranks "
                 "(this is rank {})",
                 name(), dst, size(), rank());
  return issue("send", &tensor, fmt::format("to rank {}, tag {}", dst, opts.tag), opts.timeout,
               {tensor}, false, [&](ncclComm_t comm, cudaStream_t stream) {
                 if (tensor.numel() == 0) return;
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclSend(tensor.raw_data(), count(tensor),
                                                    nccl_dtype(tensor.dtype()), dst, comm, stream));
               });
}

std::shared_ptr<Work> NcclGroup::recv(Tensor& tensor, int src, const SendRecvOptions& opts) {
  if (tensor.device().is_cpu()) {
    check_tensor("recv", tensor);
    detail::NcclHostStaging s(device_);
    Tensor staged = s.stage(tensor, true);
    return s.wrap(recv(staged, src, opts));
  }
  check_cuda("recv", tensor);
  LOCKSTEP_CHECK(src >= 0 && src < size() && src != rank(),
                 "recv on group '{}': peer {} must be another rank of this group of {} ranks "
                 "(this is rank {})",
                 name(), src, size(), rank());
  return issue("recv", &tensor, fmt::format("from rank {}, tag {}", src, opts.tag), opts.timeout,
               {tensor}, false, [&](ncclComm_t comm, cudaStream_t stream) {
                 if (tensor.numel() == 0) return;
                 LOCKSTEP_NCCL_CHECK_ASYNC(ncclRecv(tensor.raw_data(), count(tensor),
                                                    nccl_dtype(tensor.dtype()), src, comm, stream));
               });
}

std::shared_ptr<NcclGroup> make_nccl_group(std::shared_ptr<runtime::Store> store, int rank,
                                           int size, const std::string& name,
                                           milliseconds timeout, const NcclOptions& options) {
  return std::make_shared<NcclGroup>(std::move(store), rank, size, name, timeout, options);
}

}  // namespace lockstep::collectives
