// Elementwise kernels: copy with conversion, fill, unary and binary ops.
//
// Each op has two kernels. The dense one (every operand contiguous over one
// dimension, the common case) handles 4 elements per thread with one vector
// load or store per operand when every pointer is aligned to 4 elements,
// 16 bytes for f32; a scalar loop covers the tail. The strided one computes
// each operand's offset from the linear index (dimensions were merged on the
// host, so there are few divisions). Both loop grid-stride.
#include "lockstep/runtime/cuda/kernels/elementwise.h"

#include <cmath>

#include "lockstep/runtime/cuda/kernels/block_reduce.cuh"
#include "lockstep/runtime/cuda/kernels/device_types.cuh"

namespace lockstep::runtime::cuda::kernels {

namespace {

constexpr int kVec = 4;

template <class T>
__device__ __forceinline__ bool aligned_for_vec(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kVec) == 0;
}

// ---- the loops -------------------------------------------------------------

// out[i] = f(in[i]) with out of type O, in of type I; f maps I to O.
template <class O, class I, class F>
__global__ void map1_dense(O* out, const I* in, int64_t n, F f) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (aligned_for_vec<O>(out) && aligned_for_vec<I>(in)) {
    const int64_t nvec = n / kVec;
    for (int64_t v = first; v < nvec; v += stride) {
      const AlignedVec<I, kVec> x = load_vec<kVec>(in, v);
      AlignedVec<O, kVec> y;
#pragma unroll
      for (int j = 0; j < kVec; ++j) y.v[j] = f(x.v[j]);
      store_vec<kVec>(out, v, y);
    }
    for (int64_t i = nvec * kVec + first; i < n; i += stride) out[i] = f(in[i]);
  } else {
    for (int64_t i = first; i < n; i += stride) out[i] = f(in[i]);
  }
}

template <class O, class I, class F>
__global__ void map1_strided(ElementwiseArgs<2> a, F f) {
  O* out = static_cast<O*>(a.data[0]);
  const I* in = static_cast<const I*>(a.data[1]);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < a.numel; i += stride) {
    int64_t off[2];
    element_offsets(a, i, off);
    out[off[0]] = f(in[off[1]]);
  }
}

// out[i] = f(x[i], y[i]); x and y of type I.
template <class O, class I, class F>
__global__ void map2_dense(O* out, const I* x, const I* y, int64_t n, F f) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (aligned_for_vec<O>(out) && aligned_for_vec<I>(x) && aligned_for_vec<I>(y)) {
    const int64_t nvec = n / kVec;
    for (int64_t v = first; v < nvec; v += stride) {
      const AlignedVec<I, kVec> a = load_vec<kVec>(x, v);
      const AlignedVec<I, kVec> b = load_vec<kVec>(y, v);
      AlignedVec<O, kVec> r;
#pragma unroll
      for (int j = 0; j < kVec; ++j) r.v[j] = f(a.v[j], b.v[j]);
      store_vec<kVec>(out, v, r);
    }
    for (int64_t i = nvec * kVec + first; i < n; i += stride) out[i] = f(x[i], y[i]);
  } else {
    for (int64_t i = first; i < n; i += stride) out[i] = f(x[i], y[i]);
  }
}

template <class O, class I, class F>
__global__ void map2_strided(ElementwiseArgs<3> a, F f) {
  O* out = static_cast<O*>(a.data[0]);
  const I* x = static_cast<const I*>(a.data[1]);
  const I* y = static_cast<const I*>(a.data[2]);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < a.numel; i += stride) {
    int64_t off[3];
    element_offsets(a, i, off);
    out[off[0]] = f(x[off[1]], y[off[2]]);
  }
}

template <class O, class I, class F>
cudaError_t launch_map1(const ElementwiseArgs<2>& a, F f, cudaStream_t stream) {
  if (a.numel == 0) return cudaSuccess;
  const unsigned grid = grid_for(a.contiguous ? (a.numel + kVec - 1) / kVec : a.numel);
  if (a.contiguous)
    map1_dense<O, I><<<grid, kBlock, 0, stream>>>(static_cast<O*>(a.data[0]),
                                                  static_cast<const I*>(a.data[1]), a.numel, f);
  else
    map1_strided<O, I><<<grid, kBlock, 0, stream>>>(a, f);
  return cudaGetLastError();
}

