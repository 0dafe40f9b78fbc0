// DDP's unused and frozen parameters, over rank threads: a gradient
// accumulated under no_sync() (or not zeroed since the last step) for a
// parameter the averaged backward does not reach still takes part in the
// average, with or without gradient_as_bucket_view; ranks that freeze
// different parameters fail at construction; a parameter frozen or unfrozen
// after wrapping fails at the next forward, and one frozen between forward
// and backward is named as frozen; a module wrapped again while
// its first wrapper lives trains through the new one; any finite positive
// bucket cap is taken.
#include <catch2/catch.hpp>

#include <limits>

#include "lockstep/runtime/autograd/grad_mode.h"
#include "nn/ddp/ddp_fixture.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
namespace nn = lockstep::nn;
using lockstep::nn::DdpOptions;
using lockstep::nn::DistributedDataParallel;
using lockstep::runtime::Tensor;

namespace {

// Two parameters of 4 elements; forward(x) = x * a (+ x * b when use_b), so
// with loss = sum(out) the gradient of a (and of b, when used) is x.
class TwoParams : public nn::Module {
 public:
  TwoParams() {
    a = register_parameter("a", Tensor::ones({4}));
    b = register_parameter("b", Tensor::ones({4}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = lockstep::runtime::mul(x, a);
    return use_b ? lockstep::runtime::add(y, lockstep::runtime::mul(x, b)) : y;
  }
  Tensor a, b;
  bool use_b = true;
};

Tensor filled(double v) { return lockstep::runtime::mul(Tensor::ones({1, 4}), v); }

void step(DistributedDataParallel& ddp, double x) {
  lockstep::runtime::sum(ddp.forward(filled(x))).backward();
}

// "" when every element of `t` is `want` (exactly: the probes' values are
// small integers and halves), else what it holds.
std::string expect(const std::string& what, const Tensor& t, double want) {
  if (!t.defined()) return what + " is undefined, expected " + std::to_string(want);
  for (double v : t.to_vector<double>()) {
    if (v != want) return fmt::format("{} holds {}, expected {}", what, v, want);
  }
  return "";
}

}  // namespace

TEST_CASE("DDP find_unused_parameters: a gradient accumulated before the averaged backward is "
          "averaged even where that backward does not use the parameter",
          "[ddp]") {
  const bool view = GENERATE(false, true);
  INFO("gradient_as_bucket_view = " << view);
  const DdpOptions options{.find_unused_parameters = true, .gradient_as_bucket_view = view};

  SECTION("under no_sync every rank uses b; then only rank 0 does") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      DistributedDataParallel ddp(m, group, options);
      {
        auto guard = ddp.no_sync();
        step(ddp, r + 1);  // b.grad: 1 on rank 0, 2 on rank 1
      }
      m->use_b = r == 0;
      step(ddp, 10 * (r + 1));
      // a: (1 + 10 + 2 + 20) / 2; b: (1 + 10 + 2) / 2, not rank 0's 11 / 2.
      if (auto p = expect("a.grad", m->a.grad(), 16.5); !p.empty()) return p;
      return expect("b.grad", m->b.grad(), 6.5);
    });
    CHECK(lt::joined(problems) == "");
  }

  SECTION("under no_sync every rank uses b; then none does") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      DistributedDataParallel ddp(m, group, options);
      {
        auto guard = ddp.no_sync();
        step(ddp, r + 1);
      }
      m->use_b = false;
      step(ddp, 10 * (r + 1));
      // Used under no_sync, so averaged: (1 + 2) / 2 on both ranks, not each
      // rank's own sum left in place.
      if (auto p = expect("a.grad", m->a.grad(), 16.5); !p.empty()) return p;
      return expect("b.grad", m->b.grad(), 1.5);
    });
    CHECK(lt::joined(problems) == "");
  }

  SECTION("under no_sync only rank 0 uses b; then none does") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      DistributedDataParallel ddp(m, group, options);
      m->use_b = r == 0;
      {
        auto guard = ddp.no_sync();
        step(ddp, r + 1);  // b.grad: 1 on rank 0, undefined on rank 1
      }
      m->use_b = false;
      step(ddp, 10 * (r + 1));
      return expect("b.grad", m->b.grad(), 0.5);
    });
    CHECK(lt::joined(problems) == "");
  }

  SECTION("not zeroed after a step: the old average is part of the next one") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      DistributedDataParallel ddp(m, group, options);
      step(ddp, r + 1);  // b.grad = 1.5 on both
      if (auto p = expect("step 1 b.grad", m->b.grad(), 1.5); !p.empty()) return p;
      m->use_b = r == 0;
      step(ddp, 10 * (r + 1));  // rank 0: 1.5 + 10, rank 1: 1.5
      // (11.5 + 1.5) / 2: one process accumulating both steps' averages.
      if (auto p = expect("a.grad", m->a.grad(), 1.5 + 15); !p.empty()) return p;
      return expect("b.grad", m->b.grad(), 6.5);
    });
    CHECK(lt::joined(problems) == "");
  }

  SECTION("not zeroed after a step, then used by no rank: .grad is kept") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      DistributedDataParallel ddp(m, group, options);
      step(ddp, r + 1);
      m->use_b = false;
      step(ddp, r + 1);  // no zero_grad: a accumulates, b is left alone
      if (auto p = expect("a.grad", m->a.grad(), 3); !p.empty()) return p;
      return expect("b.grad", m->b.grad(), 1.5);
    });
    CHECK(lt::joined(problems) == "");
  }

  SECTION("an accumulation dropped by zero_grad is not averaged in") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      DistributedDataParallel ddp(m, group, options);
      {
        auto guard = ddp.no_sync();
        step(ddp, r + 1);
      }
      ddp.zero_grad();
      m->use_b = false;
      step(ddp, 10 * (r + 1));
      if (auto p = expect("a.grad", m->a.grad(), 15); !p.empty()) return p;
      if (m->b.grad().defined()) return "b.grad was written though no rank holds a gradient";
      // And the next averaged step counts from scratch.
      ddp.zero_grad();
      m->use_b = r == 1;
      step(ddp, r + 1);
      return expect("b.grad", m->b.grad(), 1);
    });
    CHECK(lt::joined(problems) == "");
  }
}

