// ProcessGroup: the ranks of a job and the collectives among them.
//
// All ranks must issue the same collectives, with the same dtype, count and
// root, in the same order. Every backend checks this as it moves the data:
// a rank whose call differs fails on every rank at once, naming the call
// number and what each rank called, and the group is unusable afterwards
// (LOCKSTEP_DEBUG=detail adds a store-based report; see debug_group.h).
// Every call returns a Work at once; the tensors must stay alive and
// untouched until Work::wait() returns. Tensors must be contiguous, on a
// device the backend takes, of any dtype (CUDA ones: not u8 or bool). u8 and
// bool reduce as PyTorch: u8 Sum wraps modulo 256, bool Sum and Max are a
// logical or, Product and Min a logical and, and neither has an Avg.
// Anything refused is refused with a clear error before anything is sent.
//
// The class is the front every backend shares (as c10d's ProcessGroup over
// its Backends): the public calls validate their arguments, refuse calls on
// an unusable group, number the call and describe it (call.h), in one place;
// a backend implements the protected run_* hooks, which only move the data
// and check the call's signature against the other ranks'.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/collectives/abort_state.h"
#include "lockstep/collectives/call.h"
#include "lockstep/collectives/shared_pool.h"
#include "lockstep/collectives/types.h"
#include "lockstep/collectives/work.h"
#include "lockstep/runtime/tensor.h"

namespace lockstep::collectives {

using runtime::Tensor;

class ProcessGroup {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(10);
  // Deadlines are now + timeout, here and inside gloo: a longer timeout
  // (milliseconds::max() meant as "never") would overflow into the past and
  // time out at once. One over a year waits a year, LOCKSTEP_TIMEOUT_S's longest.
  static constexpr std::chrono::milliseconds kLongestTimeout = std::chrono::hours(24 * 365);

  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // e.g. "default"
  virtual std::string backend() const = 0;           // "gloo", "mpi", ...
  std::chrono::milliseconds timeout() const { return timeout_; }

