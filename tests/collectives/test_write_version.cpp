// A collective writes its tensor as an in-place op would, and counts as one:
// what checks versions (autograd's saved tensors, autocast's cast cache) sees
// the values a broadcast or all-reduce put there.
#include <fmt/format.h>

#include <catch2/catch.hpp>

#include "collectives/rank_threads.h"
#include "support/backend_skip.h"
#include "lockstep/config.h"
#include "lockstep/runtime/autocast.h"
#include "lockstep/runtime/autograd/grad_mode.h"
#include "lockstep/runtime/ops.h"

namespace lc = lockstep::collectives;
namespace lr = lockstep::runtime;
namespace lt = lockstep::testing;
using lockstep::runtime::DType;
using lockstep::runtime::Tensor;

namespace {

// Each rank's failure, "" where it succeeded.
std::vector<std::string> on_two_ranks(const std::string& backend, const std::string& name,
                                      const std::function<void(int, lc::ProcessGroup&)>& fn) {
  const auto groups = lt::make_groups(backend, 2, name);
  const auto errors = lt::run_ranks(2, [&](int r) { fn(r, *groups[static_cast<size_t>(r)]); });
  std::vector<std::string> problems;
  for (const auto& e : errors) problems.push_back(e ? lt::message_of(e) : "");
  return problems;
}

}  // namespace

TEST_CASE("every collective that writes a tensor raises its version", "[collectives]") {
  for (const std::string& backend : lt::cpu_backends()) {
    const auto problems = on_two_ranks(backend, "write-version", [](int r, lc::ProcessGroup& g) {
      auto raised = [](const Tensor& t, auto&& call) {
        const uint64_t before = t.version();
        call()->wait();
        if (t.version() <= before) throw std::runtime_error("version unchanged");
      };
      Tensor t = Tensor::full({4}, static_cast<double>(r + 1));
      raised(t, [&] { return g.allreduce(t); });
      raised(t, [&] { return g.broadcast(t, {.root = 1}); });
      raised(t, [&] { return g.reduce(t, {.root = 0}); });
      Tensor all = Tensor::zeros({8});
      raised(all, [&] { return g.allgather(all, t); });
      Tensor mine = Tensor::zeros({4});
      raised(mine, [&] { return g.reduce_scatter(mine, all); });
      if (!LOCKSTEP_HAVE_GLOO) return;  // shm sends point to point through gloo
      if (r == 0) {
        g.send(t, 1)->wait();
      } else {
        raised(t, [&] { return g.recv(t, 0); });
      }
    });
    INFO(backend);
    CHECK(problems == std::vector<std::string>{"", ""});
  }
}

TEST_CASE("a tensor saved for backward and then broadcast into is refused at backward",
          "[collectives]") {
  // Before, the broadcast changed the weight without a trace, and backward
  // returned the gradient of a product the forward never computed.
  for (const std::string& backend : lt::cpu_backends()) {
    const auto problems = on_two_ranks(backend, "saved-then-broadcast", [](int r,
                                                                          lc::ProcessGroup& g) {
      Tensor w = Tensor::full({3}, static_cast<double>(r + 2)).requires_grad_(true);
      Tensor x = Tensor::full({3}, 1.0).requires_grad_(true);
      Tensor y = lr::mul(w, x);  // saves w for x's gradient
      {
        lr::NoGradGuard no_grad;
        g.broadcast(w, {.root = 0})->wait();
      }
      lr::sum(y).backward();
    });
    INFO(backend);
    // Rank 0's w is its own, but written by the broadcast all the same.
    for (const auto& p : problems) CHECK_THAT(p, Catch::Contains("in-place operation"));
  }
}

TEST_CASE("autocast casts a weight again after a broadcast wrote it", "[collectives][autocast]") {
  // The cast cache keys on the weight's version: before, a broadcast inside
  // the scope left the next matmul on the old weight's cast.
  for (const std::string& backend : lt::cpu_backends()) {
    const auto problems = on_two_ranks(backend, "autocast-broadcast", [](int r,
                                                                        lc::ProcessGroup& g) {
      Tensor w = Tensor::full({2, 2}, static_cast<double>(r + 1)).requires_grad_(true);
      Tensor x = Tensor::full({1, 2}, 1.0);
      auto amp = lr::autocast({.dtype = DType::bf16});
      Tensor before = lr::matmul(x, w);  // caches w's bf16 cast
      {
        lr::NoGradGuard no_grad;
        g.broadcast(w, {.root = 1})->wait();  // every rank now holds 2s
      }
      const double after = lr::sum(lr::matmul(x, w)).item();  // [[4, 4]]
      if (after != 8.0) throw std::runtime_error(fmt::format("the sum is {}, not 8", after));
      (void)before;
    });
    INFO(backend);
    CHECK(problems == std::vector<std::string>{"", ""});
  }
}
