#include "lockstep/collectives/process_group.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "lockstep/distributed/flight_recorder.h"
#include "lockstep/distributed/rank_postmortem.h"
#include "lockstep/runtime/process_id.h"

namespace lockstep::collectives {

using runtime::DType;

namespace {

// Whether the elements of contiguous `a` and `b` share any byte.
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.numel() == 0 || b.numel() == 0 || a.storage() != b.storage()) return false;
  const auto* a0 = static_cast<const char*>(a.raw_data());
  const auto* b0 = static_cast<const char*>(b.raw_data());
  return a0 < b0 + b.numel() * b.element_size() && b0 < a0 + a.numel() * a.element_size();
}

// A call writes its tensor as an in-place op would, so it counts as one:
// what checks a tensor's version (autograd's saved tensors, autocast's cast
// cache, a checkpoint region's parameters) sees the new values. Counted when
// issued, as PyTorch counts an op when it is dispatched.
void count_write(const Tensor& t) {
  if (t.storage() != nullptr) t.storage()->bump_version();
}

// Avg of u8 and bool has no meaning PyTorch gives it (torch.distributed
// refuses it), so it is refused here, on every rank alike, before anything
// is sent. i32 and i64 keep NCCL's truncating Avg (types.h).
void check_op(std::string_view op, const std::string& group, DType dtype, ReduceOp reduce_op) {
  LOCKSTEP_CHECK(reduce_op != ReduceOp::Avg || (dtype != DType::u8 && dtype != DType::boolean),
                 "{} on group '{}': ReduceOp::Avg of dtype {} is not supported (as in "
                 "PyTorch); use Sum and divide, or convert with .to(DType::f32) first",
                 op, group, runtime::dtype_name(dtype));
}

}  // namespace

std::shared_ptr<SharedTensorPool> ProcessGroup::reserve_shared_pool(size_t bytes) {
  refuse_in_forked_child("reserve_shared_pool");
  refuse_if_unusable("reserve_shared_pool");
  return make_shared_pool(bytes);
}

std::shared_ptr<SharedTensorPool> ProcessGroup::make_shared_pool(size_t /*bytes*/) {
  return nullptr;  // staging copies are cheap next to this backend's own transfers
}

ProcessGroup::ProcessGroup(int rank, int size, std::string name, std::chrono::milliseconds timeout)
    : rank_(rank),
      size_(size),
      name_(std::move(name)),
      timeout_(std::min(timeout, kLongestTimeout)),
      maker_pid_(runtime::this_process_id()) {
  LOCKSTEP_CHECK(size >= 1, "process group '{}': size must be >= 1, got {}", name_, size);
  LOCKSTEP_CHECK(rank >= 0 && rank < size,
                 "process group '{}': rank {} is outside [0, {}) for a group of {} ranks", name_,
                 rank, size, size);
  LOCKSTEP_CHECK(timeout.count() > 0, "process group '{}': timeout must be positive, got {} ms",
                 name_, timeout.count());
  // The flight record and, under another launcher, the watch that answers
  // the other ranks' post-mortems start with the group, not its first call:
  // a post-mortem then tells a rank that made its group and issued nothing
  // yet (still loading its data) from one that never got as far as the group.
  distributed::FlightRecorder::instance();
  distributed::watch_for_postmortems();
}

std::shared_ptr<Work> ProcessGroup::allreduce(Tensor& tensor, const AllreduceOptions& opts) {
  check_tensor("allreduce", tensor);
  check_op("allreduce", name_, tensor.dtype(), opts.op);
  const CallSignature signature{.kind = CollectiveKind::allreduce,
                                .dtype = tensor.dtype(),
                                .count = tensor.numel(),
                                .op = opts.op};
  count_write(tensor);
  return issue(signature, "allreduce", &tensor, "", opts.timeout,
               [&](Call&& call) { return run_allreduce(std::move(call), tensor, opts.op); });
}

