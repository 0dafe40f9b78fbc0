// What a collective that fails with no caller waiting does to the process
// (collectives/async_error.h), with the report and the ending injected; the
// real ending, through lockstep-run, is in test_launcher.cpp, and the NCCL
// watchdog's in tests/gpu/test_nccl_group.cpp.
#include <catch2/catch.hpp>

#include <map>

#include "lockstep/collectives/async_error.h"
#include "support/test_util.h"

using namespace lockstep::collectives;
using lockstep::testing::error_of;
using Catch::Matchers::Contains;

namespace {

const AsyncFailure kTimeout{"rank 3 of group 'default' (nccl, 8 ranks)",
                            "allreduce #41 (bf16, 25000000 elements, sum) timed out after 600 s"};

struct Recorded {
  std::vector<std::string> reports;
  std::vector<int> exit_codes;
  ProcessEnding hooks() {
    return {[this](const std::string& r) { reports.push_back(r); },
            [this](int code) { exit_codes.push_back(code); }};
  }
};

lockstep::runtime::EnvLookup env_with(std::optional<std::string> value) {
  return [value](const std::string& name) -> std::optional<std::string> {
    if (name == "LOCKSTEP_ASYNC_ERROR_HANDLING") return value;
    return std::nullopt;
  };
}

}  // namespace

TEST_CASE("By default a collective failing with no caller waiting ends the process, saying why",
          "[collectives][async_error]") {
  Recorded recorded;
  on_async_failure(async_error_handling_from_env(env_with(std::nullopt)), kTimeout,
                   recorded.hooks());
  REQUIRE(recorded.reports.size() == 1);
  CHECK_THAT(recorded.reports[0],
             Contains("lockstep: rank 3 of group 'default' (nccl, 8 ranks): allreduce #41 "
                      "(bf16, 25000000 elements, sum) timed out after 600 s") &&
                 Contains("this process ends now") &&
                 Contains("LOCKSTEP_ASYNC_ERROR_HANDLING=fail-works"));
  CHECK(recorded.exit_codes == std::vector<int>{1});
}

TEST_CASE("fail-works leaves the process alone: the Works carry the error",
          "[collectives][async_error]") {
  Recorded recorded;
  on_async_failure(async_error_handling_from_env(env_with("fail-works")), kTimeout,
                   recorded.hooks());
  CHECK(recorded.reports.empty());
  CHECK(recorded.exit_codes.empty());
  CHECK(async_error_handling_from_env(env_with("end-process")) ==
        AsyncErrorHandling::end_process);
}

TEST_CASE("LOCKSTEP_ASYNC_ERROR_HANDLING with another value is refused, naming it",
          "[collectives][async_error]") {
  for (const char* bad : {"", "1", "abort", "End-Process"}) {
    CHECK_THAT(error_of([&] { async_error_handling_from_env(env_with(std::string(bad))); }),
               Contains(std::string("LOCKSTEP_ASYNC_ERROR_HANDLING='") + bad + "'") &&
                   Contains("use end-process") && Contains("or fail-works"));
  }
}
