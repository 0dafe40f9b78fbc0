// Adam and AdamW beyond PyTorch's numbers (test_torch_reference.cpp): the
// state under PyTorch's names, state_dict round trips that continue the same
// run, skipped parameters, f64, and option checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "lockstep/optim/adam.h"
#include "lockstep/runtime/autograd/rebind.h"
#include "lockstep/runtime/random.h"
#include "support/test_util.h"

using namespace lockstep::optim;
using lockstep::runtime::DType;
using lockstep::testing::bitwise_equal;
using lockstep::testing::error_of;
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

TEST_CASE("Adam refuses a step it cannot finish before changing anything", "[optim][adam]") {
  Tensor a = param(), b = param();
  Adam opt({a, b}, {.lr = 0.1});
  set_grad(a, 1.0);
  set_grad(b, 1.0);
  opt.step();
  const auto a_before = a.to_vector<double>();
  const Tensor m_before = opt.state_dict().state.at(0).at("exp_avg").clone();

  // Module::to(f64) after a step: the parameter changes dtype, its moments not.
  lockstep::runtime::rebind(b, b.detach().to(DType::f64));
  set_grad(a, 1.0);
  set_grad(b, 1.0);
  CHECK_THAT(error_of([&] { opt.step(); }),
             Contains("Adam.step: the state \"exp_avg\" of parameter 1 of group 0 is f32"));
  CHECK(a.to_vector<double>() == a_before);
  const OptimizerState after = opt.state_dict();
  CHECK(after.state.at(0).at("step").item() == 1);  // no count of a step not taken
  CHECK(bitwise_equal(after.state.at(0).at("exp_avg"), m_before));

  opt.load_state_dict(opt.state_dict());  // converts the moments to the parameters
  opt.step();
  CHECK(opt.state_dict().state.at(1).at("exp_avg").dtype() == DType::f64);
  CHECK(opt.state_dict().state.at(1).at("step").item() == 2);
}

TEST_CASE("Adam steps bf16 and f16 parameters on the CPU in f32, rounding once", "[optim][adam]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (bool decoupled : {false, true}) {
      INFO(lockstep::runtime::dtype_name(dtype) << (decoupled ? " AdamW" : " Adam"));
      const AdamOptions o{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true};
      AdamWOptions w;
      w.lr = 0.01;
      w.amsgrad = true;
      Tensor low = Tensor::from_vector(std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f}, {4}).to(dtype);
      low.requires_grad_();
      // The twin holds the same values in f32 and takes the same steps: its
      // results, rounded, are the low-precision run's bit for bit.
      Tensor twin = low.detach().to(DType::f32);
      twin.requires_grad_();
      std::unique_ptr<Optimizer> opt_low, opt_twin;
      if (decoupled) {
        opt_low = std::make_unique<AdamW>(std::vector<Tensor>{low}, w);
        opt_twin = std::make_unique<AdamW>(std::vector<Tensor>{twin}, w);
      } else {
        opt_low = std::make_unique<Adam>(std::vector<Tensor>{low}, o);
        opt_twin = std::make_unique<Adam>(std::vector<Tensor>{twin}, o);
      }
      for (int i = 0; i < 4; ++i) {
        const float s = i % 2 == 0 ? 1.0f : -0.25f;
        Tensor g = Tensor::from_vector(std::vector<float>{0.3f * s, -0.7f, 1.1f * s, 0.01f}, {4})
                       .to(dtype);
        low.set_grad(g);
        twin.set_grad(g.to(DType::f32));
        opt_low->step();
        opt_twin->step();
        CHECK(bitwise_equal(low, twin.detach().to(dtype)));
        const OptimizerState sd_low = opt_low->state_dict(), sd_twin = opt_twin->state_dict();
        const auto& st_low = sd_low.state.at(0);
        const auto& st_twin = sd_twin.state.at(0);
        for (const char* key : {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}) {
          CHECK(st_low.at(key).dtype() == dtype);
          CHECK(bitwise_equal(st_low.at(key), st_twin.at(key).to(dtype)));
        }
        // The twin goes on from the rounded values the low run holds.
        twin.detach().copy_(low.detach().to(DType::f32));
        opt_twin->load_state_dict(opt_low->state_dict());
      }
    }
  }
}

TEST_CASE("Adam's amsgrad maximum keeps a NaN, as torch.maximum", "[optim][adam]") {
  Tensor p = Tensor::ones({2});
  p.requires_grad_();
  Adam opt({p}, {.lr = 0.1, .amsgrad = true});
  p.set_grad(Tensor::ones({2}));
  opt.step();
  p.set_grad(Tensor::from_vector(std::vector<float>{NAN, 1.0f}, {2}));
  opt.step();
  const auto vmax = opt.state_dict().state.at(0).at("max_exp_avg_sq").to_vector<float>();
  CHECK(std::isnan(vmax[0]));
  CHECK_FALSE(std::isnan(vmax[1]));
  CHECK(std::isnan(p.to_vector<float>()[0]));
}

