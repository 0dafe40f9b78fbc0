#include "common/allreduce_runners.h"

#include <filesystem>
#include <unistd.h>

#include "common/device.h"
#include "lockstep/collectives/init.h"
#include "lockstep/config.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/runtime/error.h"
#include "lockstep/runtime/tensor.h"

#if LOCKSTEP_HAVE_MPI
#include <mpi.h>

#include "lockstep/collectives/mpi/mpi_runtime.h"
#endif

#if LOCKSTEP_HAVE_GLOO
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#endif

namespace lockstep::bench {
namespace {

using collectives::ReduceOp;
using runtime::DType;

// ---- lockstep's own process groups -------------------------------------------

class GroupRunner final : public AllreduceRunner {
 public:
  GroupRunner(const std::string& backend, const runtime::Device& device)
      : group_(collectives::init_process_group({.backend = backend})), device_(device) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

  void allreduce(runtime::Tensor& data, ReduceOp op) override {
    group_->allreduce(data, {.op = op})->wait();
  }
  void barrier() override { group_->barrier()->wait(); }
  // Through a tensor on the runner's device (nccl takes CUDA tensors only);
  // item() reads it on the host, after the all-reduce.
  double max_over_ranks(double value) override {
    return bench::max_over_ranks(*group_, value, device_);
  }
  runtime::Tensor shared_tensor(int64_t count, DType dtype) override {
    if (!device_.is_cpu()) return {};
    pool_ = group_->reserve_shared_pool(static_cast<size_t>(count) * runtime::dtype_size(dtype));
    return pool_ ? pool_->empty({count}, dtype) : runtime::Tensor();
  }

 private:
  std::shared_ptr<collectives::ProcessGroup> group_;
  std::shared_ptr<collectives::SharedTensorPool> pool_;
  runtime::Device device_;
};

#if LOCKSTEP_HAVE_MPI
// ---- Open MPI directly ------------------------------------------------------------

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: break;
  }
  throw Error(fmt::format("raw-mpi: MPI has no built-in type for {}; use float, double, int32 "
                          "or int64",
                          runtime::dtype_name(d)));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Product: return MPI_PROD;
    case ReduceOp::Avg: break;
  }
  throw Error("raw-mpi: MPI has no average operation; use sum");
}

class RawMpiRunner final : public AllreduceRunner {
 public:
  RawMpiRunner() {
    collectives::mpi::ensure_mpi_initialized();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allreduce(runtime::Tensor& data, ReduceOp op) override {
    LOCKSTEP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data.raw_data(),
                                     static_cast<int>(data.numel()), mpi_type(data.dtype()),
                                     mpi_op(op), MPI_COMM_WORLD));
  }
  void barrier() override { LOCKSTEP_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }
  double max_over_ranks(double value) override {
    LOCKSTEP_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    return value;
  }

 private:
  int rank_ = 0;
  int size_ = 1;
};
#endif

#if LOCKSTEP_HAVE_GLOO
// ---- gloo directly ---------------------------------------------------------------

// Ranks of one host meet in a directory named after the job's store address and
// token (unique per launcher run), so no lockstep store code is involved.
class RawGlooRunner final : public AllreduceRunner {
 public:
  RawGlooRunner() {
    const distributed::RankInfo info = distributed::read_rank_info();
    rank_ = info.rank;
    size_ = info.world_size;
    dir_ = fmt::format("/tmp/lockstep-raw-gloo-{}-{}", info.store_port,
                       info.token.empty() ? "notoken" : info.token.substr(0, 16));
    std::filesystem::create_directories(dir_);
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir_);
    context_ = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
    context_->connectFullMesh(store, device);
  }
  ~RawGlooRunner() override {
    if (rank_ == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(runtime::Tensor& data, ReduceOp op) override {
    LOCKSTEP_CHECK(data.dtype() == DType::f32 && op == ReduceOp::Sum,
                   "raw-gloo: only float sum is wired up (the peer of lockstep's default path)");
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data.data_ptr<float>(), static_cast<size_t>(data.numel()));
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
        &gloo::sum<float>));
    gloo::allreduce(opts);
  }
  void barrier() override {
    gloo::BarrierOptions opts(context_);
    gloo::barrier(opts);
  }
  double max_over_ranks(double value) override {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(&value, 1);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
        &gloo::max<double>));
    gloo::allreduce(opts);
    return value;
  }

 private:
  int rank_ = 0;
  int size_ = 1;
  std::string dir_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
};
#endif

}  // namespace

std::vector<std::string> runner_names() {
  std::vector<std::string> names = {"shm"};
#if LOCKSTEP_HAVE_NCCL
  names.push_back("nccl");
#endif
#if LOCKSTEP_HAVE_GLOO
  names.insert(names.end(), {"gloo", "shm+gloo", "raw-gloo"});
#endif
#if LOCKSTEP_HAVE_MPI
  names.insert(names.end(), {"mpi", "raw-mpi"});
#endif
  return names;
}

std::unique_ptr<AllreduceRunner> make_runner(const std::string& backend,
                                             const runtime::Device& device) {
  const bool group = backend == "gloo" || backend == "mpi" || backend == "shm" ||
                     backend == "shm+gloo" || backend == "nccl";
  if (group) return std::make_unique<GroupRunner>(backend, device);
  LOCKSTEP_CHECK(!device.is_cuda(),
                 "allreduce_perf: backend '{}' reduces host memory; on --device cuda use nccl, "
                 "or gloo, shm or mpi (staged through pinned host memory)",
                 backend);
#if LOCKSTEP_HAVE_MPI
  if (backend == "raw-mpi") return std::make_unique<RawMpiRunner>();
#endif
#if LOCKSTEP_HAVE_GLOO
  if (backend == "raw-gloo") return std::make_unique<RawGlooRunner>();
#endif
  throw Error(fmt::format("allreduce_perf: backend '{}' is not available in this build; "
                          "available: {}",
                          backend, fmt::join(runner_names(), ", ")));
}

}  // namespace lockstep::bench