  // In place: every rank ends with the reduction of all ranks' `tensor`.
  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts = {});
  // In place: every rank ends with `root`'s `tensor`.
  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts = {});
  // In place on `root` (the reduction of all ranks); others' tensors are left
  // unspecified.
  std::shared_ptr<Work> reduce(Tensor& tensor, const ReduceOptions& opts = {});
  // `output` holds size() * input.numel() elements: rank r's `input` at
  // offset r * input.numel() (PyTorch's all_gather_into_tensor). An `input`
  // that is this rank's chunk of `output` is gathered in place; one that
  // overlaps `output` elsewhere is sent from a copy made here.
  std::shared_ptr<Work> allgather(Tensor& output, const Tensor& input,
                                  const AllgatherOptions& opts = {});
  // `input` holds size() * output.numel() elements; rank r's `output` gets
  // the reduction over ranks of input's r-th chunk.
  std::shared_ptr<Work> reduce_scatter(Tensor& output, const Tensor& input,
                                       const ReduceScatterOptions& opts = {});
  std::shared_ptr<Work> barrier(const BarrierOptions& opts = {});
  // Point to point; matched by (peer, tag) in issue order. Not numbered or
  // checked as collectives are: only two ranks take part. A recv whose
  // tensor holds another count or dtype than the matching send's (gloo, shm
  // and shm+gloo through it, and mpi) fails naming what was sent; the send
  // completes and the group stays usable (with mpi, not after a message
  // longer than the tensor, which MPI fails as a truncation).
  std::shared_ptr<Work> send(const Tensor& tensor, int dst, const SendRecvOptions& opts = {});
  std::shared_ptr<Work> recv(Tensor& tensor, int src, const SendRecvOptions& opts = {});
  // Each call above that writes a tensor (the in-place ones, allgather's and
  // reduce_scatter's output, recv's tensor) counts as an in-place write of it
  // (its version goes up, as PyTorch's do): a tensor saved for backward and
  // then broadcast into is refused at backward, and autocast's cached cast
  // of a parameter is made again.

  // Collective (every rank, the same `bytes`, at the same point among the
  // group's calls): sets aside `bytes` per rank from which to take tensors
  // that this group's all-reduce and reduce read in place on every rank,
  // skipping their staging copies (shm: memory all ranks map). nullptr, on
  // every rank alike, where the backend has no such memory or it could not be
  // had (a full /dev/shm); ordinary tensors work as before either way.
  // Refused, as a collective is, in a forked child and on an unusable group.
  std::shared_ptr<SharedTensorPool> reserve_shared_pool(size_t bytes);

  // Makes the group unusable on this rank (later calls fail naming
  // `reason`) and tells the other ranks where the backend can (shm: at once;
  // gloo: by closing this rank's connections). The first reason stays. In a
  // child forked from the process that made the group, only the child's
  // copy: the other ranks are its parent's peers, not its own.
  void abort(const std::string& reason);
  // Why the group is unusable, or "" while it is usable: its own reason, or
  // that of the group it hands its calls to (wraps()), which may fail alone.
  std::string unusable_reason() const;

  // A collective that waits this long for other ranks prints one line to
  // standard error saying what it waits for and on whom (the default, 1
  // minute, is LOCKSTEP_STALL_REPORT_S's under init_process_group()); the
  // wait itself goes on until the timeout. Where the backend can tell. A
  // wrapper (wraps()) reads and sets its inner group's, which does the waiting.
  void report_stalls_after(std::chrono::milliseconds after);
  std::chrono::milliseconds stall_report_after() const;

 protected:
  ProcessGroup(int rank, int size, std::string name, std::chrono::milliseconds timeout);

  // The backend's part: move the data of `call`, which the front has
  // validated and numbered, and check as part of it that every rank issued
  // call.signature (a mismatch: CollectiveMismatch on every rank). Each
  // returns at once. On failure the backend makes the group unusable.
  virtual std::shared_ptr<Work> run_allreduce(Call call, Tensor& tensor, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> run_broadcast(Call call, Tensor& tensor, int root) = 0;
  virtual std::shared_ptr<Work> run_reduce(Call call, Tensor& tensor, ReduceOp op,
                                           int root) = 0;
  virtual std::shared_ptr<Work> run_allgather(Call call, Tensor& output,
                                              const Tensor& input) = 0;
  virtual std::shared_ptr<Work> run_reduce_scatter(Call call, Tensor& output,
                                                   const Tensor& input, ReduceOp op) = 0;
  virtual std::shared_ptr<Work> run_barrier(Call call) = 0;
  // call.signature is unused: point to point is not numbered.
  virtual std::shared_ptr<Work> run_send(Call call, const Tensor& tensor, int dst,
                                         int tag) = 0;
  virtual std::shared_ptr<Work> run_recv(Call call, Tensor& tensor, int src, int tag) = 0;
  // reserve_shared_pool's part, once the front has let the call through.
  // The default: nullptr (no memory the ranks share).
  virtual std::shared_ptr<SharedTensorPool> make_shared_pool(size_t bytes);

  // Throws, saying what to do, when the backend cannot take `tensor` on its
  // device. The default takes CPU tensors only.
  virtual void check_device(std::string_view op, const Tensor& tensor) const;
  // Tells the other ranks that this group is unusable, where the backend has
  // a way (called once, by abort()).
  virtual void abort_peers(const std::string& /*reason*/) {}

  // Shared with Works and worker threads that may outlive the group.
  const std::shared_ptr<AbortState>& abort_state() const { return abort_; }
  // "rank 1 of group 'default' (shm, 4 ranks)".
  std::string where() const;
  // "<description> timed out after 600 s on <where>: <detail>; raise the
  // timeout ...". An empty `detail` says some rank did not join in time.
  std::string timeout_message(const Call& call, std::string_view detail = {}) const;

  // Numbers and describes a call (`op`: "allreduce", ...; "send" and "recv"
  // are not numbered) and hands it to `run` with the issue lock held, so that
  // calls reach the backend in number order. Refuses calls on an unusable
  // group. Records the call in the flight recorder (distributed/flight_recorder.h)
  // until its Work ends. The public calls use it; so may a backend's own
  // collectives.
  template <class Run>
  std::shared_ptr<Work> issue(const CallSignature& signature, std::string_view op,
                              const Tensor* tensor, std::string_view extra, const Timeout& timeout,
                              Run&& run) {
    refuse_in_forked_child(op);  // before the lock, which a parent's thread may have held
    std::lock_guard lock(issue_mutex_);
    Call call = make_call(signature, op, tensor, extra, timeout);
    const uint64_t record = recorded_ ? record_start(call) : 0;
    try {
      std::shared_ptr<Work> work = run(std::move(call));
      if (record != 0) work->record_end_as(record);
      return work;
    } catch (...) {
      record_failure(record);
      throw;
    }
  }

  // A group that hands every call to `inner`'s public calls (a wrapper:
  // LOCKSTEP_DEBUG's checker, CUDA staging) leaves the flight recorder to
  // it, so each call is recorded once, and is unusable once `inner` is (a
  // timeout inside it aborts it, not the wrapper), and shares its stall
  // report interval. `inner` outlives this.
  void wraps(ProcessGroup& inner) {
    recorded_ = false;
    inner_ = &inner;
  }

  // Composite groups (hierarchical_group.h): the next collective issued on
  // `member` (a group the composite made and alone issues on) is checked as
  // step `step` of the composite's `origin`, so a mismatch names the
  // composite's call and ranks; `ranks` (the composite's rank of each of
  // the member's) makes its other errors name them too.
  static void check_next_as(ProcessGroup& member, const Call& origin, uint8_t step,
                            std::shared_ptr<const std::vector<int>> ranks = nullptr);

 private:
  bool is_unusable() const;
  // Throws in a child forked from the process that made the group: the
  // group's threads are not in it, and its memory and sockets are its
  // parent's, so a call there would wait for ever or take part in the
  // parent's collectives (as PyTorch, the child must make a group of its own).
  void refuse_in_forked_child(std::string_view op) const;
  // Throws once the group is unusable, naming why.
  void refuse_if_unusable(std::string_view op) const;
  // issue()'s, with the issue lock held.
  Call make_call(CallSignature signature, std::string_view op, const Tensor* tensor,
                 std::string_view extra, const Timeout& timeout);
  // The flight recorder's entry for `call` (issued now), and its end when
  // the backend refused the call at once.
  uint64_t record_start(const Call& call) const;
  static void record_failure(uint64_t record);
  void check_tensor(std::string_view op, const Tensor& tensor) const;
  void check_root(std::string_view op, int root) const;
  void check_peer(std::string_view op, int peer, int tag) const;
  // `big` holds size() times `small`'s elements, of the same dtype.
  void check_sizes(std::string_view op, std::string_view big_name, const Tensor& big,
                   std::string_view small_name, const Tensor& small) const;

  int rank_;
  int size_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  pid_t maker_pid_;  // the process that made the group; see refuse_in_forked_child()
  std::chrono::milliseconds stall_report_ = std::chrono::minutes(1);
  std::shared_ptr<AbortState> abort_ = std::make_shared<AbortState>();
  std::mutex issue_mutex_;  // held from numbering a call to handing it to the backend
  uint64_t seq_ = 0;        // collectives numbered so far
  bool recorded_ = true;    // see wraps()
  ProcessGroup* inner_ = nullptr;  // see wraps()
  // "group 'default' (shm, 4 ranks)", made at the first call.
  std::shared_ptr<const std::string> label_;
  // check_next_as's, consumed by the next collective.
  std::optional<Call> next_origin_;
  uint8_t next_step_ = 0;
  std::shared_ptr<const std::vector<int>> next_ranks_;
};

}  // namespace lockstep::collectives