TEST_CASE("DDP gradient_as_bucket_view: the .grad of a parameter no rank used keeps its bits "
          "at 3 ranks",
          "[ddp]") {
  // (1 + 2 + 4) / 3 is not a float that thirds and sums back to itself, so
  // a reduction of the unused bucket view in place would change its bits.
  const auto problems = lt::on_ranks(3, [&](int r, auto group) -> std::string {
    auto m = std::make_shared<TwoParams>();
    DistributedDataParallel ddp(
        m, group, DdpOptions{.find_unused_parameters = true, .gradient_as_bucket_view = true});
    step(ddp, 1 << r);
    const Tensor before = m->b.grad().clone();
    m->use_b = false;
    for (int i = 0; i < 3; ++i) {
      step(ddp, 1 << r);
      if (!lt::bitwise_equal(m->b.grad(), before)) {
        return fmt::format("b.grad changed at unused step {}: {} vs {}", i,
                           m->b.grad().to_vector<double>()[0], before.to_vector<double>()[0]);
      }
    }
    return "";
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: ranks that freeze different parameters fail at construction, naming them",
          "[ddp]") {
  SECTION("rank 0 freezes a, rank 1 freezes b") {
    const auto problems = lt::on_ranks(2, [](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      (r == 0 ? m->a : m->b).requires_grad_(false);
      DistributedDataParallel ddp(m, group);
      return "constructed";
    });
    for (const auto& p : problems) {
      INFO(p);
      REQUIRE_THAT(p, Catch::Contains("the ranks freeze different parameters") &&
                          Catch::Contains("Parameter #0 'a' [4] f32 requires grad on rank 1 and "
                                          "is frozen (requires_grad false) on rank 0"));
    }
  }
  SECTION("at 3 ranks, one freezes b") {
    const auto problems = lt::on_ranks(3, [](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      if (r == 1) m->b.requires_grad_(false);
      DistributedDataParallel ddp(m, group);
      return "constructed";
    });
    for (const auto& p : problems) {
      INFO(p);
      REQUIRE_THAT(p, Catch::Contains("Parameter #1 'b' [4] f32 requires grad on ranks 0, 2 and "
                                      "is frozen (requires_grad false) on rank 1"));
    }
  }
  SECTION("the same frozen parameters everywhere are fine") {
    const auto problems = lt::on_ranks(2, [](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      m->b.requires_grad_(false);
      DistributedDataParallel ddp(m, group);
      step(ddp, r + 1);
      if (m->b.grad().defined()) return "a frozen parameter got a gradient";
      return expect("a.grad", m->a.grad(), 1.5);
    });
    CHECK(lt::joined(problems) == "");
  }
}

TEST_CASE("DDP: requires_grad changed after wrapping fails at the next forward, naming the "
          "parameter",
          "[ddp]") {
  const bool find_unused = GENERATE(false, true);
  INFO("find_unused_parameters = " << find_unused);
  SECTION("unfrozen after wrapping: its gradient would never be averaged") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      m->b.requires_grad_(false);
      {
        DistributedDataParallel ddp(m, group, DdpOptions{.find_unused_parameters = find_unused});
        m->b.requires_grad_(true);
        const std::string error = lt::error_of([&] { step(ddp, r + 1); });
        for (const char* part : {"parameter 'b' was unfrozen after the module was wrapped",
                                 "never be averaged", "Re-wrap the module"}) {
          if (error.find(part) == std::string::npos)
            return "no \"" + std::string(part) + "\" in: " + error;
        }
        // Under no_sync too: the accumulated gradient would never be averaged.
        auto guard = ddp.no_sync();
        if (lt::error_of([&] { step(ddp, r + 1); }).find("'b' was unfrozen") == std::string::npos)
          return "not caught under no_sync";
      }
      // Re-wrapped: both are averaged.
      m->zero_grad();
      DistributedDataParallel ddp(m, group, DdpOptions{.find_unused_parameters = find_unused});
      step(ddp, r + 1);
      if (auto p = expect("a.grad", m->a.grad(), 1.5); !p.empty()) return p;
      return expect("b.grad", m->b.grad(), 1.5);
    });
    CHECK(lt::joined(problems) == "");
  }
  SECTION("frozen after wrapping") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      DistributedDataParallel ddp(m, group, DdpOptions{.find_unused_parameters = find_unused});
      step(ddp, r + 1);
      m->a.requires_grad_(false);
      const std::string error = lt::error_of([&] { step(ddp, r + 1); });
      if (error.find("parameter 'a' was frozen after the module was wrapped") ==
              std::string::npos ||
          error.find("Re-wrap the module") == std::string::npos)
        return "unexpected: " + error;
      // Undone: training goes on.
      m->a.requires_grad_(true);
      m->zero_grad();
      step(ddp, r + 1);
      return expect("a.grad", m->a.grad(), 1.5);
    });
    CHECK(lt::joined(problems) == "");
  }
  SECTION("an evaluation forward without gradients is not checked") {
    const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
      auto m = std::make_shared<TwoParams>();
      DistributedDataParallel ddp(m, group, DdpOptions{.find_unused_parameters = find_unused});
      m->a.requires_grad_(false);
      {
        lockstep::runtime::NoGradGuard no_grad;
        ddp.forward(filled(r + 1));
      }
      m->a.requires_grad_(true);
      step(ddp, r + 1);
      return expect("a.grad", m->a.grad(), 1.5);
    });
    CHECK(lt::joined(problems) == "");
  }
}

