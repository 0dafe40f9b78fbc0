// SGD, Adam, AdamW, the LR schedules and gradient clipping against PyTorch's
// own numbers on the same inputs: tests/optim/reference/optim_reference.json,
// written once by make_reference.py with Debian's python3-torch (1.13, CPU).
//
// Tolerances: the optimizers follow PyTorch's f32 arithmetic op by op, but
// PyTorch's vectorised CPU kernels fuse some multiply-adds (add_ with alpha is
// an FMA there) where we round twice, so after 6 steps values differ by a few
// ulps: |ours - PyTorch's| <= 1e-6 * max(1, |value|) (parameters are ~N(0, 1);
// a wrong rule, e.g. a missing bias correction, is off by 1e-4 or more). Most
// values still match bit for bit; the test reports how many. Schedules are closed forms against
// PyTorch's chained forms: relative 1e-12. Clipping sums in double where
// PyTorch sums in f32: relative 1e-5 on the norm, 1e-6 on the gradients.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "lockstep/optim/adam.h"
#include "lockstep/optim/clip_grad.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/sgd.h"

using namespace lockstep::optim;
using json = nlohmann::json;
using lockstep::runtime::Shape;

namespace {

const json& reference() {
  static const json data = [] {
    const std::string path = std::string(LOCKSTEP_SOURCE_DIR) +
                             "/tests/optim/reference/optim_reference.json";
    std::ifstream in(path);
    REQUIRE(in.good());
    return json::parse(in);
  }();
  return data;
}

Tensor f32(const json& values, const json& shape) {
  const auto v = values.get<std::vector<float>>();
  return Tensor::from_vector(v, shape.get<Shape>());
}

GroupOptions options_of(const json& j) {
  GroupOptions out;
  for (const auto& [key, value] : j.items()) out[key] = value.get<double>();
  return out;
}

GroupOptions merged(GroupOptions base, const GroupOptions& over) {
  for (const auto& [key, value] : over) base[key] = value;
  return base;
}

std::unique_ptr<Optimizer> make(const std::string& kind, std::vector<ParamGroup> groups,
                                const GroupOptions& defaults) {
  if (kind == "sgd")
    return std::make_unique<SGD>(std::move(groups),
                                 SGDOptions::from_map(merged(SGDOptions{}.to_map(), defaults)));
  if (kind == "adam")
    return std::make_unique<Adam>(std::move(groups),
                                  AdamOptions::from_map(merged(AdamOptions{}.to_map(), defaults)));
  AdamWOptions w;
  static_cast<AdamOptions&>(w) = AdamOptions::from_map(merged(w.to_map(), defaults));
  return std::make_unique<AdamW>(std::move(groups), w);
}

// The difference in units of the value's magnitude, at least 1.
double scaled_error(double got, double want) {
  return std::abs(got - want) / std::max(std::abs(want), 1.0);
}

}  // namespace

TEST_CASE("Optimizers match PyTorch's step by step", "[optim][reference]") {
  for (const auto& c : reference()["optimizers"]) {
    const std::string name = c["name"];
    SECTION(name) {
      std::vector<Tensor> params;
      for (size_t i = 0; i < c["shapes"].size(); ++i) {
        params.push_back(f32(c["initial"][i], c["shapes"][i]));
        params.back().requires_grad_();
      }
      std::vector<ParamGroup> groups;
      if (c["groups"].empty()) {
        groups.push_back({params, {}});
      } else {
        for (size_t i = 0; i < params.size(); ++i)
          groups.push_back({{params[i]}, options_of(c["groups"][i])});
      }
      auto opt = make(c["optimizer"], std::move(groups), options_of(c["options"]));
      int64_t bitwise = 0, total = 0;
      double worst = 0;
      for (size_t step = 0; step < c["grads"].size(); ++step) {
        for (size_t i = 0; i < params.size(); ++i)
          params[i].set_grad(f32(c["grads"][step][i], c["shapes"][i]));
        opt->step();
        for (size_t i = 0; i < params.size(); ++i) {
          const auto got = params[i].to_vector<float>();
          const auto want = c["after"][step][i].get<std::vector<float>>();
          REQUIRE(got.size() == want.size());
          for (size_t k = 0; k < got.size(); ++k) {
            bitwise += got[k] == want[k];
            ++total;
            worst = std::max(worst, scaled_error(got[k], want[k]));
          }
        }
      }
      INFO(name << ": " << bitwise << " of " << total << " values bitwise equal, worst scaled "
                << "error " << worst);
      CHECK(worst <= 1e-6);
      CHECK(bitwise * 2 >= total);  // most values agree to the bit
    }
  }
}

