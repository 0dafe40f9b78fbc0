// Sum and max/argmax over a set of dimensions (see reduce.h for the plan).
//
// An op (SumOp, MaxOp) says how to start (identity), take in an element
// (load), merge two partial results (combine, commutative and associative,
// so the tree order changes only float rounding) and write a result. Three
// kernels run any op: reduce_rows (a warp or a block per output, reading the
// reduced elements of that output, vectorised when they are contiguous),
// reduce_columns (a thread per output and rows of the block splitting the
// reduced range, for reductions over outer dimensions such as a bias
// gradient), and reduce_partials, which combines the per-split partials when
// the reduced range was cut across blocks. All combining orders are fixed, so
// results are deterministic.
#include "lockstep/runtime/cuda/kernels/reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "lockstep/runtime/cuda/kernels/block_reduce.cuh"
#include "lockstep/runtime/cuda/kernels/device_types.cuh"

namespace lockstep::runtime::cuda::kernels {
namespace {

constexpr int64_t kMaxGridX = int64_t{1} << 20;
constexpr int64_t kMaxSplits = 65535;  // gridDim.y

// Element offset of linear index i over `ndim` merged dimensions.
__device__ __forceinline__ int64_t offset_of(int64_t i, int ndim, const int64_t* sizes,
                                             const int64_t* strides) {
  if (ndim == 1) return i * strides[0];
  int64_t off = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    const int64_t q = i / sizes[d];
    off += (i - q * sizes[d]) * strides[d];
    i = q;
  }
  return off;
}

// out[m] = v converted to the output dtype.
template <class V>
__device__ __forceinline__ void store_as(void* out, ScalarType t, int64_t m, V v) {
  switch (t) {
    case ScalarType::f32: static_cast<float*>(out)[m] = convert<float>(v); break;
    case ScalarType::f64: static_cast<double*>(out)[m] = convert<double>(v); break;
    case ScalarType::bf16: static_cast<__nv_bfloat16*>(out)[m] = convert<__nv_bfloat16>(v); break;
    case ScalarType::f16: static_cast<__half*>(out)[m] = convert<__half>(v); break;
    case ScalarType::i32: static_cast<int32_t*>(out)[m] = convert<int32_t>(v); break;
    case ScalarType::i64: static_cast<int64_t*>(out)[m] = convert<int64_t>(v); break;
    case ScalarType::u8: static_cast<uint8_t*>(out)[m] = convert<uint8_t>(v); break;
    case ScalarType::boolean: static_cast<bool*>(out)[m] = convert<bool>(v); break;
  }
}

template <class In, class Acc>
struct SumOp {
  using acc_t = Acc;
  Acc scale;
  __device__ Acc identity() const { return Acc(0); }
  __device__ Acc load(In v, int64_t) const { return convert<Acc>(v); }
  __device__ Acc combine(Acc a, Acc b) const { return a + b; }
  __device__ void write(const ReduceArgs& a, int64_t m, Acc v) const {
    store_as(a.out, a.out_dtype, m, v * scale);
  }
};

template <class C>
struct ArgMax {
  C v;
  int64_t i;  // -1: no element seen yet
};

template <class In>
struct MaxOp {
  using C = compute_t<In>;
  using acc_t = ArgMax<C>;
  __device__ acc_t identity() const { return {C(0), -1}; }
  __device__ acc_t load(In v, int64_t r) const { return {convert<C>(v), r}; }
  // NaN beats everything; among equals (or NaNs) the smaller index wins. This
  // is the CPU's sequential rule "later elements win only when greater, or
  // when NaN and the best so far is not", made order-free.
  __device__ acc_t combine(acc_t a, acc_t b) const {
    if (a.i < 0) return b;
    if (b.i < 0) return a;
    const bool a_nan = a.v != a.v, b_nan = b.v != b.v;
    if (a_nan != b_nan) return a_nan ? a : b;
    if (!a_nan) {
      if (a.v > b.v) return a;
      if (b.v > a.v) return b;
    }
    return a.i < b.i ? a : b;
  }
  __device__ void write(const ReduceArgs& a, int64_t m, acc_t v) const {
    if (a.out != nullptr) store_as(a.out, a.out_dtype, m, v.v);
    if (a.out_index != nullptr) a.out_index[m] = v.i;
  }
};

// One output's part [begin, end) of the reduced range, thread t of nt.
template <int Vec, class Op, class In>
__device__ __forceinline__ typename Op::acc_t thread_reduce(const ReduceArgs& a, const Op& op,
                                                             const In* base, int64_t begin,
                                                             int64_t end, int t, int nt) {
  typename Op::acc_t acc = op.identity();
  if constexpr (Vec > 1) {
    // Contiguous, 16-byte aligned, begin and end multiples of Vec (the plan).
    for (int64_t k = begin / Vec + t; k < end / Vec; k += nt) {
      const AlignedVec<In, Vec> x = load_vec<Vec>(base, k);
#pragma unroll
      for (int q = 0; q < Vec; ++q) acc = op.combine(acc, op.load(x.v[q], k * Vec + q));
    }
  } else if (a.reduce_ndim <= 1) {
    const int64_t stride = a.reduce_ndim == 1 ? a.reduce_strides[0] : 0;
    for (int64_t r = begin + t; r < end; r += nt)
      acc = op.combine(acc, op.load(base[r * stride], r));
  } else {
    for (int64_t r = begin + t; r < end; r += nt) {
      const int64_t off = offset_of(r, a.reduce_ndim, a.reduce_sizes, a.reduce_strides);
      acc = op.combine(acc, op.load(base[off], r));
    }
  }
  return acc;
}

template <class Op>
__device__ __forceinline__ void emit(const ReduceArgs& a, const Op& op, int64_t m,
                                     const typename Op::acc_t& acc,
                                     typename Op::acc_t* partial) {
  if (partial != nullptr)
    partial[static_cast<int64_t>(blockIdx.y) * a.num_outputs + m] = acc;
  else
    op.write(a, m, acc);
}

// blockDim (32, warps). Split blockIdx.y covers [y * chunk, (y + 1) * chunk).
template <class Op, class In, int Vec>
__global__ void __launch_bounds__(256)
    reduce_rows(const __grid_constant__ ReduceArgs a, const Op op, int64_t chunk,
                bool block_per_output, typename Op::acc_t* partial) {
  using Acc = typename Op::acc_t;
  __shared__ Acc smem[33];
  const auto combine = [&op](const Acc& x, const Acc& y) { return op.combine(x, y); };
  const In* in = static_cast<const In*>(a.in);
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t end = min(a.reduce_size, begin + chunk);
  if (block_per_output) {
    const int t = threadIdx.x + threadIdx.y * 32, nt = blockDim.y * 32;
    for (int64_t m = blockIdx.x; m < a.num_outputs; m += gridDim.x) {  // uniform per block
      const In* base = in + offset_of(m, a.kept_ndim, a.kept_sizes, a.kept_strides);
      Acc acc = thread_reduce<Vec>(a, op, base, begin, end, t, nt);
      acc = block_allreduce(acc, combine, op.identity(), smem);
      if (t == 0) emit(a, op, m, acc, partial);
    }
  } else {
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
    for (int64_t m = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
         m < a.num_outputs; m += step) {  // uniform per warp
      const In* base = in + offset_of(m, a.kept_ndim, a.kept_sizes, a.kept_strides);
      Acc acc = thread_reduce<Vec>(a, op, base, begin, end, threadIdx.x, 32);
      acc = warp_reduce(acc, combine);
      if (threadIdx.x == 0) emit(a, op, m, acc, partial);
    }
  }
}

// blockDim (bx, by), bx * by <= 256, by a power of two: thread x owns output
// blockIdx.x * bx + x; the by rows of the block stride over the reduced range
// and are then combined by a tree through shared memory.
template <class Op, class In>
__global__ void __launch_bounds__(256)
    reduce_columns(const __grid_constant__ ReduceArgs a, const Op op, int64_t chunk,
                   typename Op::acc_t* partial) {
  using Acc = typename Op::acc_t;
  __shared__ Acc smem[256];
  const In* in = static_cast<const In*>(a.in);
  const int tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * chunk;
  const int64_t end = min(a.reduce_size, begin + chunk);
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * bx; first < a.num_outputs;
       first += static_cast<int64_t>(gridDim.x) * bx) {  // uniform per block
    const int64_t m = first + tx;
    Acc acc = op.identity();
    if (m < a.num_outputs) {
      const In* base = in + offset_of(m, a.kept_ndim, a.kept_sizes, a.kept_strides);
      acc = thread_reduce<1>(a, op, base, begin, end, ty, by);
    }
    if (by > 1) {
      smem[ty * bx + tx] = acc;
      __syncthreads();
      for (int s = by / 2; s > 0; s >>= 1) {
        if (ty < s) smem[ty * bx + tx] = op.combine(smem[ty * bx + tx], smem[(ty + s) * bx + tx]);
        __syncthreads();
      }
      acc = smem[tx];
      __syncthreads();  // smem is rewritten by the next iteration
    }
    if (ty == 0 && m < a.num_outputs) emit(a, op, m, acc, partial);
  }
}

