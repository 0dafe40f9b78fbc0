// All-reduce bandwidth in the shape of nccl-tests' all_reduce_perf: the same
// flags and columns, for lockstep's process groups and for the libraries they
// wrap called directly (benchmarks/common/allreduce_runners.h).
//
//   lockstep-run -np 2 build/bin/allreduce_perf -b 4K -e 64M -f 4 --backend gloo
//   mpirun -np 2 build/bin/allreduce_perf --backend mpi --json out.json
//   lockstep-run -np 1 build/bin/allreduce_perf --device cuda -b 4K -e 256M -f 4
//
// --device cuda: the buffer lives on cuda:(local rank % GPUs), made current
// before the group is created; the default backend is then nccl (gloo, shm
// and mpi stage the tensor through pinned host memory, for comparison). NCCL's
// Work::wait() only orders the caller's stream, so the clock stops after a
// device synchronize, as in nccl-tests.
//
// Columns: size (B), count (elements), type, redop, time (us per all-reduce,
// the slowest rank's mean over -n iterations), median (us: the slowest
// rank's median iteration, CPU tensors only), algbw = size / time, busbw =
// algbw * 2(n-1)/n (the rate each link must sustain in a ring), #wrong
// (elements that differ from the expected result with -c 1, on the rank with
// the most; nccl-tests sums them over the ranks). In place only.
#include <algorithm>
#include <cmath>
#include <limits>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/allreduce_runners.h"
#include "common/device.h"
#include "common/writable_file.h"
#include "harness.h"
#include "lockstep/distributed/device_select.h"
#include "lockstep/runtime/env.h"
#include "lockstep/runtime/error.h"

namespace {

using namespace lockstep;
using collectives::ReduceOp;
using runtime::DType;
using runtime::Tensor;
using nlohmann::json;

struct Options {
  std::string min_bytes = "32M";
  std::string max_bytes = "32M";
  int factor = 2;
  int warmup = 5;
  int iters = 20;
  int check = 1;
  std::string type = "float";
  std::string op = "sum";
  std::string backend;  // empty: gloo on the CPU, nccl on cuda
  std::string device = "cpu";
  bool shared_pool = false;
  std::string json_file;
};

size_t parse_bytes(const std::string& text, const std::string& flag) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  LOCKSTEP_CHECK(pos > 0 && value >= 0, "{} '{}': expected a size such as 4096, 4K, 64M or 1G",
                 flag, text);
  const std::string unit = text.substr(pos);
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1024;
  else if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else LOCKSTEP_CHECK(unit.empty(), "{} '{}': unknown unit '{}'; use K, M or G", flag, text, unit);
  // Converting inf or 1e30 to size_t is undefined (it read as a tiny size).
  constexpr double kMostBytes = 1024.0 * 1024 * 1024 * 1024 * 1024;  // 1 PiB
  LOCKSTEP_CHECK(value * scale <= kMostBytes, "{} '{}': larger than any buffer (at most 1 PiB)",
                 flag, text);
  return static_cast<size_t>(value * scale);
}

DType parse_type(const std::string& name) {
  if (name == "float") return DType::f32;
  if (name == "double") return DType::f64;
  if (name == "half") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  if (name == "int32" || name == "int") return DType::i32;
  if (name == "int64") return DType::i64;
  throw Error(fmt::format("-d '{}': use float, double, half, bfloat16, int32 or int64", name));
}

ReduceOp parse_op(const std::string& name) {
  if (name == "sum") return ReduceOp::Sum;
  if (name == "prod") return ReduceOp::Product;
  if (name == "min") return ReduceOp::Min;
  if (name == "max") return ReduceOp::Max;
  if (name == "avg") return ReduceOp::Avg;
  throw Error(fmt::format("-o '{}': use sum, prod, min, max or avg", name));
}

// Element i of rank r: small integers, so that sums are exact in every dtype.
double input_value(int rank, int64_t i) { return static_cast<double>((rank + i) % 8 + 1); }

double expected_value(int size, int64_t i, ReduceOp op) {
  double acc = input_value(0, i);
  for (int r = 1; r < size; ++r) {
    const double v = input_value(r, i);
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc += v; break;
      case ReduceOp::Product: acc *= v; break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
    }
  }
  return op == ReduceOp::Avg ? acc / size : acc;
}

