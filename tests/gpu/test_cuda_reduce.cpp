// sum, mean, max and argmax on CUDA against the CPU ops: inner, outer, middle
// and several dims, keepdim, sizes that take every kernel path (warp and block
// rows, vector loads, columns, split reductions), non-contiguous and expanded
// inputs, integer and 16-bit dtypes, ties and NaN for max; forward and
// backward. Tolerances: f32 results within 1e-5 relative plus 1e-5 * sqrt(n)
// absolute (n elements summed; the CPU accumulates in f64, CUDA in f32),
// f64 within 1e-12, bf16 within 1/128 relative and f16 within 1/1024 relative
// (the output's rounding); integer sums, max values and indices exactly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/tensor.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;

namespace {

struct SumCase {
  Shape shape;
  std::vector<int64_t> dims;  // empty: all
};

std::string describe(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  return "shape " + shape_str(shape) + " dims " + shape_str(dims) + (keepdim ? " keepdim" : "");
}

int64_t reduced_count(const Shape& shape, const std::vector<int64_t>& dims) {
  if (dims.empty()) return shape_numel(shape);
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d < 0 ? d + static_cast<int64_t>(shape.size()) : d];
  return n;
}

double sum_atol(DType dt, int64_t n) {
  const double count = static_cast<double>(std::max<int64_t>(n, 1));
  return (dt == DType::f64 ? 1e-12 : 1e-5) * std::sqrt(count);
}

double rtol_of(DType dt) {
  switch (dt) {
    case DType::f64: return 1e-12;
    case DType::bf16: return 1.0 / 128;
    case DType::f16: return 1.0 / 1024;
    default: return 1e-5;
  }
}

// Sizes chosen for the kernel paths of cuda/kernels/reduce.cu.
const std::vector<SumCase> kSumCases = {
    {{37}, {}},                  // a short row
    {{5, 7}, {0}},               // columns, short
    {{5, 7}, {1}},               // short rows: a thread per output
    {{4, 6, 9}, {1}},            // the middle dim
    {{4, 6, 9}, {0, 2}},         // outer and inner at once
    {{3, 1, 5, 8}, {1, 3}},      // a size-1 dim among the reduced
    {{2, 3, 4, 5}, {0, 1, 2, 3}},
    {{257, 1023}, {1}},          // warp per row, odd length (scalar loads)
    {{64, 1024}, {1}},           // warp per row, vector loads
    {{3, 65536}, {1}},           // block per row, split across blocks
    {{1 << 20}, {}},             // one output from many blocks
    {{65536, 3}, {0}},           // columns, split across blocks (bias gradient)
    {{4096, 512}, {0}},          // columns, wide
    {{8, 300, 5}, {1}},          // middle dim, strided columns
    {{64, 33, 17}, {0, 2}},
};

}  // namespace

TEST_CASE("CUDA sum matches the CPU over inner, outer, middle and several dims",
          "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
  uint64_t seed = 1;
  for (const SumCase& c : kSumCases) {
    for (bool keepdim : {false, true}) {
      const Tensor x = randn_cpu(c.shape, seed++, dt);
      const Tensor want = c.dims.empty() ? sum(x) : sum(x, c.dims, keepdim);
      const Tensor got = c.dims.empty() ? sum(x.to(cuda0())) : sum(x.to(cuda0()), c.dims, keepdim);
      CHECK(got.device() == cuda0());
      CHECK(got.dtype() == dt);
      check_close_to(got, want, rtol_of(dt), sum_atol(dt, reduced_count(c.shape, c.dims)),
                     describe(c.shape, c.dims, keepdim) + " " + std::string(dtype_name(dt)));
      if (c.dims.empty()) break;
    }
  }
}

TEST_CASE("CUDA sum of non-contiguous and expanded inputs", "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const Tensor x = randn_cpu({300, 40}, 11);
  for (int64_t d : {0, 1}) {
    check_close_to(sum(transposed_on_device(x), {d}), sum(x, {d}), 1e-5, sum_atol(DType::f32, 300),
                   "transposed, dim " + std::to_string(d));
    check_close_to(sum(strided_on_device(x), {d}), sum(x, {d}), 1e-5, sum_atol(DType::f32, 300),
                   "every other column, dim " + std::to_string(d));
  }
  check_close_to(sum(strided_on_device(x, 0)), sum(x), 1e-5, sum_atol(DType::f32, 12000),
                 "every other row, all");
  const Tensor y = randn_cpu({5, 1, 7}, 12);
  const Shape big{5, 64, 7};
  const std::vector<std::vector<int64_t>> dim_sets = {{1}, {0, 1}, {1, 2}, {}};
  for (const std::vector<int64_t>& dims : dim_sets) {
    check_close_to(sum(y.to(cuda0()).expand(big), dims), sum(y.expand(big), dims), 1e-5,
                   sum_atol(DType::f32, 64 * 35), "expanded, dims " + shape_str(dims));
  }
}

