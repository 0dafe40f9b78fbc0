#include "lockstep/runtime/cuda/ops/fused_optimizer.h"

#include "lockstep/runtime/cuda/device.h"
#include "lockstep/runtime/cuda/device_guard.h"
#include "lockstep/runtime/cuda/stream.h"

namespace lockstep::runtime::cuda {

namespace {

float* f32_ptr(const Tensor& t) { return t.defined() ? static_cast<float*>(t.raw_data()) : nullptr; }

// Fills tables of K pointers (param, grad, state...) and launches each once
// it is full, or at the end; a table never mixes devices.
template <int K, class Launch>
void for_each_table(const std::vector<FusedParam>& params, Launch launch) {
  kernels::TensorTable<K> table;
  int device = -1;
  int64_t total = 0;
  auto flush = [&] {
    if (table.count == 0) return;
    DeviceGuard guard(device);
    LOCKSTEP_CUDA_CHECK(launch(table, current_stream(device).handle));
    table = {};
    total = 0;
  };
  for (const FusedParam& p : params) {
    if (table.count == kernels::kMaxFusedTensors || (table.count > 0 && p.param.device().index != device))
      flush();
    device = p.param.device().index;
    const int i = table.count++;
    total += p.param.numel();
    table.end[i] = total;
    table.ptr[0][i] = f32_ptr(p.param);
    table.ptr[1][i] = f32_ptr(p.grad);
    for (int s = 0; s + 2 < K; ++s) table.ptr[s + 2][i] = f32_ptr(p.state[s]);
    table.coef[0][i] = p.coef[0];
    table.coef[1][i] = p.coef[1];
  }
  flush();
}

}  // namespace

void check_fusable(const char* optimizer, const char* what, const Tensor& t) {
  LOCKSTEP_CHECK(t.device().is_cuda() && t.dtype() == DType::f32 && t.is_contiguous(),
                 "{}: the CUDA update takes contiguous f32 tensors; the {} is {} on {}{} (keep "
                 "parameters in f32 on CUDA, e.g. with .to(DType::f32))",
                 optimizer, what, dtype_name(t.dtype()), t.device().str(),
                 t.is_contiguous() ? "" : " and not contiguous");
}

void fused_sgd_step(const std::vector<FusedParam>& params, const kernels::SgdCoefficients& c) {
  for_each_table<3>(params, [&](const kernels::TensorTable<3>& t, cudaStream_t s) {
    return kernels::sgd_step(t, c, s);
  });
}

void fused_adam_step(const std::vector<FusedParam>& params, const kernels::AdamCoefficients& c) {
  // Pointers: param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq.
  for_each_table<5>(params, [&](const kernels::TensorTable<5>& t, cudaStream_t s) {
    return kernels::adam_step(t, c, s);
  });
}

}  // namespace lockstep::runtime::cuda
