// SGD: the update rule against numbers worked out by hand and against a
// scalar re-implementation of torch.optim.SGD; option checks; param groups;
// zero_grad; state_dict round trips of the momentum buffers.
#include <catch2/catch.hpp>

#include <cmath>
#include <tuple>

#include "lockstep/optim/adam.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/runtime/autograd/rebind.h"
#include "lockstep/runtime/ops.h"
#include "lockstep/runtime/random.h"
#include "support/test_util.h"

using namespace lockstep::optim;
using namespace lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Generator;
using Catch::Contains;

namespace {

Tensor param(std::vector<double> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor p = Tensor::from_vector(v, {n});
  p.requires_grad_();
  return p;
}

void set_grad(Tensor& p, std::vector<double> g) {
  p.set_grad(Tensor::from_vector(g, {static_cast<int64_t>(g.size())}).to(p.dtype()));
}

// `steps` steps of a one-element f64 parameter starting at 1 with gradient
// 0.5 at every step; returns the values after each step.
std::vector<double> run_scalar(SGDOptions o, int steps, double grad = 0.5) {
  Tensor p = param({1.0});
  SGD opt({p}, o);
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) {
    set_grad(p, {grad});
    opt.step();
    out.push_back(p.item());
  }
  return out;
}

void check_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-12));
}

// The reference: torch/optim/sgd.py _single_tensor_sgd, one element at a time.
struct Reference {
  SGDOptions o;
  std::vector<double> p, buf;
  bool have_buf = false;

  void step(const std::vector<double>& grad) {
    if (o.momentum != 0 && !have_buf) buf.assign(p.size(), 0.0);
    for (size_t i = 0; i < p.size(); ++i) {
      double g = o.maximize ? -grad[i] : grad[i];
      if (o.weight_decay != 0) g += o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = have_buf ? o.momentum * buf[i] + (1 - o.dampening) * g : g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * g;
    }
    if (o.momentum != 0) have_buf = true;
  }
};

}  // namespace

TEST_CASE("SGD: exact numbers worked out by hand", "[optim][sgd]") {
  // p = 1, g = 0.5, lr = 0.1 throughout.
  // Plain: p -= 0.05 per step.
  check_close(run_scalar({.lr = 0.1}, 2), {0.95, 0.9});
  // Momentum 0.9: buf = 0.5, 0.95, 1.355 -> p = 0.95, 0.855, 0.7195.
  check_close(run_scalar({.lr = 0.1, .momentum = 0.9}, 3), {0.95, 0.855, 0.7195});
  // Dampening 0.5 is not applied on the first step (buf = g), then
  // buf = 0.9 * 0.5 + 0.5 * 0.5 = 0.7 -> p = 0.95, 0.88.
  check_close(run_scalar({.lr = 0.1, .momentum = 0.9, .dampening = 0.5}, 2), {0.95, 0.88});
  // Nesterov: buf = 0.5, d = 0.5 + 0.9 * 0.5 = 0.95 -> p = 0.905; then
  // buf = 0.95, d = 0.5 + 0.855 = 1.355 -> p = 0.7695.
  check_close(run_scalar({.lr = 0.1, .momentum = 0.9, .nesterov = true}, 2), {0.905, 0.7695});
  // Weight decay 0.1: d = 0.5 + 0.1 * 1 = 0.6 -> p = 0.94; then
  // d = 0.5 + 0.094 = 0.594 -> p = 0.94 - 0.0594 = 0.8806.
  check_close(run_scalar({.lr = 0.1, .weight_decay = 0.1}, 2), {0.94, 0.8806});
  // Weight decay goes into the momentum buffer: buf = 0.6, then
  // d = 0.5 + 0.094 = 0.594, buf = 0.54 + 0.594 = 1.134 -> p = 0.94, 0.8266.
  check_close(run_scalar({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1}, 2), {0.94, 0.8266});
  // Maximize climbs the gradient.
  check_close(run_scalar({.lr = 0.1, .maximize = true}, 2), {1.05, 1.1});
  // lr = 0 changes nothing, but still builds the buffer.
  check_close(run_scalar({.lr = 0.0, .momentum = 0.9}, 2), {1.0, 1.0});
}