TEST_CASE("LR schedules match PyTorch's", "[optim][reference][lr_scheduler]") {
  for (const auto& c : reference()["schedules"]) {
    const std::string name = c["name"];
    SECTION(name) {
      Tensor p = Tensor::zeros({1});
      p.requires_grad_();
      std::unique_ptr<Optimizer> opt;
      if (c["optimizer"] == "sgd")
        opt = std::make_unique<SGD>(std::vector<Tensor>{p}, SGDOptions{.lr = 0.1, .momentum = 0.9});
      else
        opt = std::make_unique<Adam>(std::vector<Tensor>{p}, AdamOptions{.lr = 0.1});
      std::unique_ptr<LRScheduler> sched;
      if (name == "step") sched = std::make_unique<StepLR>(*opt, StepLROptions{3, 0.5});
      if (name == "multistep")
        sched = std::make_unique<MultiStepLR>(*opt, MultiStepLROptions{{2, 5, 9}, 0.1});
      if (name == "cosine") sched = std::make_unique<CosineLR>(*opt, CosineLROptions{10, 0.001});
      if (name == "linear") sched = std::make_unique<LinearLR>(*opt, LinearLROptions{0.25, 1.0, 4});
      if (name == "warmup cosine")
        sched = std::make_unique<WarmupCosineLR>(
            *opt, WarmupCosineLROptions{.warmup_steps = 3, .total_steps = 12, .start_factor = 0.1});
      if (name == "onecycle sgd")
        sched = std::make_unique<OneCycleLR>(
            *opt, OneCycleLROptions{.max_lr = 0.5, .total_steps = 12, .pct_start = 0.3});
      if (name == "onecycle adam linear")
        sched = std::make_unique<OneCycleLR>(
            *opt, OneCycleLROptions{
                      .max_lr = 0.5, .total_steps = 12, .pct_start = 0.4, .cosine = false});
      REQUIRE(sched);
      const auto lrs = c["lr"].get<std::vector<double>>();
      const auto momenta = c["momentum"].get<std::vector<double>>();
      const std::string key = c["optimizer"] == "sgd" ? "momentum" : "beta1";
      for (size_t step = 0; step < lrs.size(); ++step) {
        INFO(name << " step " << step);
        CHECK(opt->param_groups()[0].options.at("lr") == Approx(lrs[step]).epsilon(1e-12).margin(1e-15));
        if (!momenta.empty())
          CHECK(opt->param_groups()[0].options.at(key) == Approx(momenta[step]).epsilon(1e-12));
        p.set_grad(Tensor::zeros({1}));
        opt->step();
        sched->step();
      }
    }
  }
}

TEST_CASE("Gradient clipping matches PyTorch's clip_grad_norm_", "[optim][reference][clip]") {
  for (const auto& c : reference()["clip"]) {
    SECTION(c["name"].get<std::string>()) {
      std::vector<Tensor> params;
      for (size_t i = 0; i < c["shapes"].size(); ++i) {
        params.push_back(Tensor::zeros(c["shapes"][i].get<Shape>()));
        params.back().requires_grad_();
        params.back().set_grad(f32(c["grads"][i], c["shapes"][i]));
      }
      const double norm_type = c["norm_type"].is_string() ? INFINITY : c["norm_type"].get<double>();
      const double total = clip_grad_norm(params, c["max_norm"].get<double>(), norm_type);
      CHECK(total == Approx(c["total_norm"].get<double>()).epsilon(1e-5));
      for (size_t i = 0; i < params.size(); ++i) {
        const auto got = params[i].grad().to_vector<float>();
        const auto want = c["clipped"][i].get<std::vector<float>>();
        for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == Approx(want[k]).epsilon(1e-6));
      }
    }
  }
}