TEST_CASE("Adam load_state_dict refuses an incomplete state or another optimizer's",
          "[optim][adam]") {
  Tensor a = param();
  Adam opt({a}, {.lr = 0.01});
  for (int i = 0; i < 5; ++i) {
    set_grad(a, 0.5);
    opt.step();
  }
  const OptimizerState full = opt.state_dict();

  // Without its "step", the moments of 5 steps would be bias-corrected as if
  // at step 1 (a step ten times too large), where PyTorch fails on the key.
  for (const char* key : {"step", "exp_avg", "exp_avg_sq"}) {
    OptimizerState partial = full;
    partial.state[0].erase(key);
    Tensor b = param();
    Adam victim({b}, {.lr = 0.01});
    CHECK_THAT(error_of([&] { victim.load_state_dict(partial); }),
               Contains(fmt::format("Adam.load_state_dict: the state of parameter 0 has no "
                                    "\"{}\"",
                                    key)));
    CHECK(victim.state_dict().state.empty());  // nothing changed
  }

  // An SGD's momentum buffer, loaded without its options.
  OptimizerState foreign = full;
  foreign.state[0] = {{"momentum_buffer", Tensor::zeros(a.shape(), a.dtype())}};
  foreign.param_groups[0].options.clear();
  Tensor c = param();
  AdamW adamw({c});
  CHECK_THAT(error_of([&] { adamw.load_state_dict(foreign); }),
             Contains("AdamW.load_state_dict: state \"momentum_buffer\" of parameter 0 is not "
                      "AdamW state"));

  // A state saved before its amsgrad was turned on has no "max_exp_avg_sq":
  // the first amsgrad step makes it, as for a fresh parameter.
  Tensor d = param();
  Adam ams({d}, {.lr = 0.01, .amsgrad = true});
  ams.load_state_dict(full);
  set_grad(d, 0.5);
  ams.step();
  CHECK(ams.state_dict().state.at(0).at("step").item() == 6);
}

TEST_CASE("An Adam state_dict kept in memory follows the optimizer, count and moments alike",
          "[optim][adam]") {
  // optimizer.h: the state tensors are the optimizer's own. The count is
  // advanced in place like the moments (PyTorch's step is a tensor it adds
  // to), so a snapshot not cloned never pairs one step's moments with
  // another's count.
  Tensor a = param();
  Adam opt({a}, {.lr = 0.01});
  for (int i = 0; i < 3; ++i) {
    set_grad(a, 0.3 * (i + 1));
    opt.step();
  }
  const OptimizerState snapshot = opt.state_dict();
  set_grad(a, -0.4);
  opt.step();
  const auto& st = snapshot.state.at(0);
  CHECK(st.at("step").item() == 4);
  CHECK(st.at("exp_avg").is_same(opt.state_dict().state.at(0).at("exp_avg")));
  CHECK(st.at("step").is_same(opt.state_dict().state.at(0).at("step")));

  // Loaded, the snapshot continues the run exactly.
  Tensor b = a.detach().clone();
  b.requires_grad_();
  Adam resumed({b}, {.lr = 0.01});
  resumed.load_state_dict(snapshot);
  for (int i = 0; i < 3; ++i) {
    set_grad(a, 0.2 * i - 0.1);
    set_grad(b, 0.2 * i - 0.1);
    opt.step();
    resumed.step();
  }
  CHECK(a.to_vector<float>() == b.to_vector<float>());
}

TEST_CASE("Adam load_state_dict refuses a step count that is not a whole number >= 0",
          "[optim][adam]") {
  Tensor a = param();
  Adam opt({a}, {.lr = 0.01});
  set_grad(a, 0.5);
  opt.step();
  const OptimizerState full = opt.state_dict();
  for (double bad : {-1.0, 2.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    INFO("step " << bad);
    OptimizerState damaged = full;
    damaged.state[0]["step"] = Tensor::scalar(bad);
    Tensor b = param();
    Adam victim({b}, {.lr = 0.01});
    CHECK_THAT(error_of([&] { victim.load_state_dict(damaged); }),
               Contains("Adam.load_state_dict: state \"step\" of parameter 0 is") &&
                   Contains("a count of steps taken is a whole number >= 0"));
    CHECK(victim.state_dict().state.empty());  // nothing changed
  }
}
