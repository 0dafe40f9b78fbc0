// The CPU's SyncBatchNorm passes, on norm_kernels.h; other devices' through
// their backend (device_backend.h).
#include "lockstep/runtime/ops/sync_batch_norm.h"

#include <cmath>
#include <vector>

#include "lockstep/runtime/device_backend.h"
#include "lockstep/runtime/ops/norm_kernels.h"
#include "lockstep/runtime/ops/running_stats.h"

namespace lockstep::runtime::sync_bn {
namespace {

using norm_kernels::ChannelShape;

ChannelShape shape_of(const Tensor& x) {
  int64_t inner = 1;
  for (int64_t d = 2; d < x.dim(); ++d) inner *= x.size(d);
  return {x.size(0), x.size(1), inner};
}

std::vector<double> values(const Tensor& t) { return t.detach().to_vector<double>(); }

// Combines per-rank (mean, biased var, count) into the global ones without
// cancellation: M2 = sum_r n_r * (var_r + (mean_r - mean)^2).
void combine_host(const std::vector<double>& gathered, int world, int64_t c,
                  std::vector<double>& mean, std::vector<double>& var, int64_t& count) {
  const size_t stride = static_cast<size_t>(2 * c + 1);
  double n = 0;
  for (int r = 0; r < world; ++r) n += gathered[r * stride + 2 * c];
  count = static_cast<int64_t>(n);
  mean.assign(c, 0.0);
  var.assign(c, 0.0);
  if (count == 0) return;
  for (int r = 0; r < world; ++r) {
    const double* g = gathered.data() + r * stride;
    const double w = g[2 * c] / n;
    for (int64_t i = 0; i < c; ++i) mean[i] += w * g[i];
  }
  for (int r = 0; r < world; ++r) {
    const double* g = gathered.data() + r * stride;
    const double w = g[2 * c] / n;
    for (int64_t i = 0; i < c; ++i) {
      const double d = g[i] - mean[i];
      var[i] += w * (g[c + i] + d * d);
    }
  }
}

}  // namespace

Tensor local_stats(const Tensor& x) {
  if (!x.device().is_cpu()) return device_backend(x.device()).sync_bn_local_stats(x);
  const ChannelShape s = shape_of(x);
  const int64_t c = s.c;
  std::vector<double> local(static_cast<size_t>(2 * c + 1));
  dispatch_float(x.dtype(), "SyncBatchNorm", [&](auto tag) {
    using T = decltype(tag);
    norm_kernels::channel_stats<T>(s, x.data_ptr<T>(), local.data(), local.data() + c);
  });
  local[2 * c] = static_cast<double>(s.count());
  return Tensor::from_vector(local, {2 * c + 1});
}

Combined combine(const Tensor& gathered, int world, DType dtype, const Tensor& weight,
                 const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                 double momentum, double eps) {
  if (!gathered.device().is_cpu())
    return device_backend(gathered.device())
        .sync_bn_combine(gathered, world, dtype, weight, bias, running_mean, running_var,
                         momentum, eps);
  const int64_t c = (gathered.numel() / world - 1) / 2;
  std::vector<double> mean, var;
  int64_t count = 0;
  combine_host(gathered.to_vector<double>(), world, c, mean, var, count);
  std::vector<double> stats(mean);
  for (int64_t i = 0; i < c; ++i) stats.push_back(1.0 / std::sqrt(var[i] + eps));
  stats.push_back(static_cast<double>(count));
  const double* invstd = stats.data() + c;

  if (running_mean.defined() && count > 1)
    update_running_stats(running_mean, running_var, mean.data(), var.data(), count, momentum);

  const std::vector<double> w = weight.defined() ? values(weight) : std::vector<double>(c, 1.0);
  const std::vector<double> b = bias.defined() ? values(bias) : std::vector<double>(c, 0.0);
  Combined out{Tensor::from_vector(stats, {2 * c + 1}), Tensor::empty({c}, dtype),
               Tensor::empty({c}, dtype)};
  dispatch_float(dtype, "SyncBatchNorm", [&](auto tag) {
    using T = decltype(tag);
    T* scale = out.scale.data_ptr<T>();
    T* shift = out.shift.data_ptr<T>();
    for (int64_t i = 0; i < c; ++i) {
      scale[i] = static_cast<T>(w[i] * invstd[i]);
      shift[i] = norm_kernels::affine_shift<T>(b[i], mean[i], scale[i]);
    }
  });
  return out;
}

Tensor affine(const Tensor& x, const Tensor& scale, const Tensor& shift) {
  if (!x.device().is_cpu()) return device_backend(x.device()).sync_bn_affine(x, scale, shift);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), "SyncBatchNorm", [&](auto tag) {
    using T = decltype(tag);
    norm_kernels::channel_affine<T>(shape_of(x), x.data_ptr<T>(), scale.data_ptr<T>(),
                                    shift.data_ptr<T>(), out.data_ptr<T>());
  });
  return out;
}