// Fills on the host; a CUDA tensor gets a host tensor's copy.
void fill(Tensor& t, int rank) {
  Tensor host = t.device().is_cpu() ? t : Tensor::empty(t.shape(), t.dtype());
  runtime::dispatch_all(host.dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* p = host.data_ptr<T>();
    for (int64_t i = 0; i < host.numel(); ++i) p[i] = static_cast<T>(static_cast<float>(input_value(rank, i)));
  });
  if (!t.device().is_cpu()) t.copy_(host);
}

int64_t count_wrong(const Tensor& on_device, int size, ReduceOp op) {
  const Tensor t = on_device.to(runtime::Device::cpu());  // waits for the device
  int64_t wrong = 0;
  const bool integer = t.dtype() == DType::i32 || t.dtype() == DType::i64;
  const bool half = t.dtype() == DType::f16 || t.dtype() == DType::bf16;
  runtime::dispatch_all(t.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = t.data_ptr<T>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      double want = expected_value(size, i, op);
      if (integer) want = std::trunc(want);
      const double got = static_cast<double>(static_cast<float>(p[i]));
      const double tol = half ? 1e-2 * std::abs(want) : 1e-6 * std::abs(want);
      if (!(std::abs(got - want) <= tol)) ++wrong;
    }
  });
  return wrong;
}

std::string gbps(double v) { return fmt::format("{:.2f}", v); }