TEST_CASE("CUDA sum of integers and bools is exact, in i64", "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const Tensor base = small_ints_cpu({33, 70}, 21, 100, DType::f64);
  for (DType dt : {DType::i32, DType::i64, DType::u8, DType::boolean}) {
    const Tensor x = dt == DType::u8 ? add(base, 100.0).to(dt) : base.to(dt);
    const std::vector<std::vector<int64_t>> dim_sets = {{0}, {1}, {}};
    for (const std::vector<int64_t>& dims : dim_sets) {
      const Tensor got = sum(x.to(cuda0()), dims);
      CHECK(got.dtype() == DType::i64);
      check_equal_to(got, sum(x, dims), std::string(dtype_name(dt)) + " dims " + shape_str(dims));
    }
  }
}

TEST_CASE("CUDA sum and mean of bf16 and f16 accumulate in f32", "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  uint64_t seed = 31;
  for (const SumCase& c : kSumCases) {
    const Tensor x = randn_cpu(c.shape, seed++, dt);  // the CPU reference sees the same rounding
    const Tensor x32 = x.to(DType::f32);
    const int64_t n = reduced_count(c.shape, c.dims);
    const Tensor got = c.dims.empty() ? sum(x.to(cuda0())) : sum(x.to(cuda0()), c.dims);
    CHECK(got.dtype() == dt);
    check_close_to(got, c.dims.empty() ? sum(x32) : sum(x32, c.dims), rtol_of(dt),
                   sum_atol(DType::f32, n), "sum " + describe(c.shape, c.dims, false));
    const Tensor got_mean = c.dims.empty() ? mean(x.to(cuda0())) : mean(x.to(cuda0()), c.dims);
    CHECK(got_mean.dtype() == dt);
    check_close_to(got_mean, c.dims.empty() ? mean(x32) : mean(x32, c.dims), rtol_of(dt),
                   sum_atol(DType::f32, n) / static_cast<double>(n),
                   "mean " + describe(c.shape, c.dims, false));
  }
}

TEST_CASE("CUDA mean matches the CPU", "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
  uint64_t seed = 41;
  for (const SumCase& c : kSumCases) {
    for (bool keepdim : {false, true}) {
      const Tensor x = randn_cpu(c.shape, seed++, dt);
      const int64_t n = reduced_count(c.shape, c.dims);
      const Tensor got = mean(x.to(cuda0()), c.dims, keepdim);
      check_close_to(got, mean(x, c.dims, keepdim), rtol_of(dt),
                     sum_atol(dt, n) / static_cast<double>(n), describe(c.shape, c.dims, keepdim));
    }
  }
}

TEST_CASE("CUDA sum and mean backward match the CPU", "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  uint64_t seed = 51;
  for (const SumCase& c : {SumCase{{4, 6, 9}, {1}}, SumCase{{4, 6, 9}, {0, 2}},
                           SumCase{{65536, 3}, {0}}, SumCase{{37}, {}}}) {
    for (bool keepdim : {false, true}) {
      for (bool use_mean : {false, true}) {
        const Tensor x = randn_cpu(c.shape, seed++);
        Tensor xc = x.clone().requires_grad_();
        Tensor xg = x.to(cuda0()).requires_grad_();
        Tensor yc = use_mean ? mean(xc, c.dims, keepdim) : sum(xc, c.dims, keepdim);
        Tensor yg = use_mean ? mean(xg, c.dims, keepdim) : sum(xg, c.dims, keepdim);
        const Tensor gy = randn_cpu(yc.shape(), seed++);
        yc.backward(gy);
        yg.backward(gy.to(cuda0()));
        REQUIRE(xg.grad().defined());
        CHECK(xg.grad().device() == cuda0());
        check_close_to(xg.grad(), xc.grad(), 1e-6, 1e-7,
                       (use_mean ? "mean " : "sum ") + describe(c.shape, c.dims, keepdim));
      }
    }
  }
}

