// Autograd on several threads at once: independent backward passes whose
// graphs share a leaf (a parameter) add every gradient into its .grad, and
// hooks registered meanwhile from other threads are all kept.
#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/ops/elementwise.h"
#include "lockstep/runtime/ops/reduce.h"
#include "lockstep/runtime/tensor.h"

using namespace lockstep::runtime;

TEST_CASE("concurrent backward passes into one leaf lose no gradient", "[runtime][autograd]") {
  constexpr int kThreads = 4, kSteps = 200;
  Tensor w = Tensor::ones({256, 256});
  w.requires_grad_();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&w] {
      for (int i = 0; i < kSteps; ++i) sum(mul(w, 1.0)).backward();
    });
  }
  for (std::thread& t : threads) t.join();
  const std::vector<float> g = w.grad().to_vector<float>();
  int64_t wrong = 0;
  for (float v : g) wrong += v != kThreads * kSteps;
  CHECK(wrong == 0);
}

TEST_CASE("hooks registered and removed while another thread runs backward are all kept",
          "[runtime][autograd]") {
  // As PyTorch: a hook may be registered on a leaf while a backward on
  // another thread accumulates into it and runs its hooks.
  constexpr int kThreads = 2, kHooks = 4000;
  Tensor w = Tensor::ones({4});
  w.requires_grad_();
  std::atomic<int64_t> fired{0};
  std::atomic<bool> stop{false};
  std::thread backward([&] {
    while (!stop) sum(mul(w, 2.0)).backward();
  });
  std::vector<std::vector<int64_t>> ids(kThreads);
  std::vector<std::thread> registering;
  for (int t = 0; t < kThreads; ++t) {
    registering.emplace_back([&, t] {
      for (int i = 0; i < kHooks; ++i) {
        ids[t].push_back(w.register_post_accumulate_grad_hook([&](const Tensor&) { ++fired; }));
        if (i % 2 == 1) w.remove_hook(ids[t][i - 1]);  // every other one goes again
      }
    });
  }
  for (std::thread& t : registering) t.join();
  stop = true;
  backward.join();

  std::set<int64_t> unique;
  for (const auto& mine : ids) unique.insert(mine.begin(), mine.end());
  CHECK(unique.size() == kThreads * kHooks);  // no id given twice
  fired = 0;
  sum(mul(w, 2.0)).backward();
  CHECK(fired == kThreads * kHooks / 2);
}

TEST_CASE("a node released by one backward pass while another runs it keeps its function alive",
          "[runtime][autograd]") {
  // Two losses share h. Pass B (retain_graph) is inside h's backward function
  // when pass A (no retain_graph) runs the same node and frees what it saved
  // and its function. B's call must still have its function (and what it
  // captured) to the end, as in PyTorch.
  Tensor w = Tensor::full({4}, 3.0);
  w.requires_grad_();
  auto token = std::make_shared<int>(0);
  const std::weak_ptr<int> captured = token;
  std::promise<void> entered, resume;
  std::shared_future<void> resumed = resume.get_future().share();
  std::atomic<int> calls{0};
  std::atomic<bool> alive_to_the_end{false};
  const Tensor h = record(mul(w, 2.0), "Blocking", {w}, {w},
                          [token, &entered, resumed, &calls, &alive_to_the_end,
                           &captured](const BackwardArgs& a) {
                            if (calls++ == 0) {  // pass B: wait until A has released the node
                              entered.set_value();
                              resumed.wait();
                              alive_to_the_end = !captured.expired();
                            }
                            return std::vector<Tensor>{mul(a.grad, 2.0)};
                          });
  token.reset();
  std::thread b([&] { sum(h).backward({}, true); });
  entered.get_future().wait();
  sum(mul(h, 1.0)).backward();  // pass A, which frees h's node
  resume.set_value();
  b.join();
  CHECK(alive_to_the_end);
  for (float v : w.grad().to_vector<float>()) CHECK(v == 4.0f);
  // Sequentially, a third pass through the released node is the usual error.
  CHECK_THROWS_WITH(sum(h).backward(), Catch::Contains("backward through the graph a second time"));
}