TEST_CASE("SGD matches the reference rule over many steps", "[optim][sgd]") {
  auto [momentum, dampening, nesterov, weight_decay, maximize] =
      GENERATE(table<double, double, bool, double, bool>({
          {0.0, 0.0, false, 0.0, false},
          {0.9, 0.0, false, 0.0, false},
          {0.9, 0.3, false, 0.0, false},
          {0.9, 0.0, true, 0.0, false},
          {0.5, 0.0, true, 0.01, false},
          {0.9, 0.1, false, 0.05, true},
          {0.0, 0.0, false, 0.1, true},
      }));
  const DType dtype = GENERATE(DType::f64, DType::f32);
  const SGDOptions o{.lr = 0.03,
                     .momentum = momentum,
                     .dampening = dampening,
                     .weight_decay = weight_decay,
                     .nesterov = nesterov,
                     .maximize = maximize};
  CAPTURE(momentum, dampening, nesterov, weight_decay, maximize, dtype == DType::f32);

  Generator gen(17);
  const int64_t n = 1000;  // long enough to exercise the vectorised loop and its tail
  Tensor p0 = lockstep::runtime::randn({n}, DType::f64, gen);
  Tensor p = p0.to(dtype);
  p.requires_grad_();
  SGD opt({p}, o);
  Reference ref{o, values(p), {}};

  for (int step = 0; step < 6; ++step) {
    Tensor g = lockstep::runtime::randn({n}, DType::f64, gen);
    p.set_grad(g.to(dtype));
    opt.step();
    ref.step(values(g.to(dtype)));
  }
  // f32 is rounded at every operation; f64 agrees to rounding.
  const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
  auto got = values(p);
  for (int64_t i = 0; i < n; ++i)
    REQUIRE(got[static_cast<size_t>(i)] == Approx(ref.p[static_cast<size_t>(i)]).margin(tol));
}

TEST_CASE("SGD skips parameters without a gradient", "[optim][sgd]") {
  Tensor a = param({1.0}), b = param({2.0});
  SGD opt({a, b}, {.lr = 0.1, .momentum = 0.9});
  set_grad(a, {1.0});
  opt.step();
  CHECK(a.item() == Approx(0.9));
  CHECK(b.item() == 2.0);
  // b has no momentum buffer: its first real step starts one (buf = g).
  set_grad(b, {1.0});
  a.set_grad(Tensor{});
  opt.step();
  CHECK(b.item() == Approx(1.9));
  CHECK(a.item() == Approx(0.9));
  auto sd = opt.state_dict();
  CHECK(sd.state.size() == 2);
}

TEST_CASE("SGD rejects invalid options with a clear message", "[optim][sgd]") {
  Tensor p = param({1.0});
  CHECK_THAT(error_of([&] { SGD({p}, {.lr = -0.1}); }), Contains("invalid learning rate -0.1"));
  CHECK_THAT(error_of([&] { SGD({p}, {.lr = NAN}); }), Contains("invalid learning rate"));
  CHECK_THAT(error_of([&] { SGD({p}, {.momentum = -1}); }), Contains("invalid momentum"));
  CHECK_THAT(error_of([&] { SGD({p}, {.weight_decay = -1}); }),
             Contains("invalid weight_decay"));
  CHECK_THAT(error_of([&] { SGD({p}, {.nesterov = true}); }),
             Contains("Nesterov momentum requires a momentum > 0 and zero dampening"));
  CHECK_THAT(error_of([&] { SGD({p}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}); }),
             Contains("zero dampening"));
  CHECK_THAT(error_of([&] { SGD(std::vector<Tensor>{}, {}); }),
             Contains("empty parameter list"));
  CHECK_THAT(error_of([&] { SGD({p, p}, {}); }), Contains("appears more than once"));
  CHECK_THAT(error_of([&] { SGD({Tensor::zeros({2}, DType::i64)}, {}); }),
             Contains("only floating-point tensors"));
  Tensor q = param({1.0});
  CHECK_THAT(error_of([&] { SGD({lockstep::runtime::mul(q, 2.0)}, {}); }), Contains("not a leaf"));
  CHECK_THAT(error_of([&] { SGD(std::vector<ParamGroup>{{{p}, {{"learning_rate", 1}}}}); }),
             Contains("unknown option \"learning_rate\""));

  // Options edited after construction are checked at the next step.
  SGD opt({p}, {.lr = 0.1});
  opt.param_groups()[0].options["lr"] = -1;
  set_grad(p, {1.0});
  CHECK_THAT(error_of([&] { opt.step(); }), Contains("invalid learning rate -1"));
}

