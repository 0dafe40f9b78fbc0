// GradScaler in one process: scale() is differentiable, unscale_ and step
// skip an overflowed step without touching parameters or optimizer state,
// the scale follows PyTorch's torch.amp.GradScaler for a scripted sequence,
// misuse is refused with PyTorch's messages, and the state (alone or in a
// training checkpoint) resumes a run exactly.
#include <catch2/catch.hpp>

#include <limits>
#include <memory>
#include <tuple>
#include <vector>

#include "lockstep/nn/linear.h"
#include "lockstep/optim/adam.h"
#include "lockstep/optim/clip_grad.h"
#include "lockstep/optim/grad_scaler.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "lockstep/train/training_checkpoint.h"
#include "support/test_util.h"

using namespace lockstep;
using namespace lockstep::optim;
using namespace lockstep::train;
using namespace lockstep::testing;
using runtime::DType;
using Catch::Contains;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor param(std::vector<double> v) {
  const auto n = static_cast<int64_t>(v.size());
  Tensor p = Tensor::from_vector(v, {n}).to(DType::f32);
  p.requires_grad_();
  return p;
}

// Backward of scale(sum(p * x)): p's gradient is x * scale.
void scaled_backward(GradScaler& scaler, const Tensor& p, std::vector<double> x) {
  const Tensor xs = Tensor::from_vector(x, {static_cast<int64_t>(x.size())}).to(DType::f32);
  scaler.scale(runtime::sum(p * xs)).backward();
}

// One iteration of a Linear(3, 2) on data of `step`; all inputs inf when
// `overflow`. Returns whether the optimizer stepped.
bool train_step(nn::Module& model, Optimizer& opt, GradScaler& scaler, int step, bool overflow) {
  runtime::Generator g(100 + static_cast<uint64_t>(step));
  Tensor x = runtime::randn({4, 3}, DType::f32, g);
  if (overflow) x = x + Tensor::full({4, 3}, kInf);
  opt.zero_grad();
  scaler.scale(runtime::mean(model.forward(x) * model.forward(x))).backward();
  const bool stepped = scaler.step(opt);
  scaler.update();
  return stepped;
}

}  // namespace

TEST_CASE("GradScaler::scale multiplies the loss by the scale, differentiably",
          "[optim][grad_scaler]") {
  GradScaler scaler;
  CHECK(scaler.get_scale() == 65536.0);
  Tensor p = param({1, 2, 3});
  Tensor loss = runtime::sum(p * p);
  Tensor scaled = scaler.scale(loss);
  CHECK(scaled.item() == 14.0 * 65536.0);
  CHECK(scaled.dtype() == DType::f32);
  CHECK(scaled.dim() == 0);  // a 0-dim loss stays 0-dim, as in PyTorch (it was [1])
  CHECK(scaler.scale(runtime::sum(p.to(DType::f64))).shape() == runtime::Shape{});
  scaled.backward();
  CHECK(values(p.grad()) == std::vector<double>{2 * 65536.0, 4 * 65536.0, 6 * 65536.0});
}

TEST_CASE("GradScaler::unscale_ divides the gradients before clipping; step uses them",
          "[optim][grad_scaler]") {
  Tensor p = param({1, 1});
  SGD opt({p}, {.lr = 0.5});
  GradScaler scaler({.init_scale = 1024});
  scaled_backward(scaler, p, {3, 4});
  scaler.unscale_(opt);
  CHECK(values(p.grad()) == std::vector<double>{3, 4});
  CHECK(clip_grad_norm({p}, 1.0) == Approx(5.0));
  CHECK(scaler.step(opt));  // no second unscale
  scaler.update();
  check_close(p, {1 - 0.5 * 0.6, 1 - 0.5 * 0.8}, 1e-6);
}

