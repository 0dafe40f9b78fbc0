// Adam and AdamW beyond PyTorch's numbers (test_torch_reference.cpp): the
// state under PyTorch's names, state_dict round trips that continue the same
// run, skipped parameters, f64, and option checks.
#include <catch2/catch.hpp>

#include "lockstep/optim/adam.h"
#include "lockstep/runtime/random.h"

using namespace lockstep::optim;
using lockstep::runtime::DType;
using Catch::Contains;

namespace {

Tensor param(DType dtype = DType::f32) {
  Tensor p = lockstep::runtime::randn({3, 2}, dtype);
  p.requires_grad_();
  return p;
}

void set_grad(Tensor& p, double value) { p.set_grad(Tensor::full(p.shape(), value, p.dtype())); }

}  // namespace

TEST_CASE("Adam keeps PyTorch's state names and step count", "[optim][adam]") {
  Tensor p = param();
  Adam opt({p}, {.lr = 0.01, .amsgrad = true});
  for (int i = 0; i < 3; ++i) {
    set_grad(p, 0.5);
    opt.step();
  }
  const OptimizerState s = opt.state_dict();
  REQUIRE(s.state.size() == 1);
  const auto& st = s.state.at(0);
  CHECK(st.at("step").item() == 3);
  CHECK(st.at("step").dim() == 0);
  CHECK(st.at("exp_avg").shape() == p.shape());
  CHECK(st.at("exp_avg_sq").shape() == p.shape());
  CHECK(st.at("max_exp_avg_sq").shape() == p.shape());
}

TEST_CASE("An Adam restored from state_dict continues the same run", "[optim][adam]") {
  for (bool decoupled : {false, true}) {
    Tensor a = param(), b = a.detach().clone();
    b.requires_grad_();
    std::unique_ptr<Optimizer> oa, ob;
    if (decoupled) {
      oa = std::make_unique<AdamW>(std::vector<Tensor>{a});
      ob = std::make_unique<AdamW>(std::vector<Tensor>{b});
    } else {
      oa = std::make_unique<Adam>(std::vector<Tensor>{a}, AdamOptions{.weight_decay = 0.1});
      ob = std::make_unique<Adam>(std::vector<Tensor>{b}, AdamOptions{.weight_decay = 0.1});
    }
    for (int i = 0; i < 4; ++i) {
      set_grad(a, 0.1 * (i + 1));
      oa->step();
    }
    b.detach().copy_(a.detach());
    ob->load_state_dict(oa->state_dict());
    for (int i = 0; i < 3; ++i) {
      set_grad(a, -0.2 * i);
      set_grad(b, -0.2 * i);
      oa->step();
      ob->step();
    }
    CHECK(a.to_vector<float>() == b.to_vector<float>());
  }
}

TEST_CASE("Adam skips parameters without a gradient and works in f64", "[optim][adam]") {
  Tensor p = param(DType::f64), q = param(DType::f64);
  const auto p_before = p.to_vector<double>(), q_before = q.to_vector<double>();
  AdamW opt({p, q}, {});  // lr 1e-3, weight_decay 1e-2
  set_grad(p, 1.0);
  opt.step();
  CHECK(q.to_vector<double>() == q_before);
  CHECK(opt.state_dict().state.size() == 1);
  // Step 1 with g = 1: m = 0.1, v = 0.001, both bias-corrected to 1, so the
  // update is lr / (1 + eps), after AdamW's decay p * (1 - lr * wd).
  const auto after = p.to_vector<double>();
  for (size_t i = 0; i < after.size(); ++i)
    CHECK(after[i] == Approx(p_before[i] * (1 - 1e-3 * 1e-2) - 1e-3 / (1 + 1e-8)).epsilon(1e-12));
}

TEST_CASE("Adam checks every group before stepping any", "[optim][adam]") {
  Tensor a = param(), b = param();
  const std::vector<double> before = a.to_vector<double>();
  Adam opt(std::vector<ParamGroup>{{{a}, {}}, {{b}, {}}}, {.lr = 0.1});
  opt.param_groups()[1].options["beta1"] = 1.5;  // the second group is invalid
  set_grad(a, 1.0);
  set_grad(b, 1.0);
  CHECK_THROWS_WITH(opt.step(), Contains("invalid beta1 1.5"));
  CHECK(a.to_vector<double>() == before);  // the first group was not stepped
  CHECK(opt.state_dict().state.empty());   // nor did its step count move
}

TEST_CASE("Adam rejects invalid options", "[optim][adam]") {
  Tensor p = param();
  CHECK_THROWS_WITH(Adam({p}, {.lr = -1}), Contains("invalid learning rate -1"));
  CHECK_THROWS_WITH(Adam({p}, {.beta1 = 1.0}), Contains("invalid beta1 1"));
  CHECK_THROWS_WITH(AdamW({p}, [] { AdamWOptions o; o.beta2 = -0.1; return o; }()),
                    Contains("AdamW: invalid beta2"));
  CHECK_THROWS_WITH(Adam({p}, {.eps = -1e-8}), Contains("invalid eps"));
  Adam opt({p}, {});
  opt.param_groups()[0].options["lr"] = std::nan("");
  set_grad(p, 1.0);
  CHECK_THROWS_WITH(opt.step(), Contains("invalid learning rate nan"));
}