TEST_CASE("SGD checks every group before stepping any", "[optim][sgd]") {
  Tensor a = param({1.0}), b = param({1.0});
  SGD opt(std::vector<ParamGroup>{{{a}, {}}, {{b}, {}}}, {.lr = 0.1, .momentum = 0.9});
  opt.param_groups()[1].options["lr"] = -1;  // the second group is invalid
  set_grad(a, {1.0});
  set_grad(b, {1.0});
  CHECK_THAT(error_of([&] { opt.step(); }), Contains("invalid learning rate -1"));
  CHECK(a.item() == 1.0);                      // the first group was not stepped
  CHECK(opt.state_dict().state.empty());       // nor given a momentum buffer
}

TEST_CASE("SGD param groups take their own options; lr can be changed", "[optim][sgd]") {
  Tensor a = param({1.0}), b = param({1.0});
  SGD opt(std::vector<ParamGroup>{{{a}, {}}, {{b}, {{"lr", 0.5}}}}, {.lr = 0.1});
  CHECK(opt.param_groups()[0].options.at("lr") == 0.1);
  CHECK(opt.param_groups()[1].options.at("lr") == 0.5);
  CHECK(opt.param_groups()[1].options.at("momentum") == 0.0);  // filled from the defaults
  set_grad(a, {1.0});
  set_grad(b, {1.0});
  opt.step();
  CHECK(a.item() == Approx(0.9));
  CHECK(b.item() == Approx(0.5));

  opt.param_groups()[0].options["lr"] = 0.2;  // what an LR scheduler does
  opt.step();
  CHECK(a.item() == Approx(0.7));

  Tensor c = param({1.0});
  opt.add_param_group({{c}, {{"momentum", 0.9}}});
  CHECK(opt.param_groups().size() == 3);
  CHECK_THAT(error_of([&] { opt.add_param_group({{a}, {}}); }),
             Contains("appears more than once"));
}

TEST_CASE("SGD and Adam built from thousands of groups keep each group's options and refuse "
          "a parameter in two of them",
          "[optim][sgd]") {
  // One group per parameter, as a per-layer learning rate gives: the
  // constructor checks every parameter against those of all earlier groups.
  const int n = 4000;
  std::vector<Tensor> params;
  std::vector<ParamGroup> groups;
  for (int i = 0; i < n; ++i) {
    params.push_back(param({1.0}));
    groups.push_back({{params.back()}, {{"lr", 0.001 * (i + 1)}}});
  }
  SGD sgd(groups, {.lr = 0.1});
  REQUIRE(sgd.param_groups().size() == static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) set_grad(params[i], {1.0});
  sgd.step();
  for (int i = 0; i < n; i += 397) {
    CHECK(sgd.param_groups()[i].options.at("lr") == 0.001 * (i + 1));
    CHECK(params[i].item() == Approx(1.0 - 0.001 * (i + 1)));
  }
  Adam adam(groups, {});
  CHECK(adam.param_groups().size() == static_cast<size_t>(n));

  // The last group repeats the first group's parameter: refused, as are a
  // parameter already in a group added before and one twice in a new group.
  groups.push_back({{params.front()}, {}});
  CHECK_THAT(error_of([&] { SGD(groups, {}); }), Contains("appears more than once"));
  CHECK_THAT(error_of([&] { Adam(groups, {}); }), Contains("appears more than once"));
  groups.pop_back();
  CHECK_THAT(error_of([&] { sgd.add_param_group({{params[n / 2]}, {}}); }),
             Contains("appears more than once"));
  Tensor fresh = param({1.0});
  CHECK_THAT(error_of([&] { sgd.add_param_group({{fresh, fresh}, {}}); }),
             Contains("appears more than once"));
  sgd.add_param_group({{fresh}, {}});
  CHECK(sgd.param_groups().size() == static_cast<size_t>(n + 1));
}