TEST_CASE("DDP: a parameter frozen between forward and backward is named as frozen, with or "
          "without find_unused_parameters and static_graph",
          "[ddp]") {
  // The advice for an unused parameter (turn on find_unused_parameters, use
  // every output in the loss, drop static_graph) would not help here.
  const int mode = GENERATE(0, 1, 2);
  const DdpOptions options{.find_unused_parameters = mode >= 1, .static_graph = mode == 2};
  INFO("find_unused_parameters = " << options.find_unused_parameters
                                   << ", static_graph = " << options.static_graph);
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto m = std::make_shared<TwoParams>();
    DistributedDataParallel ddp(m, group, options);
    step(ddp, r + 1);
    m->zero_grad();
    Tensor loss = lockstep::runtime::sum(ddp.forward(filled(r + 1)));
    m->b.requires_grad_(false);
    const std::string error = lt::error_of([&] { loss.backward(); });
    for (const char* part : {"received no gradient in this backward: 'b'",
                             "Of these, 'b' was frozen (requires_grad set to false) since this "
                             "iteration's forward checked the flags",
                             "re-wrap the module"}) {
      if (error.find(part) == std::string::npos)
        return "no \"" + std::string(part) + "\" in: " + error;
    }
    // Unfrozen again, training goes on.
    m->b.requires_grad_(true);
    m->zero_grad();
    step(ddp, r + 1);
    return expect("b.grad", m->b.grad(), 1.5);
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: a module wrapped again while its first wrapper lives trains through the new "
          "one; the old one's forward is refused",
          "[ddp]") {
  // Unfrozen after wrapping, then re-wrapped as the error says, with the old
  // wrapper still in scope: its hooks must not fail or average the new
  // wrapper's backward.
  const bool find_unused = GENERATE(false, true);
  INFO("find_unused_parameters = " << find_unused);
  const DdpOptions options{.find_unused_parameters = find_unused};
  const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
    auto m = std::make_shared<TwoParams>();
    m->b.requires_grad_(false);
    DistributedDataParallel old_ddp(m, group, options);
    step(old_ddp, r + 1);
    if (auto p = expect("a.grad", m->a.grad(), 1.5); !p.empty()) return p;
    m->b.requires_grad_(true);
    m->zero_grad();
    {
      DistributedDataParallel ddp(m, group, options);
      for (int i = 0; i < 2; ++i) {
        m->zero_grad();
        step(ddp, 2 * (r + 1));  // x = 2 and 4: each gradient averages to 3
        if (auto p = expect("a.grad", m->a.grad(), 3); !p.empty()) return p;
        if (auto p = expect("b.grad", m->b.grad(), 3); !p.empty()) return p;
      }
      const std::string error = lt::error_of([&] { step(old_ddp, r + 1); });
      if (error.find("parameter 'a' was wrapped in a newer DistributedDataParallel") ==
              std::string::npos ||
          error.find("Run forward through the newest wrapper") == std::string::npos)
        return "old wrapper's forward: " + error;
    }
    // The newer one destroyed, the old one hears its parameters again.
    m->b.requires_grad_(false);
    m->zero_grad();
    step(old_ddp, r + 1);
    return expect("a.grad", m->a.grad(), 1.5);
  });
  CHECK(lt::joined(problems) == "");
}