TEST_CASE("CUDA max and argmax match the CPU: the first index of tied maxima",
          "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64, DType::i32, DType::i64);
  struct MaxCase {
    Shape shape;
    int64_t dim;
  };
  uint64_t seed = 61;
  for (const MaxCase& c : {MaxCase{{7}, 0}, MaxCase{{5, 9}, 0}, MaxCase{{5, 9}, 1},
                           MaxCase{{4, 6, 9}, 1}, MaxCase{{4, 6, 9}, -1}, MaxCase{{3, 1, 5}, 1},
                           MaxCase{{300, 1500}, 1}, MaxCase{{3, 100000}, 1},
                           MaxCase{{100000, 3}, 0}, MaxCase{{64, 129}, 0}}) {
    // Few distinct values: most maxima are tied.
    const Tensor x = small_ints_cpu(c.shape, seed++, 3, dt);
    for (bool keepdim : {false, true}) {
      const std::string what =
          describe(c.shape, {c.dim}, keepdim) + " " + std::string(dtype_name(dt));
      check_equal_to(max(x.to(cuda0()), c.dim, keepdim), max(x, c.dim, keepdim), "max " + what);
      const Tensor idx = argmax(x.to(cuda0()), c.dim, keepdim);
      CHECK(idx.dtype() == DType::i64);
      check_equal_to(idx, argmax(x, c.dim, keepdim), "argmax " + what);
    }
  }
  const Tensor all = small_ints_cpu({1000, 37}, seed++, 50, dt);
  check_equal_to(max(all.to(cuda0())), max(all), "max of all elements");
  check_equal_to(max(transposed_on_device(all), 0), max(all, 0), "transposed input");
}

TEST_CASE("CUDA max with NaN: the first NaN wins", "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  std::vector<double> v = small_ints_cpu({6, 40}, 71, 5, DType::f64).to_vector<double>();
  v[1 * 40 + 7] = NAN;   // row 1: one NaN
  v[2 * 40 + 3] = NAN;   // row 2: two NaNs, the first must win
  v[2 * 40 + 30] = NAN;
  v[5 * 40 + 39] = NAN;  // row 5: NaN last
  const Tensor x = Tensor::from_vector<double>(v, {6, 40}).to(DType::f32);
  check_equal_to(max(x.to(cuda0()), 1), max(x, 1), "values");
  check_equal_to(argmax(x.to(cuda0()), 1), argmax(x, 1), "indices");
  check_equal_to(argmax(x.to(cuda0()).t().contiguous(), 0), argmax(x, 1), "over dim 0");
}

TEST_CASE("CUDA max of bf16 and f16 is exact", "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::bf16, DType::f16);
  const Tensor x = randn_cpu({33, 1000}, 81, dt);
  const Tensor x32 = x.to(DType::f32);
  for (int64_t d : {0, 1}) {
    const Tensor got = max(x.to(cuda0()), d);
    CHECK(got.dtype() == dt);
    check_equal_to(got, max(x32, d), "values, dim " + std::to_string(d));
    check_equal_to(argmax(x.to(cuda0()), d), argmax(x32, d), "indices, dim " + std::to_string(d));
  }
}

TEST_CASE("CUDA max backward routes the gradient to the first maximum", "[gpu][cuda][reduce]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  uint64_t seed = 91;
  for (int64_t dim : {0, 1, 2}) {
    for (bool keepdim : {false, true}) {
      const Tensor x = small_ints_cpu({4, 6, 9}, seed++, 2);
      Tensor xc = x.clone().requires_grad_();
      Tensor xg = x.to(cuda0()).requires_grad_();
      Tensor yc = max(xc, dim, keepdim);
      Tensor yg = max(xg, dim, keepdim);
      const Tensor gy = randn_cpu(yc.shape(), seed++);
      yc.backward(gy);
      yg.backward(gy.to(cuda0()));
      check_equal_to(xg.grad(), xc.grad(), describe({4, 6, 9}, {dim}, keepdim));
    }
  }
  const Tensor x = small_ints_cpu({50, 20}, seed++, 2);
  Tensor xc = x.clone().requires_grad_();
  Tensor xg = x.to(cuda0()).requires_grad_();
  max(xc).backward();
  max(xg).backward();
  check_equal_to(xg.grad(), xc.grad(), "max of all elements");
}
