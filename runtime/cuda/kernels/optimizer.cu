// Fused optimizer kernels. Threads stride over the elements of all tensors of
// the launch as one range; a binary search in the table finds the tensor of
// an element (starting from the previous one: a thread's elements only move
// forward). Each line of arithmetic follows the CPU update (optim/sgd.cpp,
// optim/adam.cpp), i.e. PyTorch's op order; the device may fuse a multiply
// and an add into one FMA, so results can differ from the CPU in the last bit.
#include "lockstep/runtime/cuda/kernels/optimizer.h"

#include "lockstep/runtime/cuda/kernels/device_types.cuh"

namespace lockstep::runtime::cuda::kernels {

namespace {

// The first tensor at or after `lo` whose end is > i.
template <class Entry>
__device__ __forceinline__ int tensor_of(const Entry* t, int lo, int count, int64_t i) {
  int hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (t[mid].end > i) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

__global__ void sgd_kernel(const SgdTensor* __restrict__ table, int count, int64_t total) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int k = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
    k = tensor_of(table, k, count, i);
    const SgdTensor& e = table[k];
    const int64_t j = i - (k == 0 ? 0 : table[k - 1].end);
    float* p = e.param;
    float d = (e.flags & kMaximize) ? -e.grad[j] : e.grad[j];
    if (e.flags & kWeightDecay) d = d + e.weight_decay * p[j];
    if (e.flags & kMomentum) {
      float* buf = e.momentum_buffer;
      const float b = (e.flags & kFirstStep) ? d : buf[j] * e.momentum + e.one_minus_dampening * d;
      buf[j] = b;
      d = (e.flags & kNesterov) ? d + e.momentum * b : b;
    }
    p[j] = p[j] + e.neg_lr * d;
  }
}

__global__ void adam_kernel(const AdamTensor* __restrict__ table, int count, int64_t total) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int k = 0;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += stride) {
    k = tensor_of(table, k, count, i);
    const AdamTensor& e = table[k];
    const int64_t j = i - (k == 0 ? 0 : table[k - 1].end);
    float g = (e.flags & kMaximize) ? -e.grad[j] : e.grad[j];
    float param = e.param[j];
    if (e.flags & kDecoupled) param = param * e.decay;
    if (e.flags & kL2) g = g + e.weight_decay * param;
    const float mj = e.exp_avg[j] * e.beta1 + e.one_minus_beta1 * g;
    const float vj = e.exp_avg_sq[j] * e.beta2 + e.one_minus_beta2 * g * g;
    e.exp_avg[j] = mj;
    e.exp_avg_sq[j] = vj;
    float second = vj;
    if (e.flags & kAmsgrad) {
      float* vmax = e.max_exp_avg_sq;
      // torch.maximum: NaN when either is.
      const float old = vmax[j];
      second = old < vj || vj != vj ? vj : old;
      vmax[j] = second;
    }
    const float denom = sqrtf(second) / e.bias_correction2_sqrt + e.eps;
    e.param[j] = param + e.neg_step_size * mj / denom;
  }
}

}  // namespace

cudaError_t sgd_step(const SgdTensor* table, int count, int64_t total, cudaStream_t stream) {
  if (count == 0 || total == 0) return cudaSuccess;
  sgd_kernel<<<grid_for(total), kBlock, 0, stream>>>(table, count, total);
  return cudaGetLastError();
}

cudaError_t adam_step(const AdamTensor* table, int count, int64_t total, cudaStream_t stream) {
  if (count == 0 || total == 0) return cudaSuccess;
  adam_kernel<<<grid_for(total), kBlock, 0, stream>>>(table, count, total);
  return cudaGetLastError();
}

}  // namespace lockstep::runtime::cuda::kernels