TEST_CASE("DDP: any finite positive bucket cap is taken; others are refused by name", "[ddp]") {
  SECTION("past int64's bytes, and under one byte") {
    for (const DdpOptions& options :
         {DdpOptions{.bucket_cap_mb = 1e13}, DdpOptions{.first_bucket_cap_mb = 1e-7},
          DdpOptions{.bucket_cap_mb = 1e300, .first_bucket_cap_mb = 1e-300}}) {
      const auto problems = lt::on_ranks(2, [&](int r, auto group) -> std::string {
        auto m = std::make_shared<TwoParams>();
        DistributedDataParallel ddp(m, group, options);
        step(ddp, r + 1);
        if (auto p = expect("a.grad", m->a.grad(), 1.5); !p.empty()) return p;
        return expect("b.grad", m->b.grad(), 1.5);
      });
      INFO("bucket_cap_mb " << options.bucket_cap_mb << ", first " << options.first_bucket_cap_mb);
      CHECK(lt::joined(problems) == "");
    }
  }
  SECTION("zero, negative, infinite and NaN") {
    const double inf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (const auto& bad :
         std::vector<std::pair<DdpOptions, std::string>>{
             {DdpOptions{.bucket_cap_mb = 0}, "bucket_cap_mb must"},
             {DdpOptions{.bucket_cap_mb = -1}, "bucket_cap_mb must"},
             {DdpOptions{.bucket_cap_mb = inf}, "bucket_cap_mb must"},
             {DdpOptions{.first_bucket_cap_mb = nan}, "first_bucket_cap_mb must"},
             {DdpOptions{.first_bucket_cap_mb = -inf}, "first_bucket_cap_mb must"}}) {
      const auto problems = lt::on_ranks(2, [&](int, auto group) -> std::string {
        const std::string error = lt::error_of(
            [&] { DistributedDataParallel ddp(std::make_shared<TwoParams>(), group, bad.first); });
        return error.find(bad.second + " be a finite positive number of MiB") != std::string::npos
                   ? ""
                   : "unexpected: " + error;
      });
      CHECK(lt::joined(problems) == "");
    }
  }
}