TEST_CASE("GradScaler follows PyTorch's scale for a scripted sequence of overflows",
          "[optim][grad_scaler]") {
  // torch.amp.GradScaler(init_scale=4, growth_factor=2, backoff_factor=0.5,
  // growth_interval=3) over the same sequence gives these scales and trackers.
  Tensor p = param({1});
  SGD opt({p}, {.lr = 0.1});
  GradScaler scaler({.init_scale = 4, .growth_interval = 3});
  const std::vector<bool> overflow = {false, false, false, true, false, false, true, false, false, false};
  const std::vector<double> scales = {4, 4, 8, 4, 4, 4, 2, 2, 2, 4};
  const std::vector<int64_t> trackers = {1, 2, 0, 0, 1, 2, 0, 1, 2, 0};
  for (size_t i = 0; i < overflow.size(); ++i) {
    INFO("iteration " << i);
    opt.zero_grad();
    scaled_backward(scaler, p, {overflow[i] ? kInf : 1.0});
    CHECK(scaler.step(opt) == !overflow[i]);
    scaler.update();
    CHECK(scaler.get_scale() == scales[i]);
    CHECK(scaler.get_growth_tracker() == trackers[i]);
  }
  scaler.update(1.0);  // a scale of the program's choosing; the tracker is kept
  CHECK(scaler.get_scale() == 1.0);
  CHECK(scaler.get_growth_tracker() == 0);
}

TEST_CASE("GradScaler's defaults: halve on overflow, double after 2000 clean steps",
          "[optim][grad_scaler]") {
  Tensor p = param({1});
  SGD opt({p}, {.lr = 0.0});
  GradScaler scaler;
  scaled_backward(scaler, p, {std::numeric_limits<double>::quiet_NaN()});
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 32768.0);
  for (int i = 0; i < 2000; ++i) {
    opt.zero_grad();
    scaled_backward(scaler, p, {1.0});
    REQUIRE(scaler.step(opt));
    scaler.update();
    if (i == 1998) CHECK(scaler.get_scale() == 32768.0);
  }
  CHECK(scaler.get_scale() == 65536.0);
  CHECK(scaler.get_growth_tracker() == 0);
}

TEST_CASE("A skipped step leaves the parameters and the optimizer state untouched",
          "[optim][grad_scaler]") {
  Tensor a = param({1, -2, 3});
  Tensor b = param({0.5});
  Adam opt({a, b}, {.lr = 0.1});
  GradScaler scaler;
  opt.zero_grad();
  scaler.scale(runtime::sum(a * a) + runtime::sum(b)).backward();
  REQUIRE(scaler.step(opt));
  scaler.update();
  const Tensor a0 = a.detach().clone(), b0 = b.detach().clone();
  std::vector<Tensor> state0;
  for (const auto& [index, entries] : opt.state_dict().state)
    for (const auto& [key, t] : entries) state0.push_back(t.clone());
  REQUIRE(state0.size() == 6);  // step, exp_avg, exp_avg_sq for each

  opt.zero_grad();
  scaler.scale(runtime::sum(a * a) + runtime::sum(b * kInf)).backward();
  CHECK_FALSE(scaler.step(opt));
  scaler.update();
  CHECK(bitwise_equal(a.detach(), a0));
  CHECK(bitwise_equal(b.detach(), b0));
  size_t i = 0;
  for (const auto& [index, entries] : opt.state_dict().state)
    for (const auto& [key, t] : entries) {
      INFO("state " << index << "." << key);
      CHECK(bitwise_equal(t, state0[i++]));
    }
  CHECK(scaler.get_scale() == 32768.0);
}

TEST_CASE("GradScaler refuses misuse as PyTorch does", "[optim][grad_scaler]") {
  Tensor p = param({1});
  SGD opt({p});
  GradScaler scaler;
  CHECK_THROWS_WITH(scaler.unscale_(opt), Contains("call scale(loss)"));
  CHECK_THROWS_WITH(scaler.update(), Contains("no scale yet"));
  CHECK_THROWS_WITH(scaler.step(opt), Contains("GradScaler::step: there is no scale yet"));
  scaled_backward(scaler, p, {1});
  CHECK_THROWS_WITH(scaler.update(), Contains("no inf checks were recorded"));
  scaler.unscale_(opt);
  CHECK_THROWS_WITH(scaler.unscale_(opt),
                    Contains("unscale_() has already been called on this optimizer since the "
                             "last update()"));
  scaler.step(opt);
  CHECK_THROWS_WITH(scaler.unscale_(opt), Contains("after step()"));
  CHECK_THROWS_WITH(scaler.step(opt), Contains("step() has already been called"));
  scaler.update();
  // A new iteration may unscale again.
  opt.zero_grad();
  scaled_backward(scaler, p, {1});
  CHECK_NOTHROW(scaler.unscale_(opt));

  Tensor h = Tensor::ones({1}, DType::f16).requires_grad_();  // f16 weights: f16 gradients
  h.set_grad(Tensor::ones({1}, DType::f16));
  SGD half_opt({h});
  CHECK_THROWS_WITH(scaler.unscale_(half_opt), Contains("f16 gradients"));
  CHECK_THROWS_WITH(GradScaler({.growth_factor = 1.0}), Contains("growth_factor"));
  CHECK_THROWS_WITH(GradScaler({.backoff_factor = 1.0}), Contains("backoff_factor"));
  CHECK_THROWS_WITH(GradScaler({.growth_interval = 0}), Contains("growth_interval"));
}