std::shared_ptr<Work> ProcessGroup::broadcast(Tensor& tensor, const BroadcastOptions& opts) {
  check_tensor("broadcast", tensor);
  check_root("broadcast", opts.root);
  const CallSignature signature{.kind = CollectiveKind::broadcast,
                                .dtype = tensor.dtype(),
                                .count = tensor.numel(),
                                .root = opts.root};
  count_write(tensor);
  return issue(signature, "broadcast", &tensor, "", opts.timeout,
               [&](Call&& call) { return run_broadcast(std::move(call), tensor, opts.root); });
}

std::shared_ptr<Work> ProcessGroup::reduce(Tensor& tensor, const ReduceOptions& opts) {
  check_tensor("reduce", tensor);
  check_op("reduce", name_, tensor.dtype(), opts.op);
  check_root("reduce", opts.root);
  const CallSignature signature{.kind = CollectiveKind::reduce,
                                .dtype = tensor.dtype(),
                                .count = tensor.numel(),
                                .root = opts.root,
                                .op = opts.op};
  count_write(tensor);
  return issue(signature, "reduce", &tensor, "", opts.timeout, [&](Call&& call) {
    return run_reduce(std::move(call), tensor, opts.op, opts.root);
  });
}

std::shared_ptr<Work> ProcessGroup::allgather(Tensor& output, const Tensor& input,
                                              const AllgatherOptions& opts) {
  check_tensor("allgather", input);
  check_tensor("allgather", output);
  check_sizes("allgather", "output", output, "input", input);
  // An input that is this rank's chunk of the output is gathered in place;
  // one that overlaps the output elsewhere would be overwritten by other
  // ranks' chunks while it is still being sent (shm gathered another rank's
  // data in its place), so it is sent from a copy.
  const auto* own_chunk =
      static_cast<const char*>(output.raw_data()) + rank_ * input.numel() * input.element_size();
  const Tensor sent = overlaps(output, input) && input.raw_data() != own_chunk
                          ? input.detach().clone()  // no autograd graph records the copy
                          : input;
  const CallSignature signature{
      .kind = CollectiveKind::allgather, .dtype = input.dtype(), .count = input.numel()};
  count_write(output);
  return issue(signature, "allgather", &sent, "", opts.timeout,
               [&](Call&& call) { return run_allgather(std::move(call), output, sent); });
}

std::shared_ptr<Work> ProcessGroup::reduce_scatter(Tensor& output, const Tensor& input,
                                                   const ReduceScatterOptions& opts) {
  check_tensor("reduce_scatter", input);
  check_tensor("reduce_scatter", output);
  check_sizes("reduce_scatter", "input", input, "output", output);
  check_op("reduce_scatter", name_, output.dtype(), opts.op);
  // An output that is this rank's chunk of the input is reduced in place;
  // one that overlaps the input elsewhere would be written while the input
  // is still being read (shm summed values it had just overwritten; MPI and
  // NCCL forbid such buffers), so the input is read from a copy made here.
  const auto* own_chunk = static_cast<const char*>(input.raw_data()) +
                          rank_ * output.numel() * output.element_size();
  const Tensor read = overlaps(output, input) && output.raw_data() != own_chunk
                          ? input.detach().clone()  // no autograd graph records the copy
                          : input;
  const CallSignature signature{.kind = CollectiveKind::reduce_scatter,
                                .dtype = output.dtype(),
                                .count = output.numel(),
                                .op = opts.op};
  count_write(output);
  return issue(signature, "reduce_scatter", &output, "", opts.timeout, [&](Call&& call) {
    return run_reduce_scatter(std::move(call), output, read, opts.op);
  });
}

std::shared_ptr<Work> ProcessGroup::barrier(const BarrierOptions& opts) {
  return issue({.kind = CollectiveKind::barrier}, "barrier", nullptr, "", opts.timeout,
               [&](Call&& call) { return run_barrier(std::move(call)); });
}

std::shared_ptr<Work> ProcessGroup::send(const Tensor& tensor, int dst,
                                         const SendRecvOptions& opts) {
  check_tensor("send", tensor);
  check_peer("send", dst, opts.tag);
  return issue({}, "send", &tensor, fmt::format("to rank {}, tag {}", dst, opts.tag), opts.timeout,
               [&](Call&& call) { return run_send(std::move(call), tensor, dst, opts.tag); });
}