TEST_CASE("zero_grad drops or zeroes gradients", "[optim][sgd]") {
  Tensor p = param({1.0, 2.0});
  SGD opt({p}, {.lr = 0.1});
  set_grad(p, {1.0, 1.0});
  opt.zero_grad(/*set_to_none=*/false);
  REQUIRE(p.grad().defined());
  CHECK(values(p.grad()) == std::vector<double>{0.0, 0.0});
  opt.zero_grad();
  CHECK_FALSE(p.grad().defined());
}

TEST_CASE("SGD step bumps the parameter's version", "[optim][sgd]") {
  Tensor p = param({1.0});
  SGD opt({p}, {.lr = 0.1});
  set_grad(p, {1.0});
  const auto v = p.version();
  opt.step();
  CHECK(p.version() > v);
}

TEST_CASE("SGD momentum buffers round-trip through state_dict", "[optim][sgd]") {
  const SGDOptions o{.lr = 0.05, .momentum = 0.9, .nesterov = true};
  Generator gen(3);
  auto grads = [&](int64_t n) { return lockstep::runtime::randn({n}, DType::f32, gen); };

  Tensor a1 = lockstep::runtime::randn({5}, DType::f32, gen), b1 = lockstep::runtime::randn({3}, DType::f32, gen);
  a1.requires_grad_();
  b1.requires_grad_();
  SGD opt1(std::vector<ParamGroup>{{{a1}, {}}, {{b1}, {{"lr", 0.01}}}}, o);
  for (int i = 0; i < 3; ++i) {
    a1.set_grad(grads(5));
    b1.set_grad(grads(3));
    opt1.step();
  }
  const OptimizerState saved = opt1.state_dict();
  REQUIRE(saved.state.size() == 2);
  CHECK(saved.state.at(0).at("momentum_buffer").shape() == lockstep::runtime::Shape{5});
  CHECK(saved.param_groups[0].params == std::vector<int64_t>{0});
  CHECK(saved.param_groups[1].params == std::vector<int64_t>{1});
  CHECK(saved.param_groups[1].options.at("lr") == 0.01);

  // A second optimizer on copies of the parameters, built with other options,
  // takes the saved options and buffers...
  Tensor a2 = a1.detach().clone(), b2 = b1.detach().clone();
  a2.requires_grad_();
  b2.requires_grad_();
  SGD opt2(std::vector<ParamGroup>{{{a2}, {}}, {{b2}, {}}}, {.lr = 1.0, .momentum = 0.1});
  opt2.load_state_dict(saved);
  CHECK(opt2.param_groups()[1].options.at("lr") == 0.01);
  CHECK(opt2.param_groups()[0].options.at("nesterov") == 1.0);
  // ...as copies, not aliases.
  CHECK_FALSE(opt2.state_dict().state.at(0).at("momentum_buffer").storage() ==
              saved.state.at(0).at("momentum_buffer").storage());

  // ...so both continue identically.
  for (int i = 0; i < 3; ++i) {
    Tensor ga = grads(5), gb = grads(3);
    a1.set_grad(ga);
    b1.set_grad(gb);
    a2.set_grad(ga.clone());
    b2.set_grad(gb.clone());
    opt1.step();
    opt2.step();
  }
  CHECK(bitwise_equal(a1, a2));
  CHECK(bitwise_equal(b1, b2));
}

