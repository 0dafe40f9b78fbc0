// dropout, embedding and cat on CUDA.
// dropout: over 2^20 elements the kept fraction is within 5 standard
// deviations of 1 - p; kept values are x / (1 - p) exactly; the mask equals the
// CPU op's for the same generator state (same Philox stream), which also
// advances by one draw per element on both devices; same seed, same output;
// backward applies the forward mask.
// embedding: forward bit-exact against the CPU for several row widths and
// dtypes; backward with repeated indices within 1e-5 relative plus 1e-5
// absolute (atomic adds, in no fixed order).
// cat: exact, forward and backward, along every dim, non-contiguous inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "gpu/cuda_op_check.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/misc.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/random.h"
#include "lockstep/runtime/tensor.h"
#include "support/gpu_skip.h"
#include "support/test_util.h"

using namespace lockstep::runtime;
using namespace lockstep::testing;
using Catch::Contains;

TEST_CASE("CUDA dropout keeps 1 - p of the elements, scaled by 1 / (1 - p)", "[gpu][cuda][misc]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::bf16);
  const double p = GENERATE(0.1, 0.5, 0.9);
  const int64_t n = int64_t{1} << 20;
  Generator g(1234);
  const Tensor y = dropout(Tensor::ones({n}, dt, cuda0()), p, /*training=*/true, g);
  CHECK(g.offset() == static_cast<uint64_t>(n));
  const std::vector<double> v = y.to_vector<double>();
  // The op multiplies in f32 by 1 / (1 - p) rounded to f32, then rounds to dt.
  const double scale = Tensor::full({}, 1.0 / (1.0 - p), DType::f32).to(dt).item();
  int64_t kept = 0, wrong = 0;
  for (double x : v) {
    if (x != 0) ++kept;
    if (x != 0 && x != scale) ++wrong;
  }
  CHECK(wrong == 0);
  const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
  INFO("p " << p << ", kept " << kept << " of " << n);
  CHECK(std::abs(static_cast<double>(kept) / static_cast<double>(n) - (1 - p)) < 5 * sigma);
}

TEST_CASE("CUDA dropout draws the CPU's mask from the same generator state", "[gpu][cuda][misc]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  // Start offsets that are not a multiple of 4 split a Philox block.
  for (uint64_t offset : {0, 3, 4, 1001}) {
    for (int64_t n : {1, 5, 1000, 12345}) {
      const Tensor x = randn_cpu({n}, 7 + n);
      Generator gc(99), gg(99);
      gc.set_offset(offset);
      gg.set_offset(offset);
      const Tensor yc = dropout(x, 0.3, true, gc);
      const Tensor yg = dropout(x.to(cuda0()), 0.3, true, gg);
      INFO("offset " << offset << ", n " << n);
      check_equal_to(yg, yc, "output");
      CHECK(gg.offset() == gc.offset());
    }
  }
  // A non-contiguous input: the draws follow the logical element order.
  const Tensor x = randn_cpu({40, 30}, 5);
  Generator gc(7), gg(7);
  check_equal_to(dropout(transposed_on_device(x), 0.5, true, gg), dropout(x, 0.5, true, gc),
                 "transposed input");
}

TEST_CASE("CUDA dropout is deterministic under a seed and its backward uses the mask",
          "[gpu][cuda][misc]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const Tensor x = randn_cpu({64, 129}, 11).to(cuda0());
  Generator a(5), b(5), c(6);
  const Tensor ya = dropout(x, 0.4, true, a);
  check_equal_to(dropout(x, 0.4, true, b), ya, "same seed");
  const Tensor other = dropout(x, 0.4, true, c);  // another seed: another mask
  CHECK(values(eq(other, ya)) != values(Tensor::ones({64, 129}, DType::boolean)));

  Generator g(8), g2(8);
  Tensor xg = x.detach().requires_grad_();
  const Tensor y = dropout(xg, 0.4, true, g);
  const Tensor gy = randn_cpu({64, 129}, 12).to(cuda0());
  y.backward(gy);
  // dx = dy * mask / (1 - p), the mask being where y (of a nonzero x) is kept.
  const Tensor mask = dropout(Tensor::ones({64, 129}, DType::f32, cuda0()), 0.4, true, g2);
  check_close_to(xg.grad(), mul(gy, mask), 1e-7, 0.0, "backward");

  Tensor xe = x.detach().requires_grad_();
  dropout(xe, 1.0, true, g).backward(gy);
  check_equal_to(xe.grad(), Tensor::zeros({64, 129}), "p = 1");
  CHECK(dropout(x, 0.4, /*training=*/false, g).is_same(x));
}