std::shared_ptr<Work> ProcessGroup::recv(Tensor& tensor, int src, const SendRecvOptions& opts) {
  check_tensor("recv", tensor);
  check_peer("recv", src, opts.tag);
  count_write(tensor);
  return issue({}, "recv", &tensor, fmt::format("from rank {}, tag {}", src, opts.tag),
               opts.timeout,
               [&](Call&& call) { return run_recv(std::move(call), tensor, src, opts.tag); });
}

// Cheap, for every call: atomics only.
bool ProcessGroup::is_unusable() const {
  return abort_->is_set() || (inner_ != nullptr && inner_->is_unusable());
}

void ProcessGroup::report_stalls_after(std::chrono::milliseconds after) {
  if (inner_ != nullptr) return inner_->report_stalls_after(after);
  stall_report_ = after;
}

std::chrono::milliseconds ProcessGroup::stall_report_after() const {
  return inner_ != nullptr ? inner_->stall_report_after() : stall_report_;
}

std::string ProcessGroup::unusable_reason() const {
  std::string reason = abort_->reason();
  if (reason.empty() && inner_ != nullptr) reason = inner_->unusable_reason();
  return reason;
}

void ProcessGroup::abort(const std::string& reason) {
  if (!abort_->set(reason)) return;
  if (runtime::this_process_id() == maker_pid_) abort_peers(reason);
}

void ProcessGroup::refuse_in_forked_child(std::string_view op) const {
  if (runtime::this_process_id() == maker_pid_) return;
  throw CollectiveError(fmt::format(
      "{} on group '{}': this process (pid {}) was forked from the one that made the group "
      "(pid {}), and a forked child cannot use its parent's group (its threads are not here; "
      "its memory and connections are the parent's); do the collective in the parent, or start "
      "the child with lockstep::spawn or lockstep-run and call init_process_group() there",
      op, name_, ::getpid(), maker_pid_));
}

void ProcessGroup::refuse_if_unusable(std::string_view op) const {
  if (!is_unusable()) return;
  throw CollectiveError(fmt::format(
      "{} on {}: the group is unusable because {}; the ranks may now disagree on which "
      "collectives ran, so create a new process group on every rank (or restart the job)",
      op, where(), unusable_reason()));
}

Call ProcessGroup::make_call(CallSignature signature, std::string_view op, const Tensor* tensor,
                             std::string_view extra, const Timeout& timeout) {
  // Refused before the call is numbered, so the ranks' sequences stay alike.
  LOCKSTEP_CHECK(!timeout || timeout->count() > 0,
                 "{} on group '{}': the call's timeout must be positive, got {} ms; leave it "
                 "unset for the group's ({} ms)",
                 op, name_, timeout ? timeout->count() : 0, timeout_.count());
  refuse_if_unusable(op);
  const bool collective = op != "send" && op != "recv";
  Call call;
  call.timeout = std::min(timeout.value_or(timeout_), kLongestTimeout);
  call.deadline = Work::Clock::now() + call.timeout;
  call.stall_report = stall_report_after();
  if (label_ == nullptr) {
    label_ = std::make_shared<const std::string>(
        fmt::format("group '{}' ({}, {} ranks)", name_, backend(), size_));
  }
  call.group = label_;
  signature.rank = rank_;
  if (collective) signature.seq = ++seq_;
  if (!collective) {
    signature.dtype = tensor->dtype();
    signature.count = tensor->numel();
  }
  call.op = op;
  call.has_tensor = tensor != nullptr;
  call.extra = extra;
  call.own = signature;
  call.signature = signature;
  if (collective && next_origin_) {
    // Checked as the composite's call: its number, op and caller.
    call.signature = next_origin_->signature;
    call.signature.step = next_step_;
    call.group = next_origin_->group;
    call.ranks = std::move(next_ranks_);
    call.stall_report = next_origin_->stall_report;
    next_origin_.reset();
  }
  return call;
}

