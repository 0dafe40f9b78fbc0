// One rank's check of SyncBatchNorm against plain BatchNorm on the global
// batch, shared by the in-process tests (tests/nn/test_sync_batch_norm.cpp
// and tests/gpu/test_cuda_sync_batch_norm.cpp, one thread per rank) and the
// multi-process worker (tests/workers/sync_bn_worker.cpp). Returns problems as
// strings: Catch2 assertions are not thread-safe, and the worker prints them.
//
// SyncBatchNorm runs on the case's device (CPU or CUDA); the reference
// always runs on the CPU, so a CUDA case compares against the CPU op. The
// check's own collectives use tensors on the case's device, so they suit
// every backend that takes them (NCCL included).
//
// Every rank generates the same global batch (same seed), computes the
// reference on all of it, and runs SyncBatchNorm on its own rows. Compared,
// each step: this rank's output and input gradient against the reference's
// rows; running_mean/var against the reference's; weight and bias gradients
// summed over ranks (what DDP would average, times the world size) against the
// reference's; and running statistics bitwise equal on every rank.
//
// Tolerance: |got - want| <= tol * max(1, |want|), tol = 1e-5 for f32 and
// 1e-10 for f64, on both devices. Statistics and gradient sums are
// accumulated in double in both (on CUDA with Welford's update rather than
// shifted sums), but in a different order and split, and the outputs are
// rounded to f32 after a few multiply-adds (fused on CUDA): about 1e-7
// relative, so 1e-5 leaves a wide margin while a wrong count or mean (errors
// of 1e-2 and more) fails at once. An element never written (NaN where the
// device memory was poisoned) fails too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "lockstep/collectives/process_group.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/sync_batch_norm.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"

namespace lockstep::testing {

struct SyncBnCase {
  std::string name;
  std::vector<int64_t> batch_sizes;  // one local batch size per rank; 0 allowed
  int64_t channels = 3;
  std::vector<int64_t> tail;  // per-channel dims: {} [N, C], {L}, {H, W}
  runtime::DType dtype = runtime::DType::f32;
  nn::BatchNormOptions options{};
  int steps = 2;  // running statistics over more than one update
  uint64_t seed = 1;
  runtime::Device device = runtime::Device::cpu();  // where SyncBatchNorm runs
};

inline double sync_bn_tolerance(runtime::DType dtype) {
  return dtype == runtime::DType::f64 ? 1e-10 : 1e-5;
}

namespace sync_bn_detail {

using runtime::Tensor;

inline std::vector<double> vals(const Tensor& t) { return t.detach().to_vector<double>(); }

inline void compare(std::vector<std::string>& errors, const std::string& what, const Tensor& got,
                    const Tensor& want, double tol) {
  // An empty rank's input gradient may be left undefined: nothing to compare.
  if (!got.defined() && want.defined() && want.numel() == 0) return;
  if (!got.defined() || !want.defined()) {
    if (got.defined() != want.defined())
      errors.push_back(fmt::format("{}: defined {} but expected {}", what, got.defined(),
                                   want.defined()));
    return;
  }
  if (got.shape() != want.shape()) {
    errors.push_back(fmt::format("{}: shape {} but expected {}", what,
                                 runtime::shape_str(got.shape()),
                                 runtime::shape_str(want.shape())));
    return;
  }
  const auto g = vals(got), w = vals(want);
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::abs(g[i] - w[i]) <= tol * std::max(1.0, std::abs(w[i]))) continue;
    errors.push_back(fmt::format("{}: element {} is {} but expected {} (tolerance {})", what, i,
                                 g[i], w[i], tol));
    return;
  }
}

inline std::shared_ptr<nn::BatchNormBase> reference(const SyncBnCase& c) {
  if (c.tail.size() <= 1) return std::make_shared<nn::BatchNorm1d>(c.channels, c.options);
  return std::make_shared<nn::BatchNorm2d>(c.channels, c.options);
}

// The same non-trivial weight and bias in both modules.
inline void init_affine(nn::BatchNormBase& a, nn::BatchNormBase& b, uint64_t seed) {
  if (!a.weight.defined()) return;
  runtime::Generator g(seed);
  runtime::NoGradGuard no_grad;
  Tensor w = runtime::add(runtime::mul(runtime::randn({a.num_features}, runtime::DType::f64, g),
                                       0.2),
                          1.0);
  Tensor bias = runtime::randn({a.num_features}, runtime::DType::f64, g);
  for (nn::BatchNormBase* m : {&a, &b}) {
    m->weight.copy_(w);
    m->bias.copy_(bias);
  }
}

}  // namespace sync_bn_detail

