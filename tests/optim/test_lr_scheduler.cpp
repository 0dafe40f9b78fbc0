// LR schedules beyond PyTorch's numbers (test_torch_reference.cpp): resuming
// from state_dict() continues the same sequence, groups keep their own base
// rates, and bad options and states fail with clear messages.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>

#include "lockstep/optim/adam.h"
#include "lockstep/optim/lr_scheduler.h"
#include "lockstep/optim/sgd.h"

using namespace lockstep::optim;
using Catch::Contains;

namespace {

Tensor param() {
  Tensor p = Tensor::zeros({2});
  p.requires_grad_();
  return p;
}

double lr(const Optimizer& opt, size_t group = 0) { return opt.param_groups()[group].options.at("lr"); }

}  // namespace

TEST_CASE("A scheduler restored from state_dict continues the same sequence",
          "[optim][lr_scheduler]") {
  Tensor p = param();
  SGD a({p}, {.lr = 0.2, .momentum = 0.9});
  WarmupCosineLR sa(a, {.warmup_steps = 4, .total_steps = 20});
  for (int i = 0; i < 7; ++i) sa.step();
  const SchedulerState saved = sa.state_dict();
  CHECK(saved.at("last_epoch") == 7);

  Tensor q = param();
  SGD b({q}, {.lr = 0.2, .momentum = 0.9});
  WarmupCosineLR sb(b, {.warmup_steps = 4, .total_steps = 20});
  sb.load_state_dict(saved);
  CHECK(lr(b) == lr(a));
  for (int i = 0; i < 10; ++i) {
    sa.step();
    sb.step();
    CHECK(lr(b) == lr(a));
  }
}

TEST_CASE("Each parameter group follows the schedule from its own rate", "[optim][lr_scheduler]") {
  Tensor p = param(), q = param();
  Adam opt(std::vector<ParamGroup>{{{p}, {}}, {{q}, {{"lr", 0.5}}}}, {.lr = 0.1});
  StepLR sched(opt, {.step_size = 2, .gamma = 0.1});
  CHECK(sched.base_lrs() == std::vector<double>{0.1, 0.5});
  sched.step();
  sched.step();
  CHECK(lr(opt, 0) == Approx(0.01));
  CHECK(lr(opt, 1) == Approx(0.05));
  CHECK(sched.last_lr() == std::vector<double>{lr(opt, 0), lr(opt, 1)});
}

TEST_CASE("A group added after the scheduler is refused with the way to unfreeze later; a "
          "frozen group made up front follows the schedule once unfrozen",
          "[optim][lr_scheduler]") {
  Tensor head = param(), body = param();
  body.requires_grad_(false);
  SECTION("added after the scheduler: refused, nothing changes") {
    SGD opt({head}, {.lr = 0.1});
    StepLR sched(opt, {.step_size = 1, .gamma = 0.5});
    sched.step();
    body.requires_grad_(true);
    opt.add_param_group({{body}, {}});
    CHECK_THROWS_WITH(sched.step(),
                      Contains("the optimizer has 2 parameter group(s) but the scheduler was "
                               "made for 1") &&
                          Contains("give them a group of their own from the start") &&
                          Contains("would start the schedule over from the current rates"));
    CHECK(lr(opt, 0) == 0.05);
    CHECK(sched.last_epoch() == 1);
  }
  SECTION("a group of its own from the start") {
    SGD opt(std::vector<ParamGroup>{{{head}, {}}, {{body}, {{"lr", 0.01}}}}, {.lr = 0.1});
    StepLR sched(opt, {.step_size = 1, .gamma = 0.5});
    for (int i = 0; i < 2; ++i) {
      head.set_grad(Tensor::ones({2}));
      opt.step();  // body has no gradient: skipped
      sched.step();
    }
    CHECK(body.to_vector<double>() == std::vector<double>{0, 0});
    body.requires_grad_(true);
    body.set_grad(Tensor::ones({2}));
    opt.step();
    CHECK(lr(opt, 1) == 0.0025);
    for (double v : body.to_vector<double>()) CHECK(v == Approx(-0.0025));
  }
}

