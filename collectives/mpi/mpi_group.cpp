#include "lockstep/collectives/mpi/mpi_group.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <climits>
#include <functional>
#include <type_traits>

#include <fmt/format.h>

#include "lockstep/collectives/float_average.h"
#include "lockstep/collectives/mpi/mpi_call_check.h"
#include "lockstep/collectives/mpi/mpi_progress.h"
#include "lockstep/collectives/mpi/mpi_runtime.h"
#include "lockstep/collectives/mpi/mpi_shutdown.h"
#include "lockstep/collectives/mpi/mpi_types.h"
#include "lockstep/collectives/p2p_text.h"

namespace lockstep::collectives {
namespace {

using runtime::DType;

template <class T>
void divide_elements(void* data, int64_t count, int n) {
  T* p = static_cast<T*>(data);
  for (int64_t i = 0; i < count; ++i) {
    if constexpr (std::is_integral_v<T>) {
      p[i] = static_cast<T>(p[i] / n);  // C++ division truncates toward zero
    } else if constexpr (std::is_floating_point_v<T>) {
      p[i] = p[i] / static_cast<T>(n);
    } else {  // bf16, f16: through float
      p[i] = T(static_cast<float>(p[i]) / static_cast<float>(n));
    }
  }
}

// Avg = the sum divided by the group size (see types.h).
void divide_by(const Tensor& t, int n) {
  void* data = t.raw_data();
  switch (t.dtype()) {
    case DType::f32: return divide_elements<float>(data, t.numel(), n);
    case DType::f64: return divide_elements<double>(data, t.numel(), n);
    case DType::bf16: return divide_elements<runtime::bf16>(data, t.numel(), n);
    case DType::f16: return divide_elements<runtime::f16>(data, t.numel(), n);
    case DType::i32: return divide_elements<int32_t>(data, t.numel(), n);
    case DType::i64: return divide_elements<int64_t>(data, t.numel(), n);
    default: LOCKSTEP_ASSERT(false);
  }
}

// What a send's first message says about its second: {dtype, element count}.
using P2pHeader = std::array<int64_t, 2>;

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(int rank, int size, const std::string& name, std::chrono::milliseconds timeout,
           MPI_Comm comm)
      : ProcessGroup(rank, size, name, timeout), comm_(comm) {
    int* tag_ub = nullptr;
    int found = 0;
    LOCKSTEP_MPI_CHECK(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found));
    tag_ub_ = found != 0 && tag_ub != nullptr ? *tag_ub : 32767;  // 32767: the MPI minimum
    progress_ = std::make_shared<mpi::MpiProgress>(
        comm, fmt::format("rank {} of group '{}' (mpi, {} ranks)", rank, name, size),
        abort_state());
    progress_->start_thread();
    hook_id_ = mpi::add_shutdown_hook([progress = progress_] { progress->shutdown(); });
  }

  ~MpiGroup() override {
    mpi::remove_shutdown_hook(hook_id_);
    progress_->shutdown();
  }

  std::string backend() const override { return "mpi"; }

  // MPI cannot cancel a call: the other ranks learn of the abort when this
  // process exits (mpirun then ends the job).
  void abort_peers(const std::string& reason) override { progress_->abort(reason); }