uint64_t ProcessGroup::record_start(const Call& call) const {
  const CallSignature& own = call.own;
  return distributed::FlightRecorder::instance().started(
      {.group = name_,
       .op = call.op,
       .dtype = call.has_tensor ? runtime::dtype_name(own.dtype) : std::string_view(),
       .group_size = size_,
       .group_rank = rank_,
       .seq = own.seq,
       .count = call.has_tensor ? own.count : 0,
       .root = own.root});
}

void ProcessGroup::record_failure(uint64_t record) {
  distributed::FlightRecorder::instance().ended(record, /*ok=*/false);
}

void ProcessGroup::check_next_as(ProcessGroup& member, const Call& origin, uint8_t step,
                                 std::shared_ptr<const std::vector<int>> ranks) {
  std::lock_guard lock(member.issue_mutex_);
  member.next_origin_ = origin;
  member.next_step_ = step;
  member.next_ranks_ = std::move(ranks);
}

std::string ProcessGroup::where() const {
  return fmt::format("rank {} of group '{}' ({}, {} ranks)", rank_, name_, backend(), size_);
}

std::string ProcessGroup::timeout_message(const Call& call, std::string_view detail) const {
  return collectives::timeout_message(call, where(), detail);
}

void ProcessGroup::check_tensor(std::string_view op, const Tensor& tensor) const {
  LOCKSTEP_CHECK(tensor.defined(), "{} on group '{}': the tensor is undefined", op, name_);
  // u8 and bool reduce in reduce_kernels.h, which only the CPU backends use;
  // NCCL's calls would reach them unmapped (nccl_types.h).
  const DType d = tensor.dtype();
  LOCKSTEP_CHECK(tensor.device().is_cpu() || (d != DType::u8 && d != DType::boolean),
                 "{} on group '{}': dtype {} is taken only in CPU tensors; convert this CUDA "
                 "tensor with .to(DType::i32) (or move it to the CPU) for the collective",
                 op, name_, runtime::dtype_name(d));
  LOCKSTEP_CHECK(tensor.is_contiguous(),
                 "{} on group '{}': the tensor must be contiguous; call .contiguous() and copy "
                 "the result back after the collective",
                 op, name_);
  check_device(op, tensor);
}

void ProcessGroup::check_device(std::string_view op, const Tensor& tensor) const {
  LOCKSTEP_CHECK(tensor.device().is_cpu(),
                 "{} on group '{}': the {} backend takes CPU tensors, this one is on {}; copy it "
                 "with .to(Device::cpu()) or use the nccl backend for CUDA tensors",
                 op, name_, backend(), tensor.device().str());
}

void ProcessGroup::check_root(std::string_view op, int root) const {
  LOCKSTEP_CHECK(root >= 0 && root < size_,
                 "{} on group '{}': root {} is not a rank of this group of {} ranks", op, name_,
                 root, size_);
}

void ProcessGroup::check_peer(std::string_view op, int peer, int tag) const {
  LOCKSTEP_CHECK(peer >= 0 && peer < size_ && peer != rank_,
                 "{} on group '{}': peer {} must be another rank of this group of {} ranks (this "
                 "is rank {})",
                 op, name_, peer, size_, rank_);
  LOCKSTEP_CHECK(tag >= 0, "{} on group '{}': tag {} must be >= 0", op, name_, tag);
}

void ProcessGroup::check_sizes(std::string_view op, std::string_view big_name, const Tensor& big,
                               std::string_view small_name, const Tensor& small) const {
  LOCKSTEP_CHECK(big.dtype() == small.dtype(),
                 "{} on group '{}': {} has dtype {} but {} has {}; they must match", op, name_,
                 big_name, runtime::dtype_name(big.dtype()), small_name,
                 runtime::dtype_name(small.dtype()));
  LOCKSTEP_CHECK(big.numel() == small.numel() * size_,
                 "{} on group '{}': {} has {} elements but needs size() * {}.numel() = {} * {} "
                 "= {}",
                 op, name_, big_name, big.numel(), small_name, size_, small.numel(),
                 small.numel() * size_);
}

}  // namespace lockstep::collectives