GradSums grad_sums(const Tensor& gy, const Tensor& x, const Tensor& stats, bool need_weight,
                   bool need_bias) {
  if (!x.device().is_cpu())
    return device_backend(x.device()).sync_bn_grad_sums(gy, x, stats, need_weight, need_bias);
  const ChannelShape s = shape_of(x);
  const int64_t c = s.c;
  const std::vector<double> st = stats.to_vector<double>();  // [mean | invstd | count]
  // Local sums around the global mean: the weight and bias gradients as they
  // are, and (summed over ranks) the input gradient's terms.
  std::vector<double> sums(static_cast<size_t>(2 * c));
  dispatch_float(gy.dtype(), "SyncBatchNorm backward", [&](auto tag) {
    using T = decltype(tag);
    norm_kernels::channel_grad_sums<T>(s, gy.data_ptr<T>(), x.data_ptr<T>(), st.data(),
                                       sums.data(), sums.data() + c);
  });
  GradSums g;
  if (need_weight) {
    std::vector<double> gw(c);
    for (int64_t i = 0; i < c; ++i) gw[i] = sums[c + i] * st[c + i];
    g.grad_weight = Tensor::from_vector(gw, {c}).to(gy.dtype());
  }
  if (need_bias) {
    g.grad_bias = Tensor::from_vector(std::vector<double>(sums.begin(), sums.begin() + c), {c})
                      .to(gy.dtype());
  }
  g.sums = Tensor::from_vector(sums, {2 * c});
  return g;
}

Tensor grad_input(const Tensor& gy, const Tensor& x, const Tensor& total, const Tensor& stats,
                  const Tensor& weight) {
  if (!x.device().is_cpu())
    return device_backend(x.device()).sync_bn_grad_input(gy, x, total, stats, weight);
  const ChannelShape s = shape_of(x);
  const int64_t c = s.c;
  const std::vector<double> st = stats.to_vector<double>();  // [mean | invstd | count]
  const std::vector<double> g = total.to_vector<double>();
  const std::vector<double> w =
      weight.defined() ? weight.to_vector<double>() : std::vector<double>(c, 1.0);
  // gx = w*invstd * (gy - sum_gy/m - (x - mean) * invstd^2 * sum_gy_xc/m)
  // over the global count m, folded into gx = gy * ka + x * kb + kc.
  const double m = st[2 * c];
  Tensor gx = Tensor::empty(x.shape(), x.dtype());
  dispatch_float(gy.dtype(), "SyncBatchNorm backward", [&](auto tag) {
    using T = decltype(tag);
    std::vector<T> ka(c), kb(c), kc(c);
    for (int64_t i = 0; i < c; ++i) {
      const double is = st[c + i], k1 = w[i] * is;
      const double kbi = -k1 * is * is * g[c + i] / m;
      ka[i] = static_cast<T>(k1);
      kb[i] = static_cast<T>(kbi);
      kc[i] = static_cast<T>(-k1 * g[i] / m - kbi * st[i]);
    }
    norm_kernels::channel_grad_input<T>(s, gy.data_ptr<T>(), x.data_ptr<T>(), ka.data(),
                                        kb.data(), kc.data(), gx.data_ptr<T>());
  });
  return gx;
}

}  // namespace lockstep::runtime::sync_bn