template <class O, class I, class F>
cudaError_t launch_map2(const ElementwiseArgs<3>& a, F f, cudaStream_t stream) {
  if (a.numel == 0) return cudaSuccess;
  const unsigned grid = grid_for(a.contiguous ? (a.numel + kVec - 1) / kVec : a.numel);
  if (a.contiguous)
    map2_dense<O, I><<<grid, kBlock, 0, stream>>>(static_cast<O*>(a.data[0]),
                                                  static_cast<const I*>(a.data[1]),
                                                  static_cast<const I*>(a.data[2]), a.numel, f);
  else
    map2_strided<O, I><<<grid, kBlock, 0, stream>>>(a, f);
  return cudaGetLastError();
}

// ---- copy and fill -------------------------------------------------------------

template <class D, class S>
struct Convert {
  __device__ D operator()(S v) const { return convert<D>(v); }
};

template <class T>
__global__ void fill_dense(T* out, int64_t n, T value) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = value;
}

template <class T>
__global__ void fill_strided(ElementwiseArgs<1> a, T value) {
  T* out = static_cast<T*>(a.data[0]);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < a.numel; i += stride) {
    int64_t off[1];
    element_offsets(a, i, off);
    out[off[0]] = value;
  }
}

// ---- unary ops: functors over the stored type T, computing in compute_t<T> ----

template <class C>
__device__ __forceinline__ C gelu_of(C x) {
  return C(0.5) * x * (C(1) + erf(x * C(0.70710678118654752440)));
}

template <class T, UnaryOp kOp>
struct Unary {
  using C = compute_t<T>;
  C s;
  __device__ T operator()(T in) const {
    const C x = convert<C>(in);
    C r;
    if constexpr (kOp == UnaryOp::neg) r = -x;
    else if constexpr (kOp == UnaryOp::exp) r = exp(x);
    else if constexpr (kOp == UnaryOp::log) r = log(x);
    else if constexpr (kOp == UnaryOp::sqrt) r = sqrt(x);
    else if constexpr (kOp == UnaryOp::abs) r = x < C(0) ? -x : x + C(0);  // -0 -> +0, as std::abs
    else if constexpr (kOp == UnaryOp::add_scalar) r = x + s;
    else if constexpr (kOp == UnaryOp::mul_scalar) r = x * s;
    else if constexpr (kOp == UnaryOp::pow_scalar) r = s == C(2) ? x * x : pow(x, s);
    else if constexpr (kOp == UnaryOp::relu) r = (x > C(0) || x != x) ? x : C(0);  // NaN passes
    else if constexpr (kOp == UnaryOp::sigmoid) {
      // Split by sign, as the CPU op: exp(-x) would overflow for very negative x.
      r = x >= C(0) ? C(1) / (C(1) + exp(-x)) : exp(x) / (C(1) + exp(x));
    }
    else if constexpr (kOp == UnaryOp::tanh) r = tanh(x);
    else if constexpr (kOp == UnaryOp::sign) r = C((x > C(0)) - (x < C(0)));
    else r = gelu_of(x);
    return convert<T>(r);
  }
};

template <class T, UnaryOp kOp>
cudaError_t run_unary(const ElementwiseArgs<2>& a, double scalar, cudaStream_t stream) {
  return launch_map1<T, T>(a, Unary<T, kOp>{static_cast<compute_t<T>>(scalar)}, stream);
}

template <class T>
cudaError_t unary_float(UnaryOp op, const ElementwiseArgs<2>& a, double s, cudaStream_t stream) {
  switch (op) {
    case UnaryOp::neg: return run_unary<T, UnaryOp::neg>(a, s, stream);
    case UnaryOp::exp: return run_unary<T, UnaryOp::exp>(a, s, stream);
    case UnaryOp::log: return run_unary<T, UnaryOp::log>(a, s, stream);
    case UnaryOp::sqrt: return run_unary<T, UnaryOp::sqrt>(a, s, stream);
    case UnaryOp::abs: return run_unary<T, UnaryOp::abs>(a, s, stream);
    case UnaryOp::add_scalar: return run_unary<T, UnaryOp::add_scalar>(a, s, stream);
    case UnaryOp::mul_scalar: return run_unary<T, UnaryOp::mul_scalar>(a, s, stream);
    case UnaryOp::pow_scalar: return run_unary<T, UnaryOp::pow_scalar>(a, s, stream);
    case UnaryOp::relu: return run_unary<T, UnaryOp::relu>(a, s, stream);
    case UnaryOp::sigmoid: return run_unary<T, UnaryOp::sigmoid>(a, s, stream);
    case UnaryOp::tanh: return run_unary<T, UnaryOp::tanh>(a, s, stream);
    case UnaryOp::gelu: return run_unary<T, UnaryOp::gelu>(a, s, stream);
    case UnaryOp::sign: return run_unary<T, UnaryOp::sign>(a, s, stream);
  }
  return cudaErrorInvalidValue;
}