TEST_CASE("SGD load_state_dict checks the groups and the state shapes", "[optim][sgd]") {
  Tensor a = param({1.0, 2.0}), b = param({3.0});
  SGD opt({a, b}, {.lr = 0.1, .momentum = 0.9});
  set_grad(a, {1.0, 1.0});
  set_grad(b, {1.0});
  opt.step();
  OptimizerState sd = opt.state_dict();

  Tensor c = param({1.0, 2.0});
  SGD one({c}, {.lr = 0.1});
  CHECK_THAT(error_of([&] { one.load_state_dict(sd); }),
             Contains("saved parameter group 0 has 2 parameter(s), this optimizer's has 1"));

  SGD two_groups(std::vector<ParamGroup>{{{a}, {}}, {{b}, {}}}, {.lr = 0.1});
  CHECK_THAT(error_of([&] { two_groups.load_state_dict(sd); }),
             Contains("has 1 parameter group(s), this optimizer has 2"));

  Tensor d = param({1.0, 2.0, 3.0}), e = param({1.0});
  SGD wrong_shape({d, e}, {.lr = 0.1});
  CHECK_THAT(error_of([&] { wrong_shape.load_state_dict(sd); }),
             Contains("state \"momentum_buffer\" of parameter 0 has shape [2], the parameter has "
                      "shape [3]"));
  // Nothing changed on error.
  CHECK(wrong_shape.state_dict().state.empty());
  CHECK(wrong_shape.param_groups()[0].options.at("momentum") == 0.0);

  // A 0-dim momentum buffer (a hand-built or damaged checkpoint) is refused:
  // the update would read and write a whole parameter's elements through it.
  OptimizerState scalar_buffer = sd;
  scalar_buffer.state[0]["momentum_buffer"] = Tensor::scalar(0.0, a.dtype());
  SGD victim({a, b}, {.lr = 0.1, .momentum = 0.9});
  CHECK_THAT(error_of([&] { victim.load_state_dict(scalar_buffer); }),
             Contains("state \"momentum_buffer\" of parameter 0 has shape [], the parameter has "
                      "shape [2]"));
}

TEST_CASE("SGD load_state_dict converts a scalar parameter's buffer and refuses unusable state",
          "[optim][sgd]") {
  // A learnable scalar, stepped in f64, its state loaded over an f32 one:
  // PyTorch converts every floating entry but "step", 0-dim ones included.
  Tensor s64 = Tensor::scalar(1.0, DType::f64);
  s64.requires_grad_();
  SGD src({s64}, {.lr = 0.1, .momentum = 0.9});
  s64.set_grad(Tensor::scalar(1.0, DType::f64));
  src.step();

  Tensor s32 = Tensor::scalar(1.0, DType::f32);
  s32.requires_grad_();
  SGD dst({s32}, {.lr = 0.1, .momentum = 0.9});
  dst.load_state_dict(src.state_dict());
  CHECK(dst.state_dict().state.at(0).at("momentum_buffer").dtype() == DType::f32);
  s32.set_grad(Tensor::scalar(1.0, DType::f32));
  dst.step();  // buf = 0.9 * 1 + 1 = 1.9; p = 1 - 0.19
  CHECK(s32.item() == Approx(0.81).epsilon(1e-6));

  // Per-element state of an integer dtype cannot be the parameter's.
  Tensor a = param({1.0, 2.0});
  SGD opt({a}, {.lr = 0.1, .momentum = 0.9});
  OptimizerState ints;
  ints.param_groups.push_back({{}, {0}});
  ints.state[0]["momentum_buffer"] = Tensor::zeros({2}, DType::i64);
  CHECK_THAT(error_of([&] { opt.load_state_dict(ints); }),
             Contains("state \"momentum_buffer\" of parameter 0 has dtype i64"));
  // A step count is one number.
  OptimizerState steps;
  steps.param_groups.push_back({{}, {0}});
  steps.state[0]["step"] = Tensor::zeros({2});
  CHECK_THAT(error_of([&] { opt.load_state_dict(steps); }),
             Contains("state \"step\" of parameter 0 has shape [2]"));
  CHECK(opt.state_dict().state.empty());
}