TEST_CASE("CUDA embedding forward is exact and backward adds repeated rows", "[gpu][cuda][misc]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const DType dt = GENERATE(DType::f32, DType::f64);
  const DType index_dtype = GENERATE(DType::i64, DType::i32);
  uint64_t seed = 21;
  // Row widths of 3 and 5 elements (4- and 8-byte copies), 16 and 33.
  for (int64_t dim : {3, 5, 16, 33}) {
    const int64_t rows = 50;
    const Tensor w = randn_cpu({rows, dim}, seed++, dt);
    // Many repeats: 4 x 7 lookups into 10 rows, and row 3 everywhere.
    for (bool same_row : {false, true}) {
      Generator gi(seed++);
      std::vector<int64_t> idx(28);
      for (int64_t& i : idx) i = same_row ? 3 : static_cast<int64_t>(gi.next_uniform() * 10);
      const Tensor indices = Tensor::from_vector<int64_t>(idx, {4, 7}).to(index_dtype);
      Tensor wc = w.clone().requires_grad_();
      Tensor wg = w.to(cuda0()).requires_grad_();
      Tensor yc = embedding(indices, wc);
      Tensor yg = embedding(indices.to(cuda0()), wg);
      const std::string what = "dim " + std::to_string(dim) + (same_row ? " one row" : "");
      check_equal_to(yg, yc, what + " forward");
      const Tensor gy = randn_cpu(yc.shape(), seed++, dt);
      yc.backward(gy);
      yg.backward(gy.to(cuda0()));
      check_close_to(wg.grad(), wc.grad(), 1e-5, 1e-5, what + " backward");
    }
  }
}

TEST_CASE("CUDA embedding of bf16 tables", "[gpu][cuda][misc]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  const Tensor w = randn_cpu({20, 6}, 31, DType::bf16);
  const Tensor indices = Tensor::from_vector<int64_t>({1, 1, 19, 0, 1}, {5});
  Tensor wg = w.to(cuda0()).requires_grad_();
  const Tensor y = embedding(indices.to(cuda0()), wg);
  check_equal_to(y, embedding(indices, w), "forward (rows copied as bytes)");
  const Tensor gy = randn_cpu({5, 6}, 32, DType::bf16);
  y.backward(gy.to(cuda0()));
  Tensor wc = w.to(DType::f32).requires_grad_();
  embedding(indices, wc).backward(gy.to(DType::f32));
  CHECK(wg.grad().dtype() == DType::bf16);
  // Accumulated in f32, rounded once.
  check_close_to(wg.grad(), wc.grad(), 1.0 / 128, 1e-3, "backward");
}

TEST_CASE("CUDA cat along every dim, forward and backward", "[gpu][cuda][misc]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  poison_device_memory();
  uint64_t seed = 41;
  for (int64_t dim : {0, 1, 2, -1}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    std::vector<Tensor> cpu, dev;
    for (int64_t size : {2, 0, 5, 1}) {
      Shape shape{3, 4, 6};
      shape[d] = size;
      const Tensor t = randn_cpu(shape, seed++);
      cpu.push_back(t.clone().requires_grad_());
      // Every other input non-contiguous (when it has elements).
      const bool strided = cpu.size() % 2 == 1 && size > 0;
      const Tensor on_device = strided ? strided_on_device(t, (d + 1) % 3) : t.to(cuda0());
      dev.push_back(on_device.detach().requires_grad_());
    }
    const Tensor yc = cat(cpu, dim), yg = cat(dev, dim);
    const std::string what = "dim " + std::to_string(dim);
    check_equal_to(yg, yc, what + " forward");
    const Tensor gy = randn_cpu(yc.shape(), seed++);
    yc.backward(gy);
    yg.backward(gy.to(cuda0()));
    for (size_t i = 0; i < cpu.size(); ++i)
      check_equal_to(dev[i].grad(), cpu[i].grad(), what + " grad " + std::to_string(i));
  }
  const Tensor a = randn_cpu({2, 3}, seed++);
  CHECK_THAT(error_of([&] { cat({a.to(cuda0()), a}, 0); }), Contains("cat: tensor 1 is on cpu"));
}

TEST_CASE("backward(gradient) refuses a gradient on another device than the output",
          "[gpu][cuda][misc]") {
  LOCKSTEP_SKIP_UNLESS_GPU();
  const Tensor w = Tensor::ones({3}, DType::f32, Device::cuda(0)).requires_grad_();
  const Tensor y = mul(w, w);
  CHECK_THAT(error_of([&] { y.backward(Tensor::ones({3})); }),
             Contains("the gradient is on cpu but the output on cuda:0"));
  y.backward(Tensor::ones({3}).to(Device::cuda(0)));
  CHECK(w.grad().to(Device::cpu()).to_vector<float>() == std::vector<float>{2, 2, 2});
}