TEST_CASE("A scheduler whose optimizer was replaced (to unfreeze a backbone) is refused, not "
          "stepped through a dangling reference",
          "[optim][lr_scheduler]") {
  Tensor head = param(), body = param();
  auto opt = std::make_unique<SGD>(std::vector<Tensor>{head}, SGDOptions{.lr = 0.1});
  StepLR sched(*opt, {.step_size = 1, .gamma = 0.5});
  sched.step();
  // The new optimizer is made before the old one goes, as unique_ptr's
  // assignment does.
  opt = std::make_unique<SGD>(std::vector<ParamGroup>{{{head}, {}}, {{body}, {{"lr", 0.01}}}},
                              SGDOptions{.lr = 0.1});
  for (const auto& refused : std::vector<std::function<void()>>{
           [&] { sched.step(); },
           [&] { sched.load_state_dict({{"last_epoch", 0}, {"base_lr.0", 0.1}}); }}) {
    CHECK_THROWS_WITH(refused(),
                      Contains("the optimizer this scheduler was made for has been destroyed") &&
                          Contains("make one for the new optimizer"));
  }
  CHECK(sched.last_epoch() == 1);
  CHECK(lr(*opt, 0) == 0.1);
  CHECK(lr(*opt, 1) == 0.01);
}

TEST_CASE("One-cycle cycles beta1 for Adam and refuses to run past its steps",
          "[optim][lr_scheduler]") {
  Tensor p = param();
  Adam opt({p}, {.lr = 0.1});
  OneCycleLR sched(opt, {.max_lr = 1.0, .total_steps = 10});
  CHECK(opt.param_groups()[0].options.at("beta1") == Approx(0.95));
  for (int i = 0; i < 10; ++i) sched.step();  // step 10 == total_steps is allowed
  const double lr_before = lr(opt), beta1_before = opt.param_groups()[0].options.at("beta1");
  CHECK_THROWS_WITH(sched.step(), Contains("stepped 11 times but total_steps is 10"));
  // The refused step changed nothing.
  CHECK(sched.last_epoch() == 10);
  CHECK(sched.last_lr() == std::vector<double>{lr_before});
  CHECK(lr(opt) == lr_before);
  CHECK(opt.param_groups()[0].options.at("beta1") == beta1_before);

  // Its state goes on where it stopped; one past the end is refused on load,
  // before anything changes.
  SchedulerState saved = sched.state_dict();
  Adam other({param()}, {.lr = 0.1});
  OneCycleLR resumed(other, {.max_lr = 1.0, .total_steps = 10});
  const double start = lr(other);
  saved["last_epoch"] = 11;
  CHECK_THROWS_WITH(resumed.check_state_dict(saved), Contains("total_steps is 10"));
  CHECK_THROWS_WITH(resumed.load_state_dict(saved), Contains("OneCycleLR.load_state_dict") &&
                                                        Contains("total_steps is 10"));
  CHECK(resumed.last_epoch() == 0);
  CHECK(lr(other) == start);
  saved["last_epoch"] = 10;
  resumed.load_state_dict(saved);
  CHECK(lr(other) == lr_before);
}

TEST_CASE("One-cycle refuses momenta its optimizer would refuse, naming the schedule",
          "[optim][lr_scheduler]") {
  // Before, a max_momentum of 1 was written into Adam's beta1 and refused
  // only at the next step, as "Adam: invalid beta1", naming no schedule.
  Adam adam({param()}, {.lr = 0.1});
  CHECK_THROWS_WITH(OneCycleLR(adam, {.total_steps = 10, .max_momentum = 1.0}),
                    Contains("OneCycleLR: base_momentum 0.85 and max_momentum 1 must be in "
                             "[0, 1) to cycle the optimizer's beta1"));
  CHECK_THROWS_WITH(OneCycleLR(adam, {.total_steps = 10, .base_momentum = -0.1}),
                    Contains("OneCycleLR"));
  CHECK(adam.param_groups()[0].options.at("beta1") == 0.9);  // nothing written
  // SGD's momentum may reach 1 and past it (PyTorch's too), not below 0.
  SGD sgd({param()}, {.lr = 0.1, .momentum = 0.9});
  CHECK_NOTHROW(OneCycleLR(sgd, {.total_steps = 10, .max_momentum = 1.0}));
  CHECK_THROWS_WITH(OneCycleLR(sgd, {.total_steps = 10, .base_momentum = -1.0}),
                    Contains("finite and >= 0 to cycle the optimizer's momentum"));
  CHECK_NOTHROW(OneCycleLR(adam, {.total_steps = 10, .cycle_momentum = false,
                                  .max_momentum = 1.0}));
}

