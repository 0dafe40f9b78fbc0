// The engine's lanes (runtime/autograd/node.h, AutogradLane): each lane's
// nodes run on a thread of their own, at the same time as the others', and
// gradients meeting in one node are summed in a fixed order.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "lockstep/runtime/autograd/node.h"
#include "lockstep/runtime/ops.h"
#include "support/test_util.h"

namespace lt = lockstep::testing;
using lockstep::runtime::AutogradLane;
using lockstep::runtime::BackwardArgs;
using lockstep::runtime::Device;
using lockstep::runtime::Tensor;

namespace {

// Lets `n` parties meet; false when they did not all arrive within 20 s.
class Meeting {
 public:
  explicit Meeting(int n) : waiting_(n) {}
  bool arrive() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (--waiting_ == 0) cv_.notify_all();
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return waiting_ <= 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int waiting_;
};

// y = x, whose backward runs `during_backward` first.
Tensor marked(const Tensor& x, std::function<void()> during_backward) {
  return lockstep::runtime::record(x.clone().detach(), "Marked", {x}, {},
                                   [during_backward](const BackwardArgs& a) {
                                     during_backward();
                                     return std::vector<Tensor>{a.grad};
                                   });
}

}  // namespace

TEST_CASE("autograd lanes: each lane's backward runs on its own thread, concurrently",
          "[autograd][lanes]") {
  Tensor w = Tensor::ones({4}).requires_grad_();
  Meeting meeting(3);
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::vector<int> met(3, 0);  // not vector<bool>: written from three threads
  std::vector<Tensor> parts(3);
  const auto branch = [&](int lane) {
    return marked(w * double(lane + 1), [&, lane] {
      {
        std::lock_guard<std::mutex> guard(mutex);
        threads.insert(std::this_thread::get_id());
      }
      met[static_cast<size_t>(lane)] = meeting.arrive() ? 1 : 0;  // all three at once, or none
    });
  };
  parts[0] = branch(0);
  std::vector<std::thread> recorders;
  for (int lane = 1; lane < 3; ++lane) {
    recorders.emplace_back([&, lane] {
      AutogradLane on(lane, Device::cpu());
      parts[static_cast<size_t>(lane)] = branch(lane);
    });
  }
  for (auto& t : recorders) t.join();
  lockstep::runtime::sum(lockstep::runtime::cat(parts, 0)).backward();
  CHECK(met == std::vector<int>{1, 1, 1});
  CHECK(threads.size() == 3);
  CHECK(threads.count(std::this_thread::get_id()) == 1);  // lane 0: the caller
  lt::check_close(w.grad(), {6, 6, 6, 6});
}

TEST_CASE("autograd lanes: an error in one lane's backward ends the pass and is rethrown",
          "[autograd][lanes]") {
  Tensor w = Tensor::ones({2}).requires_grad_();
  Tensor a = w * 2.0;
  Tensor b;
  std::thread([&] {
    AutogradLane on(1, Device::cpu());
    b = marked(w * 3.0, [] { throw lockstep::Error("lane 1 failed on purpose"); });
  }).join();
  CHECK_THROWS_WITH(lockstep::runtime::sum(a + b).backward(),
                    Catch::Contains("lane 1 failed on purpose"));
}

TEST_CASE("autograd lanes: the same graph gives the same bits every time", "[autograd][lanes]") {
  lockstep::runtime::Generator g(3);
  const Tensor x = lockstep::runtime::randn({64}, lockstep::runtime::DType::f32, g);
  std::vector<Tensor> grads;
  for (int run = 0; run < 5; ++run) {
    Tensor w = x.clone().requires_grad_();
    std::vector<Tensor> parts(4);
    std::vector<std::thread> recorders;
    for (int lane = 0; lane < 4; ++lane) {
      recorders.emplace_back([&, lane] {
        std::optional<AutogradLane> on;
        if (lane > 0) on.emplace(lane, Device::cpu());
        parts[static_cast<size_t>(lane)] = lockstep::runtime::exp(w * (0.1 * (lane + 1)));
      });
    }
    for (auto& t : recorders) t.join();
    lockstep::runtime::sum(parts[0] + parts[1] + parts[2] + parts[3]).backward();
    grads.push_back(w.grad());
  }
  for (size_t i = 1; i < grads.size(); ++i) CHECK(lt::bitwise_equal(grads[i], grads[0]));
}
