// Started by lockstep-run (tests/collectives/test_multiprocess_gloo.cpp):
// init_process_group() from the environment, then every collective for every
// dtype (and reduce op) at element counts 1, 7 and 1001, each result checked
// exactly against values computed here (inputs are small integers, so bf16
// and f16 results are exact too).
//
// Prints "collective_worker rank R pid P" and "collective_worker rank R/N:
// backend B" (the backend init_process_group chose) once its group is made,
// then "collective_worker rank R/N: OK (<checks> checks)" and exits 0, or
// prints the first mismatch or error and exits 1.
//
// Flags: --backend NAME        instead of LOCKSTEP_BACKEND / the default
//        --device cuda         tensors on cuda:<local rank % devices>, made the
//                              current device first (nccl; CPU backends stage
//                              them through host memory)
//        --die-at-rank R       rank R exits with code 3 after the first barrier
//        --kill-at-rank R      rank R SIGKILLs itself after the first barrier
//        --diverge-at-rank R   rank R issues a broadcast where the others issue
//                              an allreduce (every backend must refuse it)
//        --stop-at-rank R      rank R stops itself (SIGSTOP) after the first
//                              barrier, as a hung rank
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/init.h"
#include "lockstep/config.h"
#include "lockstep/distributed/launch_env.h"
#include "lockstep/runtime/tensor.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/device.h"
#endif

namespace lc = lockstep::collectives;
namespace lr = lockstep::runtime;
using lc::ReduceOp;
using lr::DType;
using lr::Tensor;

namespace {

struct Flags {
  std::string backend;
  std::string device = "cpu";
  int die_at = -1;
  int kill_at = -1;
  int diverge_at = -1;
  int stop_at = -1;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) throw lockstep::Error(fmt::format("collective_worker: {} needs a value", arg));
    const std::string value = argv[++i];
    if (arg == "--backend") {
      f.backend = value;
    } else if (arg == "--device") {
      if (value != "cpu" && value != "cuda") {
        throw lockstep::Error(
            fmt::format("collective_worker: --device {}: use cpu or cuda", value));
      }
      f.device = value;
    } else if (arg == "--die-at-rank") {
      f.die_at = std::stoi(value);
    } else if (arg == "--kill-at-rank") {
      f.kill_at = std::stoi(value);
    } else if (arg == "--diverge-at-rank") {
      f.diverge_at = std::stoi(value);
    } else if (arg == "--stop-at-rank") {
      f.stop_at = std::stoi(value);
    } else {
      throw lockstep::Error(fmt::format("collective_worker: unknown flag {}", arg));
    }
  }
  return f;
}

const DType kDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max,
                         ReduceOp::Product};
const int64_t kCounts[] = {1, 7, 1001};

int64_t input_value(int r, int64_t i) { return (r * 3 + i * 7 + i / 5) % 7 - 3; }

lr::Device g_device = lr::Device::cpu();  // where the tensors live (--device)

Tensor input(int r, int64_t n, DType dtype) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(input_value(r, i));
  return Tensor::from_vector(v, {n}).to(dtype).to(g_device);
}

Tensor zeros(int64_t n, DType dtype) { return Tensor::zeros({n}, dtype, g_device); }

// cuda:<local rank % devices>, made current for the rest of the process.
void use_cuda_device() {
#if LOCKSTEP_HAVE_CUDA
  const int devices = lr::cuda_device_count();
  if (devices == 0) {
    throw lockstep::Error(fmt::format("collective_worker: --device cuda, but {}",
                                      lr::cuda_unavailable_reason()));
  }
  const int local_rank =
      lockstep::distributed::read_rank_info(lr::process_env(), {.allow_missing_store = true}).local_rank;
  g_device = lr::Device::cuda(local_rank % devices);
  LOCKSTEP_CUDA_CHECK(cudaSetDevice(g_device.index));
#else
  throw lockstep::Error("collective_worker: --device cuda, but lockstep was built without CUDA");
#endif
}