TEST_CASE("SGD refuses a step it cannot finish before changing anything", "[optim][sgd]") {
  Tensor a = param({1.0, 2.0}), b = param({3.0, 4.0});
  SGD opt({a, b}, {.lr = 0.1, .momentum = 0.9});
  set_grad(a, {1.0, 1.0});
  set_grad(b, {1.0, 1.0});
  opt.step();
  const OptimizerState before = opt.state_dict();
  const auto a_before = a.to_vector<double>();
  const Tensor buf_before = before.state.at(0).at("momentum_buffer").clone();

  // What Module::to(f32) does after some steps: the parameter changes dtype
  // in place (the optimizer still holds it), its f64 buffer does not.
  lockstep::runtime::rebind(b, b.detach().to(DType::f32));
  b.set_grad(Tensor::ones({2}, DType::f32));
  set_grad(a, {1.0, 1.0});
  CHECK_THAT(error_of([&] { opt.step(); }),
             Contains("SGD.step: the state \"momentum_buffer\" of parameter 1 of group 0 is f64") &&
                 Contains("the parameter f32"));
  CHECK(a.to_vector<double>() == a_before);  // the first parameter was not stepped
  CHECK(bitwise_equal(opt.state_dict().state.at(0).at("momentum_buffer"), buf_before));

  // Loading the optimizer's own state converts it to the parameters.
  opt.load_state_dict(opt.state_dict());
  opt.step();
  CHECK(opt.state_dict().state.at(1).at("momentum_buffer").dtype() == DType::f32);
  CHECK(a.to_vector<double>() != a_before);
}

TEST_CASE("SGD steps bf16 and f16 parameters on the CPU in f32, rounding once", "[optim][sgd]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (bool nesterov : {false, true}) {
      INFO(lockstep::runtime::dtype_name(dtype) << (nesterov ? " nesterov" : ""));
      const SGDOptions o{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov};
      Tensor low = Tensor::from_vector(std::vector<float>{1.0f, -2.0f, 0.5f, 3.0f}, {4}).to(dtype);
      low.requires_grad_();
      // The twin holds the same values in f32 and takes the same steps: its
      // results, rounded, are the low-precision run's bit for bit.
      Tensor twin = low.detach().to(DType::f32);
      twin.requires_grad_();
      SGD opt_low({low}, o), opt_twin({twin}, o);
      for (int i = 0; i < 4; ++i) {
        Tensor g =
            (Tensor::from_vector(std::vector<float>{0.3f, -0.7f, 1.1f, 0.01f}, {4}) * (i + 1.0))
                .to(dtype);
        low.set_grad(g);
        twin.set_grad(g.to(DType::f32));
        opt_low.step();
        opt_twin.step();
        CHECK(bitwise_equal(low, twin.detach().to(dtype)));
        const Tensor buf = opt_low.state_dict().state.at(0).at("momentum_buffer");
        CHECK(buf.dtype() == dtype);
        const Tensor twin_buf = opt_twin.state_dict().state.at(0).at("momentum_buffer");
        CHECK(bitwise_equal(buf, twin_buf.to(dtype)));
        // The twin goes on from the rounded values the low run holds.
        twin.detach().copy_(low.detach().to(DType::f32));
        opt_twin.load_state_dict(opt_low.state_dict());
      }
    }
  }
}