TEST_CASE("An iteration that an error ends after unscale_ leaves the next one unscaled and "
          "stepped as if it had not run",
          "[optim][grad_scaler]") {
  // The PyTorch user's "catch the error, zero_grad, go on": the error came
  // from optimizer.step() inside scaler.step() (here: a learning rate a
  // scheduler made negative), or from clipping after unscale_. The next
  // step() took that iteration's flags and stepped the new, still scaled
  // gradients (65536 times too large), and the next unscale_ was refused as
  // a second one; PyTorch does both.
  for (const bool error_in_step : {true, false}) {
    auto run = [&](bool with_error) {
      runtime::Generator g(7);
      nn::Linear model(3, 2, true, g);
      SGD opt(model.parameters(), {.lr = 0.1});
      GradScaler scaler;
      if (with_error) {
        opt.zero_grad();
        scaler.scale(runtime::sum(model.forward(Tensor::ones({4, 3})))).backward();
        const std::string error = error_of([&] {
          if (error_in_step) {
            opt.param_groups()[0].options["lr"] = -1.0;
            scaler.step(opt);
          } else {
            scaler.unscale_(opt);
            throw Error("clipping failed");
          }
        });
        REQUIRE(!error.empty());
        opt.param_groups()[0].options["lr"] = 0.1;
      }
      train_step(model, opt, scaler, 1, false);
      std::vector<Tensor> out;
      for (const Tensor& p : model.parameters()) out.push_back(p.detach().clone());
      out.push_back(Tensor::scalar(scaler.get_scale(), DType::f64));
      return out;
    };
    const auto expected = run(false);
    const auto got = run(true);
    INFO("error in step() " << error_in_step);
    REQUIRE(got.size() == expected.size());
    for (size_t i = 0; i < got.size(); ++i)
      CHECK(got[i].to_vector<double>() == expected[i].to_vector<double>());
  }
  // A loss scaled after unscale_ for another optimizer's parameters leaves
  // the first one's unscaled gradients as they are (PyTorch's GAN loops).
  Tensor p = param({1}), q = param({1});
  SGD opt_p({p}, {.lr = 1.0}), opt_q({q}, {.lr = 1.0});
  GradScaler scaler;
  scaled_backward(scaler, p, {1});
  scaler.unscale_(opt_p);
  scaled_backward(scaler, q, {2});
  scaler.step(opt_p);
  scaler.step(opt_q);
  scaler.update();
  CHECK(p.to_vector<double>() == std::vector<double>{0});
  CHECK(q.to_vector<double>() == std::vector<double>{-1});
}

TEST_CASE("An iteration that an error ends after unscale_ is forgotten when zero_grad zeroes "
          "the gradients in place",
          "[optim][grad_scaler]") {
  // zero_grad(set_to_none=false) keeps each .grad tensor, zeroed: the next
  // step() took the failed iteration's flags and stepped the new gradients
  // still multiplied by the scale.
  auto run = [](bool with_error) {
    runtime::Generator g(7);
    nn::Linear model(3, 2, true, g);
    SGD opt(model.parameters(), {.lr = 0.1});
    GradScaler scaler;
    auto iteration = [&](bool fail) {
      opt.zero_grad(/*set_to_none=*/false);
      scaler.scale(runtime::sum(model.forward(Tensor::ones({4, 3})))).backward();
      scaler.unscale_(opt);
      if (fail) throw Error("clipping failed");
      scaler.step(opt);
      scaler.update();
    };
    if (with_error) CHECK_THROWS_WITH(iteration(true), Contains("clipping failed"));
    iteration(false);
    std::vector<double> out;
    for (const Tensor& p : model.parameters())
      for (double v : p.to_vector<double>()) out.push_back(v);
    out.push_back(scaler.get_scale());
    return out;
  };
  CHECK(run(true) == run(false));
}