// A warp per output combines its `splits` partials; blockDim (32, 8).
template <class Op>
__global__ void __launch_bounds__(256)
    reduce_partials(const __grid_constant__ ReduceArgs a, const Op op,
                    const typename Op::acc_t* partial, int64_t splits) {
  using Acc = typename Op::acc_t;
  const auto combine = [&op](const Acc& x, const Acc& y) { return op.combine(x, y); };
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t m = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
       m < a.num_outputs; m += step) {
    Acc acc = op.identity();
    for (int64_t s = threadIdx.x; s < splits; s += 32)
      acc = op.combine(acc, partial[s * a.num_outputs + m]);
    acc = warp_reduce(acc, combine);
    if (threadIdx.x == 0) op.write(a, m, acc);
  }
}

template <class Op, class In>
cudaError_t launch(const ReduceArgs& a, const Op& op, const ReducePlan& p, void* workspace,
                   cudaStream_t stream) {
  using Acc = typename Op::acc_t;
  Acc* partial = p.splits > 1 ? static_cast<Acc*>(workspace) : nullptr;
  const dim3 grid(static_cast<unsigned>(p.grid_x), static_cast<unsigned>(p.splits));
  const dim3 block(p.block_x, p.block_y);
  if (p.columns) {
    reduce_columns<Op, In><<<grid, block, 0, stream>>>(a, op, p.chunk, partial);
  } else if (p.vec > 1) {
    constexpr int kVec = vec16_v<In>;
    if constexpr (kVec > 1) {
      if (p.vec != kVec) return cudaErrorInvalidValue;
      reduce_rows<Op, In, kVec><<<grid, block, 0, stream>>>(a, op, p.chunk, p.block_per_output,
                                                             partial);
    } else {
      return cudaErrorInvalidValue;
    }
  } else {
    reduce_rows<Op, In, 1><<<grid, block, 0, stream>>>(a, op, p.chunk, p.block_per_output,
                                                       partial);
  }
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (partial != nullptr) {
    const int64_t blocks = std::min((a.num_outputs + 7) / 8, kMaxGridX);
    reduce_partials<Op><<<static_cast<unsigned>(blocks), dim3(32, 8), 0, stream>>>(a, op, partial,
                                                                                 p.splits);
  }
  return cudaGetLastError();
}

