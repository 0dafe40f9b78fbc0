#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "lockstep/collectives/work.h"
#include "support/test_util.h"

namespace lc = lockstep::collectives;
using lockstep::testing::error_of;
using namespace std::chrono_literals;

namespace {

std::shared_ptr<lc::Work> make(std::chrono::milliseconds timeout, std::function<void()> on_timeout = {}) {
  return std::make_shared<lc::Work>("allreduce #3 (f32, 4 elements, sum)",
                                    lc::Work::Clock::now() + timeout,
                                    "allreduce #3 timed out on rank 1", std::move(on_timeout));
}

}  // namespace

TEST_CASE("Work: finish from another thread completes wait", "[collectives]") {
  auto work = make(60s);
  CHECK_FALSE(work->is_completed());
  std::thread finisher([&] { work->finish(); });
  work->wait();
  finisher.join();
  CHECK(work->is_completed());
  CHECK(work->exception() == nullptr);
  work->wait();  // returns at once on later calls
}

TEST_CASE("Work: an error given to finish is rethrown by every wait", "[collectives]") {
  auto work = make(60s);
  work->finish(std::make_exception_ptr(lc::CollectiveError("peer 2 closed the connection")));
  CHECK(work->is_completed());
  CHECK(work->exception() != nullptr);
  CHECK_THROWS_AS(work->wait(), lc::CollectiveError);
  CHECK_THROWS_WITH(work->wait(), "peer 2 closed the connection");
}

TEST_CASE("Work: the deadline gives the timeout message and calls on_timeout once",
          "[collectives]") {
  std::atomic<int> calls{0};
  auto work = make(50ms, [&] { ++calls; });
  CHECK(error_of([&] { work->wait(); }) == "allreduce #3 timed out on rank 1");
  CHECK(work->is_completed());
  CHECK(calls == 1);
  CHECK(error_of([&] { work->wait(); }) == "allreduce #3 timed out on rank 1");
  CHECK(calls == 1);
  // A late finish after the timeout is dropped.
  work->finish();
  CHECK_THROWS_AS(work->wait(), lc::CollectiveError);
  CHECK(calls == 1);
}

TEST_CASE("Work: finish before the deadline means no timeout", "[collectives]") {
  std::atomic<int> calls{0};
  auto work = make(1ms, [&] { ++calls; });
  work->finish();
  std::this_thread::sleep_for(5ms);
  CHECK_NOTHROW(work->wait());
  CHECK(calls == 0);
}
