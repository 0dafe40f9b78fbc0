// Fused optimizer kernels. Threads stride over the elements of all tensors of
// the launch as one range; a binary search in the table finds the tensor of
// an element. Each line of arithmetic follows the CPU update (optim/sgd.cpp,
// optim/adam.cpp), i.e. PyTorch's op order; the device may fuse a multiply
// and an add into one FMA, so results can differ from the CPU in the last bit.
#include "lockstep/runtime/cuda/kernels/optimizer.h"

#include "lockstep/runtime/cuda/kernels/device_types.cuh"

namespace lockstep::runtime::cuda::kernels {

namespace {

template <int K>
__device__ __forceinline__ int tensor_of(const TensorTable<K>& t, int64_t i) {
  int lo = 0, hi = t.count - 1;  // the first tensor whose end is > i
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (t.end[mid] > i) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

__global__ void sgd_kernel(const TensorTable<3> t, const SgdCoefficients c) {
  const int64_t total = t.end[t.count - 1];
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int k = tensor_of(t, i);
    const int64_t j = i - (k == 0 ? 0 : t.end[k - 1]);
    float* p = t.ptr[0][k];
    const float* grad = t.ptr[1][k];
    float d = c.maximize ? -grad[j] : grad[j];
    if (c.has_weight_decay) d = d + c.weight_decay * p[j];
    if (c.has_momentum) {
      float* buf = t.ptr[2][k];
      const float b = t.coef[0][k] != 0.0f ? d : buf[j] * c.momentum + c.one_minus_dampening * d;
      buf[j] = b;
      d = c.nesterov ? d + c.momentum * b : b;
    }
    p[j] = p[j] + c.neg_lr * d;
  }
}

__global__ void adam_kernel(const TensorTable<5> t, const AdamCoefficients c) {
  const int64_t total = t.end[t.count - 1];
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int k = tensor_of(t, i);
    const int64_t j = i - (k == 0 ? 0 : t.end[k - 1]);
    float* p = t.ptr[0][k];
    float* m = t.ptr[2][k];
    float* v = t.ptr[3][k];
    float g = c.maximize ? -t.ptr[1][k][j] : t.ptr[1][k][j];
    float param = p[j];
    if (c.decoupled) param = param * c.decay;
    if (c.l2) g = g + c.weight_decay * param;
    const float mj = m[j] * c.beta1 + c.one_minus_beta1 * g;
    const float vj = v[j] * c.beta2 + c.one_minus_beta2 * g * g;
    m[j] = mj;
    v[j] = vj;
    float second = vj;
    if (c.amsgrad) {
      float* vmax = t.ptr[4][k];
      second = vmax[j] < vj ? vj : vmax[j];
      vmax[j] = second;
    }
    const float denom = sqrtf(second) / t.coef[1][k] + c.eps;
    p[j] = param + t.coef[0][k] * mj / denom;
  }
}

}  // namespace

cudaError_t sgd_step(const TensorTable<3>& table, const SgdCoefficients& c, cudaStream_t stream) {
  if (table.count == 0 || table.end[table.count - 1] == 0) return cudaSuccess;
  sgd_kernel<<<grid_for(table.end[table.count - 1]), kBlock, 0, stream>>>(table, c);
  return cudaGetLastError();
}

cudaError_t adam_step(const TensorTable<5>& table, const AdamCoefficients& c, cudaStream_t stream) {
  if (table.count == 0 || table.end[table.count - 1] == 0) return cudaSuccess;
  adam_kernel<<<grid_for(table.end[table.count - 1]), kBlock, 0, stream>>>(table, c);
  return cudaGetLastError();
}

}  // namespace lockstep::runtime::cuda::kernels