TEST_CASE("GradScaler refuses a scale its f32 tensor would hold as an infinity",
          "[optim][grad_scaler]") {
  // 1e39 is a finite double but an f32 infinity: every scaled gradient was
  // inf, so every step was skipped and the scale, inf * 0.5, never came down.
  CHECK_THROWS_WITH(GradScaler({.init_scale = 1e39}),
                    Contains("GradScaler: the scale must be > 0 and finite in f32"));
  Tensor p = param({1});
  GradScaler scaler;
  CHECK_THROWS_WITH(scaler.update(1e39), Contains("GradScaler::update") && Contains("1e+39"));
  scaled_backward(scaler, p, {1});
  CHECK_THROWS_WITH(scaler.update(-1), Contains("GradScaler::update"));
  GradScalerState state = scaler.state_dict();
  state["scale"] = 4e38;
  CHECK_THROWS_WITH(scaler.load_state_dict(state), Contains("finite in f32"));
  // The largest f32 is a valid scale.
  scaler.update(std::numeric_limits<float>::max());
  CHECK(scaler.get_scale() == std::numeric_limits<float>::max());
}

TEST_CASE("GradScaler::unscale_ refuses an expanded gradient before dividing any",
          "[optim][grad_scaler]") {
  // An expanded gradient holds one value for every element: dividing each
  // element in place would divide that value once per element.
  Tensor a = param({1, 1}), b = param({1, 1, 1, 1});
  a.set_grad(Tensor::full({2}, 4.0));
  b.set_grad(Tensor::full({1}, 4.0).expand({4}));
  SGD opt({a, b});
  GradScaler scaler({.init_scale = 2.0});
  (void)scaler.scale(Tensor::scalar(1.0));
  CHECK_THROWS_WITH(scaler.unscale_(opt), Contains("several elements at one memory location"));
  CHECK(a.grad().to_vector<float>() == std::vector<float>{4, 4});
  CHECK(b.grad().to_vector<float>() == std::vector<float>{4, 4, 4, 4});
}

TEST_CASE("GradScaler refuses to step or update for an optimizer with no gradient, as PyTorch",
          "[optim][grad_scaler]") {
  // zero_grad() between backward and step (or no backward at all) leaves
  // nothing to step: PyTorch's "No inf checks were recorded", not a silent
  // no-op step that counts as a clean iteration and grows the scale.
  Tensor p = param({1, 2});
  SGD opt({p}, {.lr = 0.5});
  GradScaler scaler({.init_scale = 1024, .growth_interval = 1});
  scaled_backward(scaler, p, {1, 1});
  opt.zero_grad();
  CHECK_THROWS_WITH(scaler.step(opt),
                    Contains("No inf checks were recorded for this optimizer") &&
                        Contains("none of its parameters has a gradient"));
  CHECK_THROWS_WITH(scaler.update(), Contains("no inf checks were recorded prior to update()"));
  CHECK(scaler.get_scale() == 1024.0);
  CHECK(scaler.get_growth_tracker() == 0);
  // The same after an explicit unscale_, which alone does not refuse.
  scaler.update(1024.0);
  CHECK_NOTHROW(scaler.unscale_(opt));
  CHECK_THROWS_WITH(scaler.update(), Contains("no inf checks were recorded prior to update()"));
  CHECK(scaler.get_scale() == 1024.0);
  // With a gradient the iteration goes on as usual.
  scaler.update(1024.0);
  scaled_backward(scaler, p, {1, 1});
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK(scaler.get_scale() == 2048.0);
}

TEST_CASE("A disabled GradScaler passes every call through", "[optim][grad_scaler]") {
  Tensor p = param({1});
  SGD opt({p}, {.lr = 1.0});
  GradScaler scaler({.enabled = false});
  Tensor loss = runtime::sum(p * p);
  CHECK(scaler.scale(loss).is_same(loss));
  loss.backward();
  scaler.unscale_(opt);
  CHECK(values(p.grad()) == std::vector<double>{2});
  CHECK(scaler.step(opt));
  scaler.update();
  CHECK(values(p) == std::vector<double>{-1});
  CHECK(scaler.get_scale() == 1.0);
  CHECK(scaler.state_dict().empty());
}

