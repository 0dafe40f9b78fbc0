// Helpers of the reduction-shaped kernels (reduce, softmax_loss, pool, misc):
// warp and block reductions in a fixed combining order, so a result depends
// only on the launch shape, never on timing; 16-byte vector accesses; a
// dispatch over the floating dtypes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "lockstep/runtime/cuda/kernels/kernel_types.h"

namespace lockstep::runtime::cuda::kernels {

// Shuffles any 4-byte-multiple trivially copyable value (a float, or a struct
// of partial results) word by word.
template <class T>
__device__ __forceinline__ T shuffle_down(const T& v, int delta) {
  static_assert(sizeof(T) % 4 == 0, "shuffle_down: size must be a multiple of 4 bytes");
  constexpr int kWords = sizeof(T) / 4;
  uint32_t w[kWords];
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_down_sync(0xffffffffu, w[i], delta);
  T r;
  memcpy(&r, w, sizeof(T));
  return r;
}

template <class T>
__device__ __forceinline__ T shuffle_from(const T& v, int lane) {
  static_assert(sizeof(T) % 4 == 0, "shuffle_from: size must be a multiple of 4 bytes");
  constexpr int kWords = sizeof(T) / 4;
  uint32_t w[kWords];
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_sync(0xffffffffu, w[i], lane);
  T r;
  memcpy(&r, w, sizeof(T));
  return r;
}

// Tree over the 32 lanes of a warp (all must call); the result is in lane 0.
template <class T, class F>
__device__ __forceinline__ T warp_reduce(T v, F combine) {
#pragma unroll
  for (int delta = 16; delta > 0; delta >>= 1) v = combine(v, shuffle_down(v, delta));
  return v;
}

// Every lane gets lane 0's result.
template <class T, class F>
__device__ __forceinline__ T warp_allreduce(T v, F combine) {
  return shuffle_from(warp_reduce(v, combine), 0);
}

// Every thread of the block (a multiple of 32 threads, at most 1024, all
// calling) gets the reduction of all threads' values. `smem` holds 33
// values; calling again right away is safe (the first barrier waits for the
// readers of the previous result).
template <class T, class F>
__device__ __forceinline__ T block_allreduce(T v, F combine, T identity, T* smem) {
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int warps = static_cast<int>(blockDim.x * blockDim.y) >> 5;
  v = warp_reduce(v, combine);
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? smem[lane] : identity;
    v = warp_reduce(v, combine);
    if (lane == 0) smem[32] = v;
  }
  __syncthreads();
  return smem[32];
}

// N elements loaded or stored as one 16-byte access.
template <class T, int N>
struct alignas(sizeof(T) * N) AlignedVec {
  T v[N];
};

// Elements per 16-byte access for 2-, 4- and 8-byte types, 1 for others.
template <class T>
inline constexpr int vec16_v =
    (sizeof(T) == 2 || sizeof(T) == 4 || sizeof(T) == 8) ? 16 / static_cast<int>(sizeof(T)) : 1;

// Pack k (elements [k*N, k*N + N)) of p, which is 16-byte aligned when N > 1.
template <int N, class T>
__device__ __forceinline__ AlignedVec<T, N> load_vec(const T* p, int64_t k) {
  return reinterpret_cast<const AlignedVec<T, N>*>(p)[k];
}

template <int N, class T>
__device__ __forceinline__ void store_vec(T* p, int64_t k, const AlignedVec<T, N>& v) {
  reinterpret_cast<AlignedVec<T, N>*>(p)[k] = v;
}

// Calls fn(T{}) for the floating ScalarTypes; cudaErrorInvalidValue for others.
template <class Fn>
cudaError_t dispatch_float_type(ScalarType t, Fn&& fn) {
  switch (t) {
    case ScalarType::f32: return fn(float{});
    case ScalarType::f64: return fn(double{});
    case ScalarType::bf16: return fn(__nv_bfloat16{});
    case ScalarType::f16: return fn(__half{});
    default: return cudaErrorInvalidValue;
  }
}

// Whether every pointer is 16-byte aligned (for AlignedVec accesses).
inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

}  // namespace lockstep::runtime::cuda::kernels