TEST_CASE("SGD load_state_dict refuses another optimizer's state", "[optim][sgd]") {
  Tensor a = param({1.0, 2.0});
  SGD opt({a}, {.lr = 0.1, .momentum = 0.9});
  OptimizerState adam_like;
  adam_like.param_groups.push_back({{}, {0}});  // options left out: only the state tells
  adam_like.state[0] = {{"step", Tensor::scalar(3.0, DType::f32)},
                        {"exp_avg", Tensor::zeros({2}, a.dtype())},
                        {"exp_avg_sq", Tensor::zeros({2}, a.dtype())}};
  // Before, it loaded: SGD ignored the moments and restarted its momentum.
  CHECK_THAT(error_of([&] { opt.load_state_dict(adam_like); }),
             Contains("SGD.load_state_dict: state \"exp_avg\" of parameter 0 is not SGD state "
                      "(SGD keeps \"momentum_buffer\")"));
  CHECK(opt.state_dict().state.empty());
}

TEST_CASE("zero_grad(false) detaches a gradient computed with history, as PyTorch",
          "[optim][sgd]") {
  auto w = lockstep::runtime::Tensor::ones({3}).requires_grad_();
  auto x = lockstep::runtime::Tensor::ones({3}).requires_grad_();
  SGD opt({w}, {.lr = 0.1});
  // A gradient set from a computation that requires grad keeps its graph.
  const auto g = lockstep::runtime::mul(x, 2.0);
  REQUIRE(g.grad_fn() != nullptr);
  w.set_grad(g);
  opt.zero_grad(/*set_to_none=*/false);
  CHECK(w.grad().grad_fn() == nullptr);
  CHECK_FALSE(w.grad().requires_grad());
  CHECK(values(w.grad()) == std::vector<double>{0, 0, 0});
  // The next backward accumulates into it as into any gradient.
  lockstep::runtime::sum(lockstep::runtime::mul(w, 3.0)).backward();
  CHECK(values(w.grad()) == std::vector<double>{3, 3, 3});
  CHECK(w.grad().grad_fn() == nullptr);
  // A gradient set to a leaf that requires grad stops requiring it.
  w.set_grad(lockstep::runtime::Tensor::ones({3}).requires_grad_());
  opt.zero_grad(/*set_to_none=*/false);
  CHECK_FALSE(w.grad().requires_grad());
}

TEST_CASE("A parameter group of no parameters is kept, as PyTorch, and round-trips through "
          "state_dict",
          "[optim][sgd]") {
  // torch.optim.SGD([{'params': []}, {'params': [w]}], lr=0.1, momentum=0.9) gives, after a
  // step with gradient 1, state {0: momentum_buffer [1, 1]} and groups [[], [0]].
  Tensor w = param({1.0, 2.0});
  SGD opt(std::vector<ParamGroup>{{{}, {}}, {{w}, {}}}, {.lr = 0.1, .momentum = 0.9});
  REQUIRE(opt.param_groups().size() == 2);
  set_grad(w, {1.0, 1.0});
  opt.step();
  CHECK(values(w) == std::vector<double>{0.9, 1.9});
  const OptimizerState saved = opt.state_dict();
  CHECK(saved.param_groups[0].params.empty());
  CHECK(saved.param_groups[1].params == std::vector<int64_t>{0});
  CHECK(values(saved.state.at(0).at("momentum_buffer")) == std::vector<double>{1.0, 1.0});

  Tensor w2 = param({0.9, 1.9});
  SGD resumed(std::vector<ParamGroup>{{{}, {}}, {{w2}, {}}}, {.lr = 0.1});
  resumed.load_state_dict(saved);
  set_grad(w, {1.0, 1.0});
  set_grad(w2, {1.0, 1.0});
  opt.step();
  resumed.step();
  CHECK(bitwise_equal(w, w2));
  // Without the empty group the groups differ in number, and that is named.
  Tensor w3 = param({0.9, 1.9});
  SGD other({w3}, {.lr = 0.1});
  CHECK_THROWS(other.load_state_dict(saved));
  // add_param_group keeps one too; a flat empty list is still refused.
  other.add_param_group({{}, {{"lr", 0.5}}});
  CHECK(other.param_groups().size() == 2);
  CHECK_THAT(error_of([&] { SGD(std::vector<Tensor>{}, {}); }), Contains("empty parameter list"));
}