TEST_CASE("GradScaler's state_dict round trip continues exactly", "[optim][grad_scaler]") {
  const auto overflow_at = [](int i) { return i % 4 == 1; };
  Tensor pa = param({1}), pb = param({1});
  SGD oa({pa}, {.lr = 0.0}), ob({pb}, {.lr = 0.0});
  GradScaler a({.init_scale = 256, .growth_factor = 4, .backoff_factor = 0.25, .growth_interval = 2});
  for (int i = 0; i < 5; ++i) {
    oa.zero_grad();
    scaled_backward(a, pa, {overflow_at(i) ? kInf : 1.0});
    a.step(oa);
    a.update();
  }
  const GradScalerState saved = a.state_dict();
  CHECK(saved.at("scale") == a.get_scale());
  CHECK(saved.at("_growth_tracker") == 1);
  CHECK(saved.at("growth_interval") == 2);

  GradScaler b;  // other settings until loaded; loaded before its first scale()
  b.load_state_dict(saved);
  CHECK(b.get_scale() == a.get_scale());
  for (int i = 5; i < 12; ++i) {
    INFO("iteration " << i);
    for (auto [s, o, p] : {std::tuple{&a, &oa, pa}, std::tuple{&b, &ob, pb}}) {
      o->zero_grad();
      scaled_backward(*s, p, {overflow_at(i) ? kInf : 1.0});
      s->step(*o);
      s->update();
    }
    CHECK(b.get_scale() == a.get_scale());
    CHECK(b.get_growth_tracker() == a.get_growth_tracker());
  }
  CHECK(b.state_dict() == a.state_dict());
  GradScalerState broken = saved;
  broken.erase("scale");
  CHECK_THROWS_WITH(b.load_state_dict(broken), Contains("\"scale\""));
  CHECK_THROWS_WITH(b.load_state_dict({}), Contains("disabled"));
}

TEST_CASE("A training checkpoint keeps the GradScaler: the resumed run continues bit for bit",
          "[optim][grad_scaler][checkpoint]") {
  const auto overflow_at = [](int step) { return step == 1 || step == 5; };
  runtime::Generator g1(7);
  auto model = std::make_shared<nn::Linear>(3, 2, true, g1);
  SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  GradScaler scaler({.init_scale = 1024, .growth_interval = 2});
  const TrainingParts parts{.model = model.get(), .optimizer = &opt, .scaler = &scaler};
  for (int step = 0; step < 3; ++step) train_step(*model, opt, scaler, step, overflow_at(step));
  runtime::CheckpointContent content = training_checkpoint_content(parts, {.step = 3});
  for (auto& [name, t] : content.tensors) t = t.clone();  // as written: not the live tensors
  CHECK(content.metadata.at("grad_scaler.state.scale") == "512");
  std::vector<bool> stepped;
  for (int step = 3; step < 7; ++step)
    stepped.push_back(train_step(*model, opt, scaler, step, overflow_at(step)));
  CHECK(stepped == std::vector<bool>{true, true, false, true});

  runtime::Generator g2(99);
  auto resumed = std::make_shared<nn::Linear>(3, 2, true, g2);
  SGD opt2(resumed->parameters(), {.lr = 0.05, .momentum = 0.9});
  GradScaler scaler2;
  const TrainingParts parts2{.model = resumed.get(), .optimizer = &opt2, .scaler = &scaler2};
  restore_training_checkpoint(content, parts2, "memory");
  for (int step = 3; step < 7; ++step) train_step(*resumed, opt2, scaler2, step, overflow_at(step));
  for (size_t i = 0; i < model->parameters().size(); ++i)
    CHECK(bitwise_equal(resumed->parameters()[i].detach(), model->parameters()[i].detach()));
  CHECK(scaler2.state_dict() == scaler.state_dict());

  // A checkpoint without scaler state is refused before anything changes.
  const TrainingParts no_scaler{.model = model.get(), .optimizer = &opt};
  const runtime::CheckpointContent plain = training_checkpoint_content(no_scaler, {.step = 7});
  runtime::Generator g3(5);
  auto other = std::make_shared<nn::Linear>(3, 2, true, g3);
  const Tensor before = other->parameters()[0].detach().clone();
  SGD opt3(other->parameters(), {.lr = 0.05, .momentum = 0.9});
  GradScaler scaler3;
  const TrainingParts parts3{.model = other.get(), .optimizer = &opt3, .scaler = &scaler3};
  CHECK_THROWS_WITH(restore_training_checkpoint(plain, parts3, "memory"),
                    Contains("no GradScaler state"));
  CHECK(bitwise_equal(other->parameters()[0].detach(), before));
}
