// Autograd on several threads at once: independent backward passes whose
// graphs share a leaf (a parameter) add every gradient into its .grad.
#include <catch2/catch.hpp>

#include <thread>
#include <vector>

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
