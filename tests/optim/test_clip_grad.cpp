// clip_grad_norm on its own: the gradient dtypes it reads.
#include <catch2/catch.hpp>

#include <cmath>

#include "lockstep/optim/clip_grad.h"

using namespace lockstep::optim;
using lockstep::runtime::DType;

TEST_CASE("clip_grad_norm reads bf16 and f16 gradients beside f32 ones", "[optim][clip]") {
  // The optimizers step bf16 and f16 parameters, so their gradients clip too.
  std::vector<Tensor> params;
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    Tensor p = Tensor::zeros({2}, dtype);
    p.requires_grad_();
    p.set_grad(Tensor::full({2}, 2.0, dtype));
    params.push_back(p);
  }
  // Six elements of 2: the L2 norm is sqrt(24), the largest |g| 2.
  CHECK(total_grad_norm(params, INFINITY) == 2.0);
  const double total = clip_grad_norm(params, 1.0);
  CHECK(total == Approx(std::sqrt(24.0)).epsilon(1e-12));
  for (const Tensor& p : params) {
    INFO(lockstep::runtime::dtype_name(p.dtype()));
    CHECK(p.grad().dtype() == p.dtype());
    for (float g : p.grad().to(DType::f32).to_vector<float>())
      CHECK(g == Approx(2.0 / std::sqrt(24.0)).epsilon(4e-3));
  }
}

TEST_CASE("clip_grad_norm refuses a NaN or negative max_norm without calling NaN negative",
          "[optim][clip]") {
  // A max_norm computed from a diverged value is NaN: no limit at all, and the error says so.
  Tensor p = Tensor::zeros({2});
  p.requires_grad_();
  p.set_grad(Tensor::full({2}, 3.0));
  using Catch::Contains;
  for (double max_norm : {std::nan(""), -1.0}) {
    INFO("max_norm " << max_norm);
    CHECK_THROWS_WITH(clip_grad_norm({p}, max_norm),
                      Contains("max_norm must be a number >= 0") && !Contains("negative"));
  }
  CHECK(p.grad().to_vector<float>() == std::vector<float>{3.0f, 3.0f});
}

TEST_CASE("clip_grad_value clamps every gradient in place, keeping NaN, as PyTorch's",
          "[optim][clip]") {
  const double inf = INFINITY;
  std::vector<Tensor> params;
  for (DType dtype : {DType::f32, DType::f64, DType::bf16}) {
    Tensor p = Tensor::zeros({6}, dtype);
    p.requires_grad_();
    p.set_grad(Tensor::from_vector<double>({-3, -0.5, 0.25, 2, inf, std::nan("")}, {6})
                   .to(dtype));
    params.push_back(p);
  }
  Tensor no_grad = Tensor::zeros({2});  // skipped
  params.push_back(no_grad);
  // A gradient that is a strided view is written through, not into a copy.
  Tensor base = Tensor::from_vector<float>({5, 0, -5, 0}, {2, 2});
  Tensor strided = Tensor::zeros({2});
  strided.requires_grad_();
  strided.set_grad(base.select(1, 0));
  params.push_back(strided);

  const Tensor grad_before = params[0].grad();
  clip_grad_value(params, 1.0);
  CHECK(params[0].grad().data_ptr<float>() == grad_before.data_ptr<float>());  // in place
  for (int i = 0; i < 3; ++i) {
    INFO(lockstep::runtime::dtype_name(params[i].dtype()));
    const auto g = params[i].grad().to(DType::f64).to_vector<double>();
    CHECK(g[0] == -1);
    CHECK(g[1] == -0.5);
    CHECK(g[2] == 0.25);
    CHECK(g[3] == 1);
    CHECK(g[4] == 1);
    CHECK(std::isnan(g[5]));
  }
  CHECK(!no_grad.grad().defined());
  const auto b = base.to_vector<float>();
  CHECK(b == std::vector<float>{1, 0, -1, 0});
}

TEST_CASE("clip_grad_value refuses a negative or NaN clip_value", "[optim][clip]") {
  Tensor p = Tensor::zeros({2});
  p.requires_grad_();
  p.set_grad(Tensor::full({2}, 3.0));
  for (double v : {-1.0, std::nan("")}) {
    INFO("clip_value " << v);
    CHECK_THROWS_WITH(clip_grad_value({p}, v), Catch::Contains("clip_value must be a number >= 0"));
  }
  CHECK(p.grad().to_vector<float>() == std::vector<float>{3, 3});
  clip_grad_value({p}, 0.0);  // 0 zeroes every gradient
  CHECK(p.grad().to_vector<float>() == std::vector<float>{0, 0});
}