TEST_CASE("An optimizer takes one LR scheduler at a time", "[optim][lr_scheduler]") {
  Tensor p = param();
  SGD opt({p}, {.lr = 1.0});
  {
    LinearLR warmup(opt, {.start_factor = 0.5, .end_factor = 1.0, .total_steps = 2});
    CHECK(lr(opt) == 0.5);
    // PyTorch would chain the two (0.075, 0.01, ... below); lockstep's
    // schedulers each write their closed form, so the second is refused
    // rather than silently overriding the first.
    CHECK_THROWS_WITH(StepLR(opt, {.step_size = 1, .gamma = 0.1}),
                      Contains("StepLR: this SGD already has an LR scheduler, LinearLR") &&
                          Contains("WarmupCosineLR") && Contains("destroy the first scheduler"));
    CHECK(lr(opt) == 0.5);  // the refused one wrote nothing
    warmup.step();
    warmup.step();
    CHECK(lr(opt) == 1.0);
  }
  // Once the warmup is gone, a decay starts from the rate it left.
  StepLR decay(opt, {.step_size = 1, .gamma = 0.1});
  CHECK(decay.base_lrs() == std::vector<double>{1.0});
  decay.step();
  CHECK(lr(opt) == Approx(0.1));

  // A refused scheduler, or one whose own options are refused, holds nothing.
  Tensor q = param();
  SGD other({q}, {.lr = 1.0});
  CHECK_THROWS_WITH(StepLR(other, {.step_size = 0}), Contains("step_size 0 must be >= 1"));
  StepLR fine(other, {.step_size = 1});

  // A scheduler may outlive its optimizer to be destroyed.
  auto owner = std::make_unique<SGD>(std::vector<Tensor>{param()}, SGDOptions{.lr = 1.0});
  auto sched = std::make_unique<CosineLR>(*owner, CosineLROptions{.t_max = 4});
  owner.reset();
  sched.reset();
}

TEST_CASE("Schedulers reject bad options and foreign states", "[optim][lr_scheduler]") {
  Tensor p = param();
  SGD opt({p}, {.lr = 0.1});
  CHECK_THROWS_WITH(StepLR(opt, {.step_size = 0}), Contains("step_size 0 must be >= 1"));
  CHECK_THROWS_WITH(MultiStepLR(opt, {.milestones = {5, 2}}), Contains("increasing order"));
  CHECK_THROWS_WITH(WarmupCosineLR(opt, {.warmup_steps = 10, .total_steps = 10}),
                    Contains("warmup_steps < total_steps"));
  CHECK_THROWS_WITH(OneCycleLR(opt, {.total_steps = 2, .pct_start = 0.3}),
                    Contains("rising phase"));
  CosineLR sched(opt, {.t_max = 10});
  CHECK_THROWS_WITH(sched.load_state_dict({{"base_lr.0", 0.1}}), Contains("last_epoch"));
  CHECK_THROWS_WITH(sched.load_state_dict({{"last_epoch", 3}, {"base_lr.0", 0.1}, {"base_lr.1", 0.1}}),
                    Contains("2 parameter group(s)"));
  CHECK_THROWS_WITH(sched.load_state_dict({{"last_epoch", 3}, {"base_lr.0", -0.1}}),
                    Contains("\"base_lr.0\" is -0.1"));
  CHECK_THROWS_WITH(sched.load_state_dict({{"last_epoch", 1e300}, {"base_lr.0", 0.1}}),
                    Contains("last_epoch"));
  CHECK(sched.last_epoch() == 0);
}

TEST_CASE("Schedulers refuse settings that would turn the rate negative later",
          "[optim][lr_scheduler]") {
  // The first rates are fine; a negative one would stop the optimizer's step
  // near the end of the run (the cosine's floor) or after the first decay.
  Tensor p = param();
  SGD opt({p}, {.lr = 0.1});
  CHECK_THROWS_WITH(CosineLR(opt, {.t_max = 10, .eta_min = -0.01}),
                    Contains("eta_min -0.01 must be >= 0"));
  CHECK_THROWS_WITH(WarmupCosineLR(opt, {.warmup_steps = 2, .total_steps = 10, .eta_min = -0.01}),
                    Contains("eta_min -0.01 must be >= 0"));
  CHECK_THROWS_WITH(StepLR(opt, {.step_size = 3, .gamma = -0.5}),
                    Contains("gamma -0.5 must be >= 0"));
  CHECK_THROWS_WITH(MultiStepLR(opt, {.milestones = {4}, .gamma = -0.1}),
                    Contains("gamma -0.1 must be >= 0"));
  CHECK(lr(opt) == 0.1);
}

