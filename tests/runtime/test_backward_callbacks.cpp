#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "lockstep/runtime/autograd/backward_callbacks.h"
#include "lockstep/runtime/ops.h"
#include "support/test_util.h"

using namespace lockstep::runtime;

TEST_CASE("backward callbacks run once after every gradient, in queue order", "[autograd]") {
  Tensor a = Tensor::ones({3}).requires_grad_();
  Tensor b = Tensor::ones({3}).requires_grad_();
  std::vector<std::string> events;
  a.register_post_accumulate_grad_hook([&](Tensor&) {
    events.push_back("a");
    REQUIRE(in_backward());
    queue_backward_callback([&] {
      events.push_back("first");
      queue_backward_callback([&] { events.push_back("queued by a callback"); });
    });
    queue_backward_callback([&] { events.push_back("second"); });
  });
  b.register_post_accumulate_grad_hook([&](Tensor&) { events.push_back("b"); });
  sum(mul(a, b)).backward();
  REQUIRE(events.size() == 5);
  REQUIRE(events[2] == "first");
  REQUIRE(events[3] == "second");
  REQUIRE(events[4] == "queued by a callback");
  REQUIRE_FALSE(in_backward());
  // The next backward starts with no callbacks left over.
  events.clear();
  sum(b).backward();
  REQUIRE(events == std::vector<std::string>{"b"});
}

TEST_CASE("queue_backward_callback outside backward is an error", "[autograd]") {
  REQUIRE_THAT(lockstep::testing::error_of([] { queue_backward_callback([] {}); }),
               Catch::Contains("no backward pass is running"));
}

TEST_CASE("an exception from a backward callback leaves backward and drops the rest",
          "[autograd]") {
  Tensor a = Tensor::ones({2}).requires_grad_();
  int ran = 0;
  a.register_post_accumulate_grad_hook([&](Tensor&) {
    queue_backward_callback([] { throw lockstep::Error("callback failed"); });
    queue_backward_callback([&] { ++ran; });
  });
  REQUIRE_THAT(lockstep::testing::error_of([&] { sum(a).backward(); }),
               Catch::Contains("callback failed"));
  REQUIRE(ran == 0);
  REQUIRE_FALSE(in_backward());
}

TEST_CASE("running_backward_roots names the node each backward started from, outermost first",
          "[autograd]") {
  using Roots = std::vector<const Node*>;
  REQUIRE(running_backward_roots().empty());
  Tensor a = Tensor::ones({3}).requires_grad_();
  Tensor b = Tensor::ones({3}).requires_grad_();
  Tensor inner_loss = sum(mul(b, b));
  Roots seen_in_a, seen_in_b, seen_after_inner;
  b.register_post_accumulate_grad_hook([&](Tensor&) { seen_in_b = running_backward_roots(); });
  a.register_post_accumulate_grad_hook([&](Tensor&) {
    seen_in_a = running_backward_roots();
    inner_loss.backward();  // a hook's own backward has its own root
    seen_after_inner = running_backward_roots();
  });
  Tensor loss = sum(a);
  loss.backward();
  CHECK(seen_in_a == Roots{loss.grad_fn().get()});
  CHECK(seen_in_b == Roots{loss.grad_fn().get(), inner_loss.grad_fn().get()});
  CHECK(seen_after_inner == Roots{loss.grad_fn().get()});
  CHECK(running_backward_roots().empty());
}

TEST_CASE("an outermost backward callback queued in a nested backward runs when the outer one "
          "ends",
          "[autograd]") {
  Tensor a = Tensor::ones({3}).requires_grad_();
  Tensor b = Tensor::ones({3}).requires_grad_();
  Tensor inner_loss = sum(mul(b, b));
  std::vector<std::string> events;
  b.register_post_accumulate_grad_hook([&](Tensor&) {
    events.push_back("b");
    queue_outermost_backward_callback([&] { events.push_back("outer ended"); });
    queue_backward_callback([&] { events.push_back("inner ended"); });
  });
  a.register_post_accumulate_grad_hook([&](Tensor&) {
    inner_loss.backward();
    events.push_back("a");
  });
  sum(a).backward();
  CHECK(events == std::vector<std::string>{"b", "inner ended", "a", "outer ended"});
  REQUIRE_THAT(lockstep::testing::error_of([] { queue_outermost_backward_callback([] {}); }),
               Catch::Contains("no backward pass is running"));
}
