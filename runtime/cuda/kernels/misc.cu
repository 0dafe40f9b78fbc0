// Dropout and embedding kernels (see misc.h).
#include "lockstep/runtime/cuda/kernels/misc.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "lockstep/runtime/cuda/kernels/block_reduce.cuh"
#include "lockstep/runtime/cuda/kernels/device_types.cuh"

namespace lockstep::runtime::cuda::kernels {
namespace {

// Philox4x32-10 block `counter` under key `seed`: the same rounds, constants
// and word order as the CPU generator (runtime/random.cpp), so draw p of the
// stream is word p % 4 of block p / 4 on both devices.
__device__ __forceinline__ void philox(uint64_t counter, uint64_t seed, uint32_t (&out)[4]) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = __umulhi(kM1, c2), lo1 = kM1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

// A thread per Philox block: stream positions [4b, 4b + 4) that fall in
// [offset, offset + n) are elements p - offset.
template <class T>
__global__ void dropout_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                       uint8_t* __restrict__ mask, int64_t n, uint64_t seed,
                                       uint64_t offset, uint64_t threshold, double scale) {
  using C = compute_t<T>;
  const C s = static_cast<C>(scale);
  const uint64_t first = offset / 4, last = (offset + static_cast<uint64_t>(n) + 3) / 4;
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t b = first + static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       b < last; b += step) {
    uint32_t draws[4];
    philox(b, seed, draws);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint64_t p = 4 * b + w;
      if (p < offset || p >= offset + static_cast<uint64_t>(n)) continue;
      const int64_t i = static_cast<int64_t>(p - offset);
      const bool keep = draws[w] < threshold;
      mask[i] = keep;
      y[i] = convert<T>(convert<C>(x[i]) * (keep ? s : C(0)));  // as the CPU: x * (s or 0)
    }
  }
}

template <class T>
__global__ void dropout_backward_kernel(const T* __restrict__ grad_y,
                                        const uint8_t* __restrict__ mask, T* __restrict__ grad_x,
                                        int64_t n, double scale) {
  using C = compute_t<T>;
  const C s = static_cast<C>(scale);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    grad_x[i] = convert<T>(convert<C>(grad_y[i]) * (mask[i] ? s : C(0)));
}

template <class U>
__device__ __forceinline__ U all_ones() {
  if constexpr (sizeof(U) == 16) {
    return make_uint4(~0u, ~0u, ~0u, ~0u);
  } else {
    return static_cast<U>(~U(0));
  }
}

// Rows copied in units U (16, 8, 4, 2 or 1 bytes): units per row = `units`.
template <class I, class U>
__global__ void embedding_forward_kernel(const I* __restrict__ indices, int64_t n,
                                         const U* __restrict__ weight, int64_t rows,
                                         int64_t units, U* __restrict__ out) {
  const int64_t total = n * units;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += step) {
    const int64_t i = e / units, k = e - i * units;
    const int64_t r = static_cast<int64_t>(indices[i]);
    out[e] = r >= 0 && r < rows ? weight[r * units + k] : all_ones<U>();
  }
}

template <class T, class I>
__global__ void embedding_backward_kernel(const T* __restrict__ grad,
                                          const I* __restrict__ indices, int64_t n, int64_t rows,
                                          int64_t dim, int64_t padding_idx,
                                          compute_t<T>* __restrict__ grad_weight) {
  const int64_t total = n * dim;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += step) {
    const int64_t i = e / dim, j = e - i * dim;
    const int64_t r = static_cast<int64_t>(indices[i]);
    if (r >= 0 && r < rows && r != padding_idx)
      atomicAdd(grad_weight + r * dim + j, convert<compute_t<T>>(grad[e]));
  }
}

template <class Fn>
cudaError_t dispatch_index(ScalarType t, Fn&& fn) {
  if (t == ScalarType::i64) return fn(int64_t{});
  if (t == ScalarType::i32) return fn(int32_t{});
  return cudaErrorInvalidValue;
}

template <class I, class U>
cudaError_t launch_embedding(const void* indices, int64_t n, const void* weight, int64_t rows,
                             size_t row_bytes, void* out, cudaStream_t stream) {
  const int64_t units = static_cast<int64_t>(row_bytes / sizeof(U));
  embedding_forward_kernel<I, U><<<grid_for(n * units), kBlock, 0, stream>>>(
      static_cast<const I*>(indices), n, static_cast<const U*>(weight), rows, units,
      static_cast<U*>(out));
  return cudaGetLastError();
}

}  // namespace

cudaError_t dropout_forward(ScalarType dtype, const void* x, void* y, uint8_t* mask, int64_t n,
                            uint64_t seed, uint64_t offset, uint64_t threshold, double scale,
                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = static_cast<int64_t>((offset + n + 3) / 4 - offset / 4);
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    dropout_forward_kernel<T><<<grid_for(blocks), kBlock, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), mask, n, seed, offset, threshold, scale);
    return cudaGetLastError();
  });
}

cudaError_t dropout_backward(ScalarType dtype, const void* grad_y, const uint8_t* mask,
                             void* grad_x, int64_t n, double scale, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return dispatch_float_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    dropout_backward_kernel<T><<<grid_for(n), kBlock, 0, stream>>>(
        static_cast<const T*>(grad_y), mask, static_cast<T*>(grad_x), n, scale);
    return cudaGetLastError();
  });
}

cudaError_t embedding_forward(const void* indices, ScalarType index_dtype, int64_t n,
                              const void* weight, int64_t rows, size_t row_bytes, void* out,
                              cudaStream_t stream) {
  if (n == 0 || row_bytes == 0) return cudaSuccess;
  return dispatch_index(index_dtype, [&](auto tag) {
    using I = decltype(tag);
    // The widest unit that divides a row and keeps every access aligned.
    const auto fits = [&](size_t unit) {
      return row_bytes % unit == 0 && reinterpret_cast<uintptr_t>(weight) % unit == 0 &&
             reinterpret_cast<uintptr_t>(out) % unit == 0;
    };
    const auto run = [&](auto unit) {
      return launch_embedding<I, decltype(unit)>(indices, n, weight, rows, row_bytes, out, stream);
    };
    if (fits(16)) return run(uint4{});
    if (fits(8)) return run(uint64_t{});
    if (fits(4)) return run(uint32_t{});
    if (fits(2)) return run(uint16_t{});
    return run(uint8_t{});
  });
}

cudaError_t embedding_backward(ScalarType grad_dtype, const void* grad, const void* indices,
                               ScalarType index_dtype, int64_t n, int64_t rows, int64_t dim,
                               int64_t padding_idx, void* grad_weight, cudaStream_t stream) {
  if (n == 0 || dim == 0) return cudaSuccess;
  return dispatch_float_type(grad_dtype, [&](auto tag) {
    using T = decltype(tag);
    return dispatch_index(index_dtype, [&](auto itag) {
      using I = decltype(itag);
      embedding_backward_kernel<T, I><<<grid_for(n * dim), kBlock, 0, stream>>>(
          static_cast<const T*>(grad), static_cast<const I*>(indices), n, rows, dim,
          padding_idx, static_cast<compute_t<T>*>(grad_weight));
      return cudaGetLastError();
    });
  });
}

}  // namespace lockstep::runtime::cuda::kernels