double reduced(ReduceOp op, DType dtype, int size, int64_t i) {
  int64_t sum = 0, product = 1, lo = input_value(0, i), hi = lo;
  for (int r = 0; r < size; ++r) {
    const int64_t v = input_value(r, i);
    sum += v;
    product *= v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  switch (op) {
    case ReduceOp::Sum: return double(sum);
    case ReduceOp::Product: return double(product);
    case ReduceOp::Min: return double(lo);
    case ReduceOp::Max: return double(hi);
    case ReduceOp::Avg:
      if (!lr::is_floating(dtype)) return double(sum / size);
      // The exact quotient as the dtype holds it (over 3 ranks it is inexact).
      return Tensor::from_vector(std::vector<double>{double(sum) / size}, {1})
          .to(dtype)
          .to_vector<double>()[0];
  }
  return 0;
}

class Checker {
 public:
  explicit Checker(lc::ProcessGroup& g) : g_(g) {}

  template <class Expected>
  void check(const Tensor& t, Expected expected, const std::string& what) {
    const auto v = t.to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) {
      const double e = expected(static_cast<int64_t>(i));
      if (v[i] != e) {
        throw lockstep::Error(fmt::format("MISMATCH in {}: element {} is {}, expected {}", what, i,
                                          v[i], e));
      }
    }
    ++checks_;
  }
  int checks() const { return checks_; }

  void run_all() {
    const int r = g_.rank(), n_ranks = g_.size();
    for (DType dtype : kDTypes) {
      const auto name = lr::dtype_name(dtype);
      for (int64_t n : kCounts) {
        for (ReduceOp op : kOps) {
          Tensor t = input(r, n, dtype);
          g_.allreduce(t, {.op = op, .timeout = {}})->wait();
          check(t, [&](int64_t i) { return reduced(op, dtype, n_ranks, i); },
                fmt::format("allreduce({}, {}, {})", name, n, lc::to_string(op)));

          Tensor full = input(r, n * n_ranks, dtype);
          Tensor chunk = zeros(n, dtype);
          g_.reduce_scatter(chunk, full, {.op = op, .timeout = {}})->wait();
          check(chunk, [&](int64_t i) { return reduced(op, dtype, n_ranks, r * n + i); },
                fmt::format("reduce_scatter({}, {}, {})", name, n, lc::to_string(op)));
        }
        for (int root = 0; root < n_ranks; ++root) {
          Tensor b = input(r, n, dtype);
          g_.broadcast(b, {.root = root, .timeout = {}})->wait();
          check(b, [&](int64_t i) { return double(input_value(root, i)); },
                fmt::format("broadcast({}, {}, root {})", name, n, root));
          Tensor t = input(r, n, dtype);
          g_.reduce(t, {.op = ReduceOp::Sum, .root = root, .timeout = {}})->wait();
          if (r == root) {
            check(t, [&](int64_t i) { return reduced(ReduceOp::Sum, dtype, n_ranks, i); },
                  fmt::format("reduce({}, {}, root {})", name, n, root));
          }
        }
        Tensor in = input(r, n, dtype);
        Tensor out = zeros(n * n_ranks, dtype);
        g_.allgather(out, in, {.timeout = {}})->wait();
        check(out, [&](int64_t i) { return double(input_value(static_cast<int>(i / n), i % n)); },
              fmt::format("allgather({}, {})", name, n));
      }
      // A ring of sends and recvs, where the group has them: shm sends
      // point to point through gloo.
      if (n_ranks > 1 && (g_.backend() != "shm" || LOCKSTEP_HAVE_GLOO)) {
        const int next = (r + 1) % n_ranks, prev = (r + n_ranks - 1) % n_ranks;
        Tensor send = input(r, 1001, dtype);
        Tensor recv = zeros(1001, dtype);
        auto sent = g_.send(send, next, {.tag = 7, .timeout = {}});
        g_.recv(recv, prev, {.tag = 7, .timeout = {}})->wait();
        sent->wait();
        check(recv, [&](int64_t i) { return double(input_value(prev, i)); },
              fmt::format("recv({}, 1001 from rank {})", name, prev));
      }
    }
    g_.barrier({.timeout = {}})->wait();
  }

 private:
  lc::ProcessGroup& g_;
  int checks_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string who = "collective_worker";
  try {
    const Flags flags = parse(argc, argv);
    if (flags.device == "cuda") use_cuda_device();
    lc::InitOptions options;
    options.backend = flags.backend;
    auto group = lc::init_process_group(options);
    const int rank = group->rank();
    who = fmt::format("collective_worker rank {}/{}", rank, group->size());
    // Tests find what a job left in /dev/shm by its rank 0's pid.
    std::printf("collective_worker rank %d pid %d\n", rank, static_cast<int>(::getpid()));
    std::printf("%s: backend %s\n", who.c_str(), group->backend().c_str());
    std::fflush(stdout);

    group->barrier({.timeout = {}})->wait();
    if (rank == flags.die_at) {
      std::printf("%s: exiting early with code 3 (--die-at-rank)\n", who.c_str());
      std::fflush(stdout);
      std::_Exit(3);
    }
    if (rank == flags.kill_at) {
      std::printf("%s: killing itself with SIGKILL (--kill-at-rank)\n", who.c_str());
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    if (rank == flags.stop_at) {
      std::printf("%s: stopping itself with SIGSTOP (--stop-at-rank)\n", who.c_str());
      std::fflush(stdout);
      std::raise(SIGSTOP);
    }
    if (flags.diverge_at >= 0) {
      Tensor t = zeros(1000, DType::f32);
      if (rank == flags.diverge_at) {
        group->broadcast(t, {.root = 0, .timeout = {}})->wait();
      } else {
        group->allreduce(t, {.op = ReduceOp::Sum, .timeout = {}})->wait();
      }
    }

    Checker checker(*group);
    checker.run_all();
    std::printf("%s: OK (%d checks)\n", who.c_str(), checker.checks());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: FAILED: %s\n", who.c_str(), e.what());
    return 1;
  }
}
