#include "lockstep/collectives/mpi/mpi_group.h"

#include <mpi.h>

#include <climits>
#include <functional>
#include <mutex>
#include <type_traits>

#include <fmt/format.h>

#include "lockstep/collectives/mpi/mpi_progress.h"
#include "lockstep/collectives/mpi/mpi_runtime.h"
#include "lockstep/collectives/mpi/mpi_shutdown.h"
#include "lockstep/collectives/mpi/mpi_types.h"

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
        comm, fmt::format("rank {} of group '{}' (mpi, {} ranks)", rank, name, size));
    progress_->start_thread();
    hook_id_ = mpi::add_shutdown_hook([progress = progress_] { progress->shutdown(); });
  }

  ~MpiGroup() override {
    mpi::remove_shutdown_hook(hook_id_);
    progress_->shutdown();
  }

  std::string backend() const override { return "mpi"; }

  std::shared_ptr<Work> allreduce(Tensor& tensor, const AllreduceOptions& opts) override {
    check("allreduce", tensor);
    const int count = mpi_count("allreduce", tensor.numel());
    const MPI_Datatype type = mpi::mpi_datatype(tensor.dtype());
    const MPI_Op op = mpi::mpi_op(opts.op, tensor.dtype());
    void* data = tensor.raw_data();
    return enqueue(
        "allreduce", &tensor, to_string(opts.op), opts.timeout,
        [=, keep = tensor](MPI_Comm comm) {
          LOCKSTEP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, count, type, op, comm));
        },
        average_step(opts.op, tensor));
  }

  std::shared_ptr<Work> broadcast(Tensor& tensor, const BroadcastOptions& opts) override {
    check("broadcast", tensor);
    check_root("broadcast", opts.root);
    const int count = mpi_count("broadcast", tensor.numel());
    const MPI_Datatype type = mpi::mpi_datatype(tensor.dtype());
    const int root = opts.root;
    void* data = tensor.raw_data();
    return enqueue("broadcast", &tensor, fmt::format("root {}", root), opts.timeout,
                   [=, keep = tensor](MPI_Comm comm) {
                     LOCKSTEP_MPI_CHECK(MPI_Bcast(data, count, type, root, comm));
                   });
  }

  std::shared_ptr<Work> reduce(Tensor& tensor, const ReduceOptions& opts) override {
    check("reduce", tensor);
    check_root("reduce", opts.root);
    const int count = mpi_count("reduce", tensor.numel());
    const MPI_Datatype type = mpi::mpi_datatype(tensor.dtype());
    const MPI_Op op = mpi::mpi_op(opts.op, tensor.dtype());
    const int root = opts.root;
    const bool is_root = root == rank();
    void* data = tensor.raw_data();
    return enqueue(
        "reduce", &tensor, fmt::format("{}, root {}", to_string(opts.op), root), opts.timeout,
        [=, keep = tensor](MPI_Comm comm) {
          // The root reduces into its own tensor; the others only send.
          LOCKSTEP_MPI_CHECK(MPI_Reduce(is_root ? MPI_IN_PLACE : data, is_root ? data : nullptr,
                                        count, type, op, root, comm));
        },
        is_root ? average_step(opts.op, tensor) : nullptr);
  }

  std::shared_ptr<Work> allgather(Tensor& output, const Tensor& input,
                                  const AllgatherOptions& opts) override {
    check("allgather", input);
    check("allgather", output);
    check_same_dtype("allgather", output, input);
    LOCKSTEP_CHECK(output.numel() == input.numel() * size(),
                   "allgather on group '{}': output has {} elements, expected size() * "
                   "input.numel() = {} * {}; allocate the output with {} elements",
                   name(), output.numel(), size(), input.numel(), input.numel() * size());
    const int count = mpi_count("allgather", output.numel()) / size();
    const MPI_Datatype type = mpi::mpi_datatype(input.dtype());
    void* out = output.raw_data();
    // An input that is this rank's chunk of the output is gathered in place.
    const void* in = input.raw_data();
    const size_t my_offset = static_cast<size_t>(rank()) * count * input.element_size();
    if (in == static_cast<char*>(out) + my_offset) {
      in = MPI_IN_PLACE;
    }
    return enqueue("allgather", &input, "", opts.timeout,
                   [=, keep_in = input, keep_out = output](MPI_Comm comm) {
                     LOCKSTEP_MPI_CHECK(
                         MPI_Allgather(in, count, type, out, count, type, comm));
                   });
  }

  std::shared_ptr<Work> reduce_scatter(Tensor& output, const Tensor& input,
                                       const ReduceScatterOptions& opts) override {
    check("reduce_scatter", input);
    check("reduce_scatter", output);
    check_same_dtype("reduce_scatter", output, input);
    LOCKSTEP_CHECK(input.numel() == output.numel() * size(),
                   "reduce_scatter on group '{}': input has {} elements, expected size() * "
                   "output.numel() = {} * {}; the input must hold one output-sized chunk per rank",
                   name(), input.numel(), size(), output.numel());
    mpi_count("reduce_scatter", input.numel());
    const int count = static_cast<int>(output.numel());
    const MPI_Datatype type = mpi::mpi_datatype(input.dtype());
    const MPI_Op op = mpi::mpi_op(opts.op, input.dtype());
    const void* in = input.raw_data();
    void* out = output.raw_data();
    return enqueue(
        "reduce_scatter", &output, to_string(opts.op), opts.timeout,
        [=, keep_in = input, keep_out = output](MPI_Comm comm) {
          LOCKSTEP_MPI_CHECK(MPI_Reduce_scatter_block(in, out, count, type, op, comm));
        },
        average_step(opts.op, output));
  }

  std::shared_ptr<Work> barrier(const BarrierOptions& opts) override {
    return enqueue("barrier", nullptr, "", opts.timeout,
                   [](MPI_Comm comm) { LOCKSTEP_MPI_CHECK(MPI_Barrier(comm)); });
  }

  std::shared_ptr<Work> send(const Tensor& tensor, int dst, const SendRecvOptions& opts) override {
    check("send", tensor);
    check_peer("send", dst, opts.tag);
    const int count = mpi_count("send", tensor.numel());
    const MPI_Datatype type = mpi::mpi_datatype(tensor.dtype());
    const int tag = opts.tag;
    const void* data = tensor.raw_data();
    return enqueue_p2p("send", &tensor, fmt::format("to rank {}, tag {}", dst, tag), opts.timeout,
                   [=, keep = tensor](MPI_Comm comm, MPI_Request* request) {
                     LOCKSTEP_MPI_CHECK(MPI_Isend(data, count, type, dst, tag, comm, request));
                   });
  }

  std::shared_ptr<Work> recv(Tensor& tensor, int src, const SendRecvOptions& opts) override {
    check("recv", tensor);
    check_peer("recv", src, opts.tag);
    const int count = mpi_count("recv", tensor.numel());
    const MPI_Datatype type = mpi::mpi_datatype(tensor.dtype());
    const int tag = opts.tag;
    void* data = tensor.raw_data();
    // A shorter message than the tensor is an error too (MPI reports only a
    // longer one), since the rest of the tensor would be left stale.
    auto check_size = [=](const MPI_Status& status) {
      int received = 0;
      LOCKSTEP_MPI_CHECK(MPI_Get_count(&status, type, &received));
      LOCKSTEP_CHECK(received == count,
                     "received {} elements from rank {} but the tensor holds {}; send and recv "
                     "must use tensors of the same size and dtype",
                     received, src, count);
    };
    return enqueue_p2p(
        "recv", &tensor, fmt::format("from rank {}, tag {}", src, tag), opts.timeout,
        [=, keep = tensor](MPI_Comm comm, MPI_Request* request) {
          LOCKSTEP_MPI_CHECK(MPI_Irecv(data, count, type, src, tag, comm, request));
        },
        check_size);
  }

 private:
  void check(std::string_view op, const Tensor& tensor) const {
    check_tensor(op, tensor);
    LOCKSTEP_CHECK(tensor.device().is_cpu(),
                   "{} on group '{}': the mpi backend takes CPU tensors, this one is on {}; "
                   "copy it with .to(Device::cpu()) or use the nccl backend for CUDA tensors",
                   op, name(), tensor.device().str());
  }

  void check_same_dtype(std::string_view op, const Tensor& output, const Tensor& input) const {
    LOCKSTEP_CHECK(output.dtype() == input.dtype(),
                   "{} on group '{}': output dtype {} differs from input dtype {}; use one dtype",
                   op, name(), runtime::dtype_name(output.dtype()),
                   runtime::dtype_name(input.dtype()));
  }

  void check_peer(std::string_view op, int peer, int tag) const {
    LOCKSTEP_CHECK(peer >= 0 && peer < size(),
                   "{} on group '{}': peer {} is not a rank of this group of {} ranks", op, name(),
                   peer, size());
    LOCKSTEP_CHECK(tag >= 0 && tag <= tag_ub_,
                   "{} on group '{}': tag {} is outside MPI's range [0, {}]", op, name(), tag,
                   tag_ub_);
  }

  int mpi_count(std::string_view op, int64_t numel) const {
    LOCKSTEP_CHECK(numel <= INT_MAX,
                   "{} on group '{}': {} elements is more than one MPI call can carry ({}); "
                   "split the tensor into several collectives",
                   op, name(), numel, INT_MAX);
    return static_cast<int>(numel);
  }

  std::function<void(const MPI_Status&)> average_step(ReduceOp op, const Tensor& tensor) const {
    if (op != ReduceOp::Avg) return nullptr;
    const int n = size();
    return [n, keep = tensor](const MPI_Status&) { divide_by(keep, n); };
  }

  std::string abort_note() const {
    return fmt::format(
        ". MPI cannot cancel a collective in flight, so group '{}' is now aborted and every "
        "later call on it fails: stop the job on all ranks (mpirun does once this process "
        "exits non-zero) and restart it",
        name());
  }

  // A collective: MPI's blocking call, run on the progress thread.
  std::shared_ptr<Work> enqueue(std::string_view op_name, const Tensor* tensor,
                                std::string_view extra, const Timeout& timeout,
                                std::function<void(MPI_Comm)> run,
                                std::function<void(const MPI_Status&)> complete = nullptr) {
    auto op = std::make_shared<mpi::MpiOp>();
    op->run = std::move(run);
    op->complete = std::move(complete);
    return submit(op_name, tensor, extra, timeout, std::move(op));
  }

  // A send or recv: MPI's non-blocking call, tested until done.
  std::shared_ptr<Work> enqueue_p2p(std::string_view op_name, const Tensor* tensor,
                                    std::string_view extra, const Timeout& timeout,
                                    std::function<void(MPI_Comm, MPI_Request*)> start,
                                    std::function<void(const MPI_Status&)> complete = nullptr) {
    auto op = std::make_shared<mpi::MpiOp>();
    op->start = std::move(start);
    op->complete = std::move(complete);
    return submit(op_name, tensor, extra, timeout, std::move(op));
  }

  std::shared_ptr<Work> submit(std::string_view op_name, const Tensor* tensor,
                               std::string_view extra, const Timeout& timeout,
                               std::shared_ptr<mpi::MpiOp> op) {
    // One lock from numbering to queueing: sequence numbers follow issue order.
    std::lock_guard lock(mutex_);
    next_seq();
    op->description = describe(op_name, tensor, extra);
    const auto t = timeout_of(timeout);
    op->deadline = Work::Clock::now() + t;
    op->timeout_message = timeout_message(op->description, t) + abort_note();
    std::weak_ptr<mpi::MpiProgress> progress = progress_;
    op->work = std::make_shared<Work>(op->description, op->deadline, op->timeout_message,
                                      [progress, why = op->timeout_message] {
                                        if (auto p = progress.lock()) p->abort(why);
                                      });
    auto work = op->work;
    progress_->submit(std::move(op));
    return work;
  }

  MPI_Comm comm_;
  int tag_ub_ = 32767;
  int hook_id_ = -1;
  std::mutex mutex_;
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
                 "{}; under mpirun the rank and world size come from MPI (do not set "
                 "RANK/WORLD_SIZE by hand)",
                 name, rank, size, world_rank, world_size);
  // A duplicate per group: its own matching space, so two groups' collectives
  // never match each other. Collective: all ranks create groups in one order.
  MPI_Comm comm = MPI_COMM_NULL;
  LOCKSTEP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  LOCKSTEP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return std::make_shared<MpiGroup>(rank, size, name, timeout, comm);
}

}  // namespace lockstep::collectives