 protected:
  std::shared_ptr<Work> run_allreduce(Call call, Tensor& tensor, ReduceOp op) override {
    const int count = mpi_count(call, tensor.numel());
    const Tensor x = in_reduction_dtype(tensor, op);
    const MPI_Datatype type = mpi::mpi_datatype(x.dtype());
    const MPI_Op mpi_op = mpi::mpi_op(op, x.dtype());
    void* data = x.raw_data();
    return enqueue(
        call,
        [=, keep = x](MPI_Comm comm) {
          LOCKSTEP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, type, mpi_op, comm));
        },
        average_step(op, tensor, x));
  }

  std::shared_ptr<Work> run_broadcast(Call call, Tensor& tensor, int root) override {
    const int count = mpi_count(call, tensor.numel());
    const MPI_Datatype type = mpi::mpi_datatype(tensor.dtype());
    void* data = tensor.raw_data();
    return enqueue(call, [=, keep = tensor](MPI_Comm comm) {
      LOCKSTEP_MPI_CHECK(MPI_Bcast(data, count, type, root, comm));
    });
  }

  std::shared_ptr<Work> run_reduce(Call call, Tensor& tensor, ReduceOp op,
                                   int root) override {
    const int count = mpi_count(call, tensor.numel());
    const Tensor x = in_reduction_dtype(tensor, op);
    const MPI_Datatype type = mpi::mpi_datatype(x.dtype());
    const MPI_Op mpi_op = mpi::mpi_op(op, x.dtype());
    const bool is_root = root == rank();
    void* data = x.raw_data();
    return enqueue(
        call,
        [=, keep = x](MPI_Comm comm) {
          // The root reduces into its own tensor; the others only send.
          LOCKSTEP_MPI_CHECK(MPI_Reduce(is_root ? MPI_IN_PLACE : data, is_root ? data : nullptr,
                                        count, type, mpi_op, root, comm));
        },
        is_root ? average_step(op, tensor, x) : nullptr);
  }

  std::shared_ptr<Work> run_allgather(Call call, Tensor& output,
                                      const Tensor& input) override {
    const int count = mpi_count(call, output.numel()) / size();
    const MPI_Datatype type = mpi::mpi_datatype(input.dtype());
    void* out = output.raw_data();
    // An input that is this rank's chunk of the output is gathered in place.
    const void* in = input.raw_data();
    const size_t my_offset = static_cast<size_t>(rank()) * count * input.element_size();
    if (in == static_cast<char*>(out) + my_offset) {
      in = MPI_IN_PLACE;
    }
    return enqueue(call, [=, keep_in = input, keep_out = output](MPI_Comm comm) {
      LOCKSTEP_MPI_CHECK(MPI_Allgather(in, count, type, out, count, type, comm));
    });
  }

  std::shared_ptr<Work> run_reduce_scatter(Call call, Tensor& output, const Tensor& input,
                                           ReduceOp op) override {
    mpi_count(call, input.numel());
    const int count = static_cast<int>(output.numel());
    const Tensor x_in = in_reduction_dtype(input, op);
    const Tensor x_out = in_reduction_dtype(output, op, /*with_values=*/false);
    const MPI_Datatype type = mpi::mpi_datatype(x_in.dtype());
    const MPI_Op mpi_op = mpi::mpi_op(op, x_in.dtype());
    const void* in = x_in.raw_data();
    void* out = x_out.raw_data();
    return enqueue(
        call,
        [=, keep_in = x_in, keep_out = x_out](MPI_Comm comm) {
          LOCKSTEP_MPI_CHECK(MPI_Reduce_scatter_block(in, out, count, type, mpi_op, comm));
        },
        average_step(op, output, x_out));
  }

  // The call check is itself a barrier.
  std::shared_ptr<Work> run_barrier(Call call) override {
    return enqueue(call, [](MPI_Comm) {});
  }

  // Each send is two messages on its tag, a header (the dtype and element
  // count) and the data, sent and received at once: MPI does not compare
  // dtypes, so without the header an f32 tensor received as an i32 one of the
  // same size would pass as a message. Messages between two ranks on one tag
  // match in the order sent, so the pairs never mix.
  std::shared_ptr<Work> run_send(Call call, const Tensor& tensor, int dst,
                                 int tag) override {
    check_tag(call, tag);
    const int count = mpi_count(call, tensor.numel());
    const MPI_Datatype type = mpi::mpi_datatype(tensor.dtype());
    const void* data = tensor.raw_data();
    auto header = std::make_shared<P2pHeader>(
        P2pHeader{static_cast<int64_t>(tensor.dtype()), tensor.numel()});
    return enqueue_p2p(
        call, p2p_detail(true, dst, tag),
        [=, keep = tensor](MPI_Comm comm, MPI_Request* requests) {
          LOCKSTEP_MPI_CHECK(
              MPI_Isend(header->data(), 2, MPI_INT64_T, dst, tag, comm, &requests[0]));
          LOCKSTEP_MPI_CHECK(MPI_Isend(data, count, type, dst, tag, comm, &requests[1]));
        });
  }

  std::shared_ptr<Work> run_recv(Call call, Tensor& tensor, int src, int tag) override {
    check_tag(call, tag);
    const int count = mpi_count(call, tensor.numel());
    const DType dtype = tensor.dtype();
    const MPI_Datatype type = mpi::mpi_datatype(dtype);
    void* data = tensor.raw_data();
    auto header = std::make_shared<P2pHeader>();
    // A message of another dtype or size is an error, whether longer than the
    // tensor (which MPI reports, but only as a truncation), shorter (which
    // would leave the rest of the tensor stale) or of the same bytes.
    auto check_sent = [=](const MPI_Status&) {
      const auto sent_dtype = static_cast<DType>((*header)[0]);
      const int64_t sent = (*header)[1];
      LOCKSTEP_CHECK(sent_dtype == dtype && sent == count,
                     "rank {} sent {} elements of {} but the tensor holds {} of {}; send and recv "
                     "must use tensors of the same size and dtype (what arrived of the message "
                     "is in the tensor now)",
                     src, sent, runtime::dtype_name(sent_dtype), count, runtime::dtype_name(dtype));
    };
    return enqueue_p2p(
        call, p2p_detail(false, src, tag),
        [=, keep = tensor](MPI_Comm comm, MPI_Request* requests) {
          LOCKSTEP_MPI_CHECK(
              MPI_Irecv(header->data(), 2, MPI_INT64_T, src, tag, comm, &requests[0]));
          LOCKSTEP_MPI_CHECK(MPI_Irecv(data, count, type, src, tag, comm, &requests[1]));
        },
        check_sent);
  }

 private:
  void check_tag(const Call& call, int tag) const {
    LOCKSTEP_CHECK(tag <= tag_ub_, "{} on group '{}': tag {} is outside MPI's range [0, {}]",
                   call.description(), name(), tag, tag_ub_);
  }

  // Why a send or recv may time out here: besides a peer that never
  // matched it, one that waits for it before joining a collective that this
  // rank issued first, since this group's calls start in issue order.
  static std::string p2p_detail(bool is_send, int peer, int tag) {
    return fmt::format(
        "{}. On mpi a send or recv starts only once the collectives issued before it on this "
        "rank's group have finished: if rank {} waits for its {} this rank before it joins one "
        "of those, both wait until the timeout (issue the send or recv before them)",
        p2p_timeout_detail(is_send, peer, tag), peer, is_send ? "recv from" : "send to");
  }

  int mpi_count(const Call& call, int64_t numel) const {
    LOCKSTEP_CHECK(numel <= INT_MAX,
                   "{} on group '{}': {} elements is more than one MPI call can carry ({}); "
                   "split the tensor into several collectives",
                   call.description(), name(), numel, INT_MAX);
    return static_cast<int>(numel);
  }

  // Divides `reduced` (`tensor`, or its float copy) and writes it back.
  std::function<void(const MPI_Status&)> average_step(ReduceOp op, const Tensor& tensor,
                                                      const Tensor& reduced) const {
    if (op != ReduceOp::Avg) return nullptr;
    const int n = size();
    return [n, tensor, reduced](const MPI_Status&) {
      divide_by(reduced, n);
      write_back(tensor, reduced);
    };
  }

  std::string abort_note() const {
    return fmt::format(
        ". MPI cannot cancel a collective in flight, so group '{}' is now aborted and every "
        "later call on it fails: stop the job on all ranks (mpirun does once this process "
        "exits non-zero) and restart it",
        name());
  }

  // A collective: the call check, then MPI's blocking call, both run on the
  // progress thread.
  std::shared_ptr<Work> enqueue(const Call& call, std::function<void(MPI_Comm)> run,
                                std::function<void(const MPI_Status&)> complete = nullptr) {
    auto op = std::make_shared<mpi::MpiOp>();
    op->run = [call, run = std::move(run)](MPI_Comm comm) {
      mpi::check_same_call(comm, call);
      run(comm);
    };
    op->complete = std::move(complete);
    return submit(call, std::move(op));
  }

  // A send or recv: MPI's non-blocking call, tested until done.
  // `detail`: what the timeout's message says did not happen.
  std::shared_ptr<Work> enqueue_p2p(const Call& call, const std::string& detail,
                                    std::function<void(MPI_Comm, MPI_Request*)> start,
                                    std::function<void(const MPI_Status&)> complete = nullptr) {
    auto op = std::make_shared<mpi::MpiOp>();
    op->start = std::move(start);
    op->complete = std::move(complete);
    return submit(call, std::move(op), detail);
  }

  // The front numbers calls under its lock while handing them here, so they
  // reach the progress thread in sequence order.
  std::shared_ptr<Work> submit(const Call& call, std::shared_ptr<mpi::MpiOp> op,
                               const std::string& detail = {}) {
    op->description = call.description();
    op->deadline = call.deadline;
    op->timeout_message = timeout_message(call, detail) + abort_note();
    std::weak_ptr<mpi::MpiProgress> progress = progress_;
    std::weak_ptr<AbortState> abort = abort_state();
    op->work = std::make_shared<Work>(op->description, op->deadline, op->timeout_message,
                                      [progress, abort, why = op->timeout_message] {
                                        if (auto state = abort.lock()) state->set(why);
                                        if (auto p = progress.lock()) p->abort(why);
                                      });
    auto work = op->work;
    progress_->submit(std::move(op));
    return work;
  }

  MPI_Comm comm_;
  int tag_ub_ = 32767;
  int hook_id_ = -1;
  std::shared_ptr<mpi::MpiProgress> progress_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_mpi_group(int rank, int size, const std::string& name,
                                             std::chrono::milliseconds timeout) {
  mpi::ensure_mpi_initialized();
  const int world_rank = mpi::world_rank();
  const int world_size = mpi::world_size();
  LOCKSTEP_CHECK(rank == world_rank && size == world_size,
                 "mpi group '{}': asked for rank {} of {}, but MPI_COMM_WORLD says rank {} of "
                 "{}. The mpi backend needs processes that mpirun (or srun with PMI) started "
                 "together: one that lockstep-run, spawn or torchrun started is an MPI world of "
                 "its own. Start the program with mpirun -np {}, or use another backend (shm, "
                 "gloo, shm+gloo); under mpirun, do not set RANK/WORLD_SIZE by hand",
                 name, rank, size, world_rank, world_size, size);
  // A duplicate per group: its own matching space, so two groups' collectives
  // never match each other. Collective: all ranks create groups in one order.
  MPI_Comm comm = MPI_COMM_NULL;
  LOCKSTEP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  LOCKSTEP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return std::make_shared<MpiGroup>(rank, size, name, timeout, comm);
}

std::shared_ptr<ProcessGroup> make_mpi_subgroup(const std::vector<int>& members,
                                                const std::string& name,
                                                std::chrono::milliseconds timeout) {
  mpi::ensure_mpi_initialized();
  const int world_rank = mpi::world_rank();
  const auto mine = std::find(members.begin(), members.end(), world_rank);
  const bool member = mine != members.end();
  MPI_Comm comm = MPI_COMM_NULL;
  LOCKSTEP_MPI_CHECK(
      MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, world_rank, &comm));
  if (!member) return nullptr;
  LOCKSTEP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return std::make_shared<MpiGroup>(static_cast<int>(mine - members.begin()),
                                    static_cast<int>(members.size()), name, timeout, comm);
}

}  // namespace lockstep::collectives
