// SerialExecutor: the queue, worker and stop logic every CPU backend's
// front shares.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "lockstep/collectives/serial_executor.h"

namespace lc = lockstep::collectives;

TEST_CASE("SerialExecutor: stopped once its last call's Work has completed, it fails nothing",
          "[collectives]") {
  // A group is dropped the moment the caller sees its last collective done;
  // the worker may not yet have marked the call as no longer running. That
  // used to count as "destroyed with collectives unfinished": the group
  // aborted, and gloo told its peers (and left an abort key in the store).
  // The caller spins on is_completed() so it reaches stop() as early as it
  // can; many rounds, as the window is microseconds wide.
  int failed = 0, round = 0;
  std::string reason;
  for (; round < 2000 && failed == 0; ++round) {
    lc::SerialExecutor::Hooks hooks;
    hooks.where = "the test's executor";
    hooks.abort = std::make_shared<lc::AbortState>();
    hooks.fail = [&](const std::string& why) {
      ++failed;
      reason = why;
    };
    hooks.run_on_waiter = false;  // the call runs on the worker, as gloo's and shm+gloo's do
    auto executor = std::make_shared<lc::SerialExecutor>(std::move(hooks));
    executor->start();
    lc::Call call;
    call.op = "allreduce";
    call.timeout = std::chrono::seconds(60);
    call.deadline = lc::Work::Clock::now() + call.timeout;
    const auto work = executor->submit(call, [](const lc::Call&) {});
    while (!work->is_completed()) {
    }
    executor->stop();
  }
  INFO("round " << round);
  CHECK(reason == "");
  CHECK(failed == 0);
}