int run(const Options& o) {
  const size_t min_bytes = parse_bytes(o.min_bytes, "-b");
  const size_t max_bytes = parse_bytes(o.max_bytes, "-e");
  LOCKSTEP_CHECK(min_bytes <= max_bytes, "-b {} is larger than -e {}", o.min_bytes, o.max_bytes);
  LOCKSTEP_CHECK(o.factor >= 2, "-f {}: the size factor must be >= 2", o.factor);
  LOCKSTEP_CHECK(o.iters >= 1 && o.warmup >= 0, "-n must be >= 1 and -w >= 0");
  const DType dtype = parse_type(o.type);
  const ReduceOp op = parse_op(o.op);

  // The rank's GPU must be current before the group exists (NCCL's communicator).
  const runtime::Device device = distributed::select_device({.request = o.device});
  const std::string backend = !o.backend.empty() ? o.backend : device.is_cuda() ? "nccl" : "gloo";
  auto runner = bench::make_runner(backend, device);
  const int rank = runner->rank();
  const int n = runner->size();
  const size_t esize = runtime::dtype_size(dtype);
  const int64_t max_count = static_cast<int64_t>(std::max<size_t>(max_bytes / esize, 1));
  Tensor buffer = o.shared_pool ? runner->shared_tensor(max_count, dtype)
                                : Tensor::empty({max_count}, dtype, device);
  LOCKSTEP_CHECK(buffer.defined(),
                 "--shared-pool: backend {} on {} has no shared pool (lockstep's shm and shm+gloo "
                 "on the CPU have, where /dev/shm has room for {} bytes per rank)",
                 backend, device.str(), max_count * static_cast<int64_t>(esize));

  std::vector<std::vector<std::string>> rows;
  json results = json::array();
  double busbw_sum = 0;
  int64_t wrong_total = 0;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= o.factor) {
    const int64_t count = static_cast<int64_t>(bytes / esize);
    Tensor data = buffer.slice(0, 0, count);
    fill(data, rank);
    for (int i = 0; i < o.warmup; ++i) runner->allreduce(data, op);
    bench::synchronize(device);  // no-op on the CPU
    runner->barrier();
    // On the CPU each iteration is timed too: a VM's occasional stall of a
    // few milliseconds moves the mean of thousands of microsecond calls, not
    // their median. (CUDA calls return before the work is done: mean only.)
    std::vector<double> each;
    each.reserve(device.is_cpu() ? static_cast<size_t>(o.iters) : 0);
    const auto start = std::chrono::steady_clock::now();
    auto last = start;
    for (int i = 0; i < o.iters; ++i) {
      runner->allreduce(data, op);
      if (device.is_cpu()) {
        const auto now = std::chrono::steady_clock::now();
        each.push_back(std::chrono::duration<double>(now - last).count());
        last = now;
      }
    }
    bench::synchronize(device);
    const double local = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double seconds = runner->max_over_ranks(local) / o.iters;
    double median = std::numeric_limits<double>::quiet_NaN();
    if (!each.empty()) {
      median = runner->max_over_ranks(bench::median(each));
    }

    int64_t wrong = 0;
    if (o.check) {
      fill(data, rank);
      runner->allreduce(data, op);
      wrong = count_wrong(data, n, op);
      wrong = static_cast<int64_t>(runner->max_over_ranks(static_cast<double>(wrong)));
    }
    const double algbw = static_cast<double>(count * esize) / seconds / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    busbw_sum += busbw;
    wrong_total += wrong;
    rows.push_back({std::to_string(count * esize), std::to_string(count), o.type, o.op,
                    fmt::format("{:.1f}", seconds * 1e6),
                    std::isnan(median) ? std::string("-") : fmt::format("{:.1f}", median * 1e6),
                    gbps(algbw), gbps(busbw),
                    o.check ? std::to_string(wrong) : "N/A"});
    results.push_back({{"size_bytes", count * esize}, {"count", count}, {"type", o.type},
                       {"redop", o.op}, {"time_us", seconds * 1e6},
                       {"median_us", std::isnan(median) ? json(nullptr) : json(median * 1e6)},
                       {"algbw_gbps", algbw},
                       {"busbw_gbps", busbw}, {"wrong", o.check ? json(wrong) : json(nullptr)}});
    if (bytes == 0) break;
  }

  if (rank == 0) {
    std::cout << fmt::format("# allreduce_perf: backend {}, {} ranks, {}{}{} warm-up + {} timed "
                             "iterations per size, in place\n# {}\n",
                             backend, n, device.is_cuda() ? "CUDA tensors, " : "",
                             o.shared_pool ? "the buffer in the group's shared pool, " : "", o.warmup,
                             o.iters, bench::machine_description(device));
    std::cout << bench::format_table({"size (B)", "count", "type", "redop", "time (us)",
                                      "median (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong"},
                                     rows);
    std::cout << fmt::format("# Avg bus bandwidth: {:.3f} GB/s\n",
                             rows.empty() ? 0.0 : busbw_sum / static_cast<double>(rows.size()));
    if (!o.json_file.empty()) {
      json doc{{"benchmark", "allreduce_perf"}, {"backend", backend}, {"ranks", n},
               {"device", device.is_cuda() ? fmt::format("cuda:{}", device.index) : "cpu"},
               {"warmup", o.warmup}, {"iters", o.iters}, {"shared_pool", o.shared_pool},
               {"machine", bench::machine_description(device)}, {"results", results}};
      if (device.is_cuda()) doc["gpu"] = bench::device_name(device);
      bench::write_json_file(doc, o.json_file);
    }
  }
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"All-reduce bandwidth (nccl-tests' all_reduce_perf flags and columns)"};
  app.add_option("-b,--minbytes", o.min_bytes, "smallest size, e.g. 4K")->capture_default_str();
  app.add_option("-e,--maxbytes", o.max_bytes, "largest size, e.g. 64M")->capture_default_str();
  app.add_option("-f,--stepfactor", o.factor, "multiply the size by this each step")->capture_default_str();
  app.add_option("-w,--warmup_iters", o.warmup, "untimed iterations per size")->capture_default_str();
  app.add_option("-n,--iters", o.iters, "timed iterations per size")->capture_default_str();
  app.add_option("-c,--check", o.check, "check the results (0 or 1)")->capture_default_str();
  app.add_option("-d,--datatype", o.type, "float, double, half, bfloat16, int32, int64")->capture_default_str();
  app.add_option("-o,--op", o.op, "sum, prod, min, max, avg")->capture_default_str();
  app.add_option("--backend", o.backend,
                 "gloo, mpi, shm, shm+gloo (hierarchical), nccl (lockstep's groups); raw-gloo, "
                 "raw-mpi (the libraries "
                 "directly). Default: gloo, or nccl with --device cuda");
  app.add_option("--device", o.device, "cpu, or cuda: the buffer on cuda:(local rank % GPUs)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_flag("--shared-pool", o.shared_pool,
               "take the buffer from the group's shared pool, which shm's all-reduce reads in "
               "place (as DDP's buckets)");
  app.add_option("--json", o.json_file, "also write the results as JSON to this file (rank 0)")
      ->check(bench::writable_file);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    fmt::print(stderr, "allreduce_perf: error: {}\n", e.what());
    return 1;
  }
}
