// Tests that need an optional collectives backend (gloo, mpi) skip where it
// is not built in, printing "SKIPPED: <reason>" as the GPU tests do
// (gpu_skip.h). Tests whose ranks are threads and that test something above
// the collectives use kThreadRankBackend, which every build has.
#pragma once

#include <string>
#include <vector>

#include "lockstep/collectives/backend_registry.h"
#include "lockstep/config.h"
#include "support/skip.h"

namespace lockstep::testing {

// gloo where built in (the backend these tests were written against), else
// shm, which is always built in.
inline constexpr const char* kThreadRankBackend = LOCKSTEP_HAVE_GLOO ? "gloo" : "shm";

// The CPU backends every collective runs on in this build: shm, and gloo
// where built in.
inline std::vector<std::string> cpu_backends() {
  std::vector<std::string> names = {"shm"};
  if (LOCKSTEP_HAVE_GLOO) names.push_back("gloo");
  return names;
}

// The same, and the hierarchical group over them (shm+gloo), for tests of
// what every group does whatever carries its calls.
inline std::vector<std::string> cpu_backends_and_hierarchical() {
  std::vector<std::string> names = cpu_backends();
  if (LOCKSTEP_HAVE_GLOO) names.push_back("shm+gloo");
  return names;
}

// Empty when `backend` is built in; otherwise why the test cannot run.
inline std::string backend_skip_reason(const std::string& backend) {
  try {
    collectives::require_backend(backend);
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace lockstep::testing

#define LOCKSTEP_SKIP_UNLESS_BACKEND(backend) \
  LOCKSTEP_SKIP_IF(::lockstep::testing::backend_skip_reason(backend))