template <class T>
cudaError_t unary_integer(UnaryOp op, const ElementwiseArgs<2>& a, double s, cudaStream_t stream) {
  switch (op) {
    case UnaryOp::neg: return run_unary<T, UnaryOp::neg>(a, s, stream);
    case UnaryOp::abs: return run_unary<T, UnaryOp::abs>(a, s, stream);
    case UnaryOp::add_scalar: return run_unary<T, UnaryOp::add_scalar>(a, s, stream);
    case UnaryOp::mul_scalar: return run_unary<T, UnaryOp::mul_scalar>(a, s, stream);
    case UnaryOp::relu: return run_unary<T, UnaryOp::relu>(a, s, stream);
    case UnaryOp::sign: return run_unary<T, UnaryOp::sign>(a, s, stream);
    default: return cudaErrorInvalidValue;  // the host refuses these first
  }
}

// ---- binary ops ------------------------------------------------------------

template <class T, BinaryOp kOp>
struct Binary {
  using C = compute_t<T>;
  static constexpr bool kCompare = kOp == BinaryOp::eq || kOp == BinaryOp::ne ||
                                   kOp == BinaryOp::gt || kOp == BinaryOp::ge ||
                                   kOp == BinaryOp::lt || kOp == BinaryOp::le;
  using Out = std::conditional_t<kCompare, bool, T>;
  C alpha;
  __device__ Out operator()(T xa, T xb) const {
    const C a = convert<C>(xa), b = convert<C>(xb);
    if constexpr (kOp == BinaryOp::eq) return a == b;
    else if constexpr (kOp == BinaryOp::ne) return a != b;
    else if constexpr (kOp == BinaryOp::gt) return a > b;
    else if constexpr (kOp == BinaryOp::ge) return a >= b;
    else if constexpr (kOp == BinaryOp::lt) return a < b;
    else if constexpr (kOp == BinaryOp::le) return a <= b;
    else {
      C r;
      if constexpr (kOp == BinaryOp::add) r = a + alpha * b;
      else if constexpr (kOp == BinaryOp::sub) r = a - b;
      else if constexpr (kOp == BinaryOp::mul) r = a * b;
      else if constexpr (kOp == BinaryOp::div) r = a / b;
      // NaN propagates, as in PyTorch's maximum/minimum.
      else if constexpr (kOp == BinaryOp::maximum) r = (a != a || a > b) ? a : b;
      else if constexpr (kOp == BinaryOp::minimum) r = (a != a || a < b) ? a : b;
      else if constexpr (kOp == BinaryOp::relu_backward) r = b <= C(0) ? C(0) : a;
      else if constexpr (kOp == BinaryOp::sigmoid_backward) r = a * b * (C(1) - b);
      else if constexpr (kOp == BinaryOp::tanh_backward) r = a * (C(1) - b * b);
      else {  // gelu_backward: d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
        const C cdf = C(0.5) * (C(1) + erf(b * C(0.70710678118654752440)));
        const C pdf = exp(C(-0.5) * b * b) * C(0.39894228040143267794);
        r = a * (cdf + b * pdf);
      }
      return convert<T>(r);
    }
  }
};

template <class T, BinaryOp kOp>
cudaError_t run_binary(const ElementwiseArgs<3>& a, double alpha, cudaStream_t stream) {
  using F = Binary<T, kOp>;
  return launch_map2<typename F::Out, T>(a, F{static_cast<compute_t<T>>(alpha)}, stream);
}