// Runs `c` on this rank of `group` (every rank must call it with the same
// case); returns the mismatches found, "rank R: case: what" each.
inline std::vector<std::string> check_sync_bn_rank(
    const std::shared_ptr<collectives::ProcessGroup>& group, const SyncBnCase& c) {
  using namespace sync_bn_detail;
  const int rank = group->rank(), world = group->size();
  std::vector<std::string> errors;
  if (static_cast<int>(c.batch_sizes.size()) != world) {
    errors.push_back(fmt::format("{}: {} batch sizes for {} ranks", c.name, c.batch_sizes.size(),
                                 world));
    return errors;
  }
  int64_t global_n = 0, offset = 0;
  for (int r = 0; r < world; ++r) {
    if (r < rank) offset += c.batch_sizes[r];
    global_n += c.batch_sizes[r];
  }
  const int64_t local_n = c.batch_sizes[rank];
  runtime::Shape shape{global_n, c.channels};
  shape.insert(shape.end(), c.tail.begin(), c.tail.end());

  auto ref = reference(c);
  auto sync = std::make_shared<nn::SyncBatchNorm>(c.channels, group, c.options);
  ref->to(c.dtype);
  sync->to(c.dtype);
  init_affine(*ref, *sync, c.seed + 100);
  sync->to(c.device);
  const runtime::Device cpu = runtime::Device::cpu();
  const double tol = sync_bn_tolerance(c.dtype);
  auto where = [&](int step, const std::string& what) {
    return fmt::format("rank {}: {}: step {}: {}", rank, c.name, step, what);
  };

  for (int step = 0; step < c.steps; ++step) {
    runtime::Generator g(c.seed + static_cast<uint64_t>(step));
    // Mean far from 0 and a spread of 3: the statistics are not trivial.
    const Tensor x_all =
        runtime::add(runtime::mul(runtime::randn(shape, c.dtype, g), 3.0), 5.0).detach();
    const Tensor gy_all = runtime::randn(shape, c.dtype, g).detach();

    Tensor xr = x_all.clone().detach();
    xr.requires_grad_();
    const Tensor out_ref = ref->forward(xr);
    runtime::sum(runtime::mul(out_ref, gy_all)).backward();

    Tensor xl =
        x_all.slice(0, offset, offset + local_n).contiguous().to(c.device).detach().clone();
    xl.requires_grad_();
    const Tensor gy = gy_all.slice(0, offset, offset + local_n).contiguous().to(c.device);
    const Tensor out = sync->forward(xl);
    runtime::sum(runtime::mul(out, gy)).backward();

    compare(errors, where(step, "output"), out,
            out_ref.detach().slice(0, offset, offset + local_n).contiguous(), tol);
    compare(errors, where(step, "input gradient"), xl.grad(),
            xr.grad().slice(0, offset, offset + local_n).contiguous(), tol);
    if (c.options.track_running_stats) {
      compare(errors, where(step, "running_mean"), sync->running_mean, ref->running_mean, tol);
      compare(errors, where(step, "running_var"), sync->running_var, ref->running_var, tol);
      if (sync->num_batches_tracked.item() != ref->num_batches_tracked.item())
        errors.push_back(where(step, "num_batches_tracked differs"));
      // Bitwise the same on every rank: gather them and compare with rank 0's.
      Tensor mine = runtime::cat({sync->running_mean.detach().to(cpu),
                                  sync->running_var.detach().to(cpu)})
                        .to(runtime::DType::f64)
                        .contiguous()
                        .to(c.device);
      Tensor all = Tensor::zeros({world * mine.numel()}, runtime::DType::f64, c.device);
      group->allgather(all, mine, {.timeout = {}})->wait();
      const auto v = all.to_vector<double>();
      const size_t k = static_cast<size_t>(mine.numel());
      if (!std::equal(v.begin(), v.begin() + k, v.begin() + k * rank))
        errors.push_back(where(step, "running statistics differ from rank 0's"));
    }
    if (sync->weight.defined()) {
      // Local parameter gradients sum, over ranks, to the global ones (an
      // empty rank may have none: count it as zero).
      for (auto [name, mine, want] : {std::tuple{"weight", sync->weight, ref->weight},
                                      std::tuple{"bias", sync->bias, ref->bias}}) {
        Tensor total = mine.grad().defined()
                           ? mine.grad().to(cpu).to(runtime::DType::f64).contiguous()
                           : Tensor::zeros({c.channels}, runtime::DType::f64);
        total = total.clone().to(c.device);
        group->allreduce(total, {.op = collectives::ReduceOp::Sum, .timeout = {}})->wait();
        compare(errors, where(step, fmt::format("{} gradient summed over ranks", name)), total,
                want.grad().to(runtime::DType::f64), tol);
      }
    }
    ref->zero_grad();
    sync->zero_grad();
  }
  return errors;
}

}  // namespace lockstep::testing