size_t acc_bytes(ReduceOp op, ScalarType t) {
  if (op == ReduceOp::max) return 16;  // ArgMax<C>: value and an i64 index
  return t == ScalarType::f32 || t == ScalarType::bf16 || t == ScalarType::f16 ? 4 : 8;
}

bool is_float(ScalarType t) {
  return t == ScalarType::f32 || t == ScalarType::f64 || t == ScalarType::bf16 ||
         t == ScalarType::f16;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Cached per device: plans are made on every reduction, on the host's hot path.
int sm_count(int device) {
  static std::array<std::atomic<int>, 64> cache{};
  const bool cached = device >= 0 && device < static_cast<int>(cache.size());
  if (cached) {
    if (const int sms = cache[device].load(std::memory_order_relaxed); sms > 0) return sms;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      sms <= 0) {
    (void)cudaGetLastError();  // not fatal: only the grid size depends on it
    return 108;
  }
  if (cached) cache[device].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace

ReducePlan plan_reduce(ReduceOp op, const ReduceArgs& a, int device) {
  ReducePlan p;
  const int64_t m = a.num_outputs, k = a.reduce_size;
  if (m <= 0) return p;
  const int64_t target_blocks = 4 * static_cast<int64_t>(sm_count(device));
  const bool rows_contiguous = a.reduce_ndim >= 1 && a.reduce_strides[a.reduce_ndim - 1] == 1;
  const bool columns_contiguous = a.kept_ndim >= 1 && a.kept_strides[a.kept_ndim - 1] == 1;
  // Short rows read by a warp would leave most lanes idle: a thread per
  // output reads them instead.
  p.columns = !(rows_contiguous && k >= 16) && (columns_contiguous || k < 16);
  if (p.columns) {
    p.block_y = k >= 64 ? 8 : (k >= 8 ? 4 : 1);
    p.block_x = p.block_y == 8 ? 32 : 256 / p.block_y;  // 32x8, 64x4 or 256x1
    const int64_t blocks_x = ceil_div(m, p.block_x);
    const int64_t min_chunk = 32 * static_cast<int64_t>(p.block_y);  // >= 32 rows per thread
    if (blocks_x < target_blocks && k >= 2 * min_chunk)
      p.splits = std::min({ceil_div(target_blocks, blocks_x), ceil_div(k, min_chunk), kMaxSplits});
    p.grid_x = std::min(blocks_x, kMaxGridX);
  } else {
    p.block_x = 32;
    p.block_y = 8;
    const int vec = a.in_dtype == ScalarType::f32 ? 4 : a.in_dtype == ScalarType::f64 ? 2
                    : (a.in_dtype == ScalarType::bf16 || a.in_dtype == ScalarType::f16) ? 8 : 1;
    bool aligned = vec > 1 && rows_contiguous && a.reduce_ndim == 1 && k % vec == 0 &&
                   reinterpret_cast<uintptr_t>(a.in) % 16 == 0;
    for (int d = 0; aligned && d < a.kept_ndim; ++d) aligned = a.kept_strides[d] % vec == 0;
    p.vec = aligned ? vec : 1;
    p.block_per_output = k > 1024;
    if (p.block_per_output) {
      constexpr int64_t kMinChunk = 2048;
      if (m < target_blocks && k >= 2 * kMinChunk)
        p.splits = std::min({ceil_div(target_blocks, m), ceil_div(k, kMinChunk), kMaxSplits});
      p.grid_x = std::min(m, kMaxGridX);
    } else {
      p.grid_x = std::min(ceil_div(m, p.block_y), kMaxGridX);
    }
  }
  p.chunk = k;
  if (p.splits > 1) {
    p.chunk = ceil_div(ceil_div(k, p.splits), p.vec) * p.vec;  // splits start on a vector
    p.splits = ceil_div(k, p.chunk);
  }
  if (p.splits > 1)
    p.workspace_bytes = static_cast<size_t>(p.splits * m) * acc_bytes(op, a.in_dtype);
  return p;
}

cudaError_t reduce(ReduceOp op, const ReduceArgs& a, const ReducePlan& p, double scale,
                   void* workspace, cudaStream_t stream) {
  if (a.num_outputs <= 0) return cudaSuccess;
  if (p.splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;
  if (op == ReduceOp::sum) {
    switch (a.in_dtype) {
      case ScalarType::f32:
        return launch<SumOp<float, float>, float>(a, {static_cast<float>(scale)}, p, workspace,
                                                  stream);
      case ScalarType::f64:
        return launch<SumOp<double, double>, double>(a, {scale}, p, workspace, stream);
      case ScalarType::bf16:
        return launch<SumOp<__nv_bfloat16, float>, __nv_bfloat16>(a, {static_cast<float>(scale)}, p,
                                                                  workspace, stream);
      case ScalarType::f16:
        return launch<SumOp<__half, float>, __half>(a, {static_cast<float>(scale)}, p, workspace,
                                                    stream);
      // Integer sums are exact in i64; a scale other than 1 has no meaning there.
      case ScalarType::i32:
        return launch<SumOp<int32_t, int64_t>, int32_t>(a, {1}, p, workspace, stream);
      case ScalarType::i64:
        return launch<SumOp<int64_t, int64_t>, int64_t>(a, {1}, p, workspace, stream);
      case ScalarType::u8:
        return launch<SumOp<uint8_t, int64_t>, uint8_t>(a, {1}, p, workspace, stream);
      case ScalarType::boolean:
        return launch<SumOp<bool, int64_t>, bool>(a, {1}, p, workspace, stream);
    }
    return cudaErrorInvalidValue;
  }
  switch (a.in_dtype) {
    case ScalarType::f32: return launch<MaxOp<float>, float>(a, {}, p, workspace, stream);
    case ScalarType::f64: return launch<MaxOp<double>, double>(a, {}, p, workspace, stream);
    case ScalarType::bf16:
      return launch<MaxOp<__nv_bfloat16>, __nv_bfloat16>(a, {}, p, workspace, stream);
    case ScalarType::f16: return launch<MaxOp<__half>, __half>(a, {}, p, workspace, stream);
    case ScalarType::i32: return launch<MaxOp<int32_t>, int32_t>(a, {}, p, workspace, stream);
    case ScalarType::i64: return launch<MaxOp<int64_t>, int64_t>(a, {}, p, workspace, stream);
    default: return cudaErrorInvalidValue;
  }
}

namespace {

template <class T>
__global__ void max_backward_kernel(const T* grad_out, const int64_t* index, T* grad_in,
                                    int64_t outer, int64_t n, int64_t inner) {
  const int64_t total = outer * n * inner;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += step) {
    const int64_t i = e % inner, rest = e / inner;
    const int64_t j = rest % n, o = rest / n;
    const int64_t src = o * inner + i;
    grad_in[e] = index[src] == j ? grad_out[src] : convert<T>(0.0f);
  }
}

}  // namespace

cudaError_t max_backward(ScalarType dtype, const void* grad_out, const int64_t* index,
                         void* grad_in, int64_t outer, int64_t n, int64_t inner,
                         cudaStream_t stream) {
  const int64_t total = outer * n * inner;
  if (total == 0) return cudaSuccess;
  if (!is_float(dtype)) return cudaErrorInvalidValue;
  return dispatch_scalar_type(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_half_v<T> || std::is_same_v<T, float> || std::is_same_v<T, double>) {
      max_backward_kernel<T><<<grid_for(total), kBlock, 0, stream>>>(
          static_cast<const T*>(grad_out), index, static_cast<T*>(grad_in), outer, n, inner);
      return cudaGetLastError();
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

}  // namespace lockstep::runtime::cuda::kernels