// Arithmetic and comparisons: every dtype but bool and u8.
template <class T>
cudaError_t binary_common(BinaryOp op, const ElementwiseArgs<3>& a, double alpha,
                          cudaStream_t stream) {
  switch (op) {
    case BinaryOp::add: return run_binary<T, BinaryOp::add>(a, alpha, stream);
    case BinaryOp::sub: return run_binary<T, BinaryOp::sub>(a, alpha, stream);
    case BinaryOp::mul: return run_binary<T, BinaryOp::mul>(a, alpha, stream);
    case BinaryOp::div: return run_binary<T, BinaryOp::div>(a, alpha, stream);
    case BinaryOp::maximum: return run_binary<T, BinaryOp::maximum>(a, alpha, stream);
    case BinaryOp::minimum: return run_binary<T, BinaryOp::minimum>(a, alpha, stream);
    case BinaryOp::eq: return run_binary<T, BinaryOp::eq>(a, alpha, stream);
    case BinaryOp::ne: return run_binary<T, BinaryOp::ne>(a, alpha, stream);
    case BinaryOp::gt: return run_binary<T, BinaryOp::gt>(a, alpha, stream);
    case BinaryOp::ge: return run_binary<T, BinaryOp::ge>(a, alpha, stream);
    case BinaryOp::lt: return run_binary<T, BinaryOp::lt>(a, alpha, stream);
    case BinaryOp::le: return run_binary<T, BinaryOp::le>(a, alpha, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <class T>
cudaError_t binary_float(BinaryOp op, const ElementwiseArgs<3>& a, double alpha,
                         cudaStream_t stream) {
  switch (op) {
    case BinaryOp::relu_backward: return run_binary<T, BinaryOp::relu_backward>(a, alpha, stream);
    case BinaryOp::sigmoid_backward:
      return run_binary<T, BinaryOp::sigmoid_backward>(a, alpha, stream);
    case BinaryOp::tanh_backward: return run_binary<T, BinaryOp::tanh_backward>(a, alpha, stream);
    case BinaryOp::gelu_backward: return run_binary<T, BinaryOp::gelu_backward>(a, alpha, stream);
    default: return binary_common<T>(op, a, alpha, stream);
  }
}

}  // namespace

cudaError_t copy(const ElementwiseArgs<2>& args, cudaStream_t stream) {
  return dispatch_scalar_type(args.dtype[0], [&](auto dtag) {
    using D = decltype(dtag);
    return dispatch_scalar_type(args.dtype[1], [&](auto stag) {
      using S = decltype(stag);
      if constexpr (std::is_same_v<D, S>) {
        if (args.contiguous && args.numel > 0)  // a plain device-to-device copy
          return cudaMemcpyAsync(args.data[0], args.data[1], args.numel * sizeof(D),
                                 cudaMemcpyDeviceToDevice, stream);
      }
      return launch_map1<D, S>(args, Convert<D, S>{}, stream);
    });
  });
}

cudaError_t fill(const ElementwiseArgs<1>& args, double value, cudaStream_t stream) {
  if (args.numel == 0) return cudaSuccess;
  return dispatch_scalar_type(args.dtype[0], [&](auto tag) {
    using T = decltype(tag);
    const T v = convert<T>(value);
    if (args.contiguous)
      fill_dense<T><<<grid_for(args.numel), kBlock, 0, stream>>>(static_cast<T*>(args.data[0]),
                                                                 args.numel, v);
    else
      fill_strided<T><<<grid_for(args.numel), kBlock, 0, stream>>>(args, v);
    return cudaGetLastError();
  });
}

cudaError_t unary(UnaryOp op, const ElementwiseArgs<2>& args, double scalar, cudaStream_t stream) {
  switch (args.dtype[1]) {
    case ScalarType::f32: return unary_float<float>(op, args, scalar, stream);
    case ScalarType::f64: return unary_float<double>(op, args, scalar, stream);
    case ScalarType::bf16: return unary_float<__nv_bfloat16>(op, args, scalar, stream);
    case ScalarType::f16: return unary_float<__half>(op, args, scalar, stream);
    case ScalarType::i32: return unary_integer<int32_t>(op, args, scalar, stream);
    case ScalarType::i64: return unary_integer<int64_t>(op, args, scalar, stream);
    default: return cudaErrorInvalidValue;
  }
}

cudaError_t binary(BinaryOp op, const ElementwiseArgs<3>& args, double alpha, cudaStream_t stream) {
  switch (args.dtype[1]) {
    case ScalarType::f32: return binary_float<float>(op, args, alpha, stream);
    case ScalarType::f64: return binary_float<double>(op, args, alpha, stream);
    case ScalarType::bf16: return binary_float<__nv_bfloat16>(op, args, alpha, stream);
    case ScalarType::f16: return binary_float<__half>(op, args, alpha, stream);
    case ScalarType::i32: return binary_common<int32_t>(op, args, alpha, stream);
    case ScalarType::i64: return binary_common<int64_t>(op, args, alpha, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace lockstep::runtime::cuda::kernels