TEST_CASE("A scheduler refuses a state saved with other settings, and changes nothing",
          "[optim][lr_scheduler]") {
  Tensor p = param();
  SGD a({p}, {.lr = 0.2});
  WarmupCosineLR sa(a, {.warmup_steps = 4, .total_steps = 20});
  for (int i = 0; i < 7; ++i) sa.step();
  const SchedulerState saved = sa.state_dict();
  CHECK(saved.at("option.total_steps") == 20);

  SGD b({param()}, {.lr = 0.2});
  WarmupCosineLR longer(b, {.warmup_steps = 4, .total_steps = 30});  // a resume with more epochs
  const double before = lr(b);
  CHECK_THROWS_WITH(longer.load_state_dict(saved),
                    Contains("total_steps = 20, this one has 30") && Contains("settings of the run"));
  CHECK(longer.last_epoch() == 0);
  CHECK(lr(b) == before);

  SGD c({param()}, {.lr = 0.2}), d({param()}, {.lr = 0.2});
  MultiStepLR multi(c, {.milestones = {3, 6}});
  SchedulerState other = MultiStepLR(d, {.milestones = {3, 8}}).state_dict();
  CHECK_THROWS_WITH(multi.load_state_dict(other), Contains("milestone.1 = 8, this one has 6"));
  CHECK_THROWS_WITH(multi.load_state_dict(saved), Contains("setting \"eta_min\""));

  // A state from before settings were saved restores the position alone.
  SchedulerState old{{"last_epoch", 7}, {"base_lr.0", 0.2}};
  longer.load_state_dict(old);
  CHECK(longer.last_epoch() == 7);
}

TEST_CASE("A refused schedule setting is shown with every digit rather than six",
          "[optim][lr_scheduler]") {
  SGD a({param()}, {.lr = 0.1}), b({param()}, {.lr = 0.1});
  // A long run's length, one step apart; rounded, both read 1.5e+06.
  const SchedulerState saved = CosineLR(a, {.t_max = 1500000}).state_dict();
  CosineLR longer(b, {.t_max = 1500001});
  CHECK_THROWS_WITH(longer.load_state_dict(saved),
                    Contains("t_max = 1500000, this one has 1500001"));

  // LinearLR's default start factor against one typed in as 0.333333.
  SGD c({param()}, {.lr = 0.1}), d({param()}, {.lr = 0.1});
  const SchedulerState typed = LinearLR(c, {.start_factor = 0.333333}).state_dict();
  LinearLR by_default(d, {});
  CHECK_THROWS_WITH(by_default.load_state_dict(typed),
                    Contains("start_factor = 0.333333, this one has 0.3333333333333333"));
  SchedulerState older = typed;
  older.erase("option.end_factor");
  LinearLR almost(c, {.start_factor = 0.333333, .end_factor = 0.9999999});
  CHECK_THROWS_WITH(almost.load_state_dict(older),
                    Contains("no setting \"end_factor\" (this one has 0.9999999)"));
}

TEST_CASE("One-cycle holds its final rate after the last step, where a finished run is saved",
          "[optim][lr_scheduler]") {
  for (const bool cosine : {true, false}) {
    INFO("cosine " << cosine);
    Adam a({param()}, {.lr = 0.1});
    OneCycleLR sched(a, {.max_lr = 0.5, .total_steps = 12, .pct_start = 0.4, .cosine = cosine});
    for (int i = 0; i < 11; ++i) sched.step();
    const double last = lr(a), beta1 = a.param_groups()[0].options.at("beta1");
    sched.step();  // after the 12th and last optimizer step
    CHECK(lr(a) == last);
    CHECK(a.param_groups()[0].options.at("beta1") == beta1);
    // The optimizer's state, as a checkpoint of the finished run holds it, loads.
    Adam b({param()}, {.lr = 0.1});
    CHECK_NOTHROW(b.load_state_dict(a.state_dict()));
    CHECK(lr(b) == last);
    CHECK_THROWS_WITH(sched.step(), Contains("stepped 13 times but total_steps is 12"));
  }
}
