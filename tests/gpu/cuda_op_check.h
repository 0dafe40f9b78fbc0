// Shared by the CUDA op tests (test_cuda_*.cpp): random CPU inputs, views
// with unusual strides on the device, poisoned device memory, and one
// comparison of a CUDA result against the CPU op's with stated tolerances.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "lockstep/config.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"

#if LOCKSTEP_HAVE_CUDA
#include "lockstep/runtime/cuda/caching_allocator.h"
#endif

namespace lockstep::testing {

inline runtime::Device cuda0() { return runtime::Device::cuda(0); }

// Every later device allocation starts as 0xFF bytes (NaN in every floating
// dtype), so an output element a kernel forgot to write fails the checks.
inline void poison_device_memory() {
#if LOCKSTEP_HAVE_CUDA
  runtime::cuda::set_poison_allocations(true);
#endif
}

// Standard normal values on the CPU, in `dtype` (rounded from f64).
inline runtime::Tensor randn_cpu(const runtime::Shape& shape, uint64_t seed,
                                 runtime::DType dtype = runtime::DType::f32) {
  runtime::Generator g(seed);
  return runtime::randn(shape, runtime::DType::f64, g).to(dtype);
}

// Small integers in [-k, k] as floats: many ties, for max and pooling.
inline runtime::Tensor small_ints_cpu(const runtime::Shape& shape, uint64_t seed, int k,
                                      runtime::DType dtype = runtime::DType::f32) {
  runtime::Generator g(seed);
  runtime::Tensor u = runtime::rand(shape, runtime::DType::f64, g);
  std::vector<double> v = u.to_vector<double>();
  for (double& x : v) x = std::floor(x * (2 * k + 1)) - k;
  return runtime::Tensor::from_vector<double>(v, shape).to(dtype);
}

// The same values as `t` (moved to the device) in a layout that is not
// contiguous: the transpose of a contiguous copy of the transpose.
inline runtime::Tensor transposed_on_device(const runtime::Tensor& t, int64_t d0 = 0,
                                            int64_t d1 = -1) {
  runtime::Tensor v = t.to(cuda0()).transpose(d0, d1).contiguous().transpose(d0, d1);
  REQUIRE(!v.is_contiguous());
  return v;
}

// The same values as `t` on the device as every other element of a tensor
// twice as long in dim `d` (the others are NaN, or 77 for integer dtypes, so
// reading them shows).
inline runtime::Tensor strided_on_device(const runtime::Tensor& t, int64_t d = -1) {
  const int64_t dim = d < 0 ? d + t.dim() : d;
  runtime::Shape big = t.shape();
  big[dim] *= 2;
  const double filler = runtime::is_floating(t.dtype()) ? NAN : 77.0;
  runtime::Tensor b = runtime::Tensor::full(big, filler, t.dtype(), cuda0());
  runtime::Tensor v = b.slice(dim, 0, big[dim], 2);
  v.copy_(t.to(cuda0()));
  return v;
}

// Every element of `got` (any device and dtype) within atol + rtol * |want|
// of `want`; NaN only where `want` is NaN. Reports the first mismatches.
inline void check_close_to(const runtime::Tensor& got, const runtime::Tensor& want, double rtol,
                           double atol, const std::string& what) {
  INFO(what);
  REQUIRE(runtime::shape_str(got.shape()) == runtime::shape_str(want.shape()));
  const std::vector<double> g = got.detach().to_vector<double>();
  const std::vector<double> w = want.detach().to_vector<double>();
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < w.size(); ++i) {
    const bool ok = std::isnan(w[i]) ? std::isnan(g[i])
                    : std::isinf(w[i]) ? g[i] == w[i]
                                       : std::abs(g[i] - w[i]) <= atol + rtol * std::abs(w[i]);
    if (!ok && bad++ < 5) first << " [" << i << "] got " << g[i] << " want " << w[i] << ";";
  }
  INFO(bad << " of " << w.size() << " elements differ:" << first.str());
  CHECK(bad == 0);
}

// Bit-for-bit equality of the values (through f64, which holds every value of
// the smaller dtypes exactly); NaN equals NaN.
inline void check_equal_to(const runtime::Tensor& got, const runtime::Tensor& want,
                           const std::string& what) {
  check_close_to(got, want, 0.0, 0.0, what);
}

}  // namespace lockstep::testing
