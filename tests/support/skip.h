// LOCKSTEP_SKIP_IF(reason): ends the test case (or the void helper it is in)
// when `reason`, a string, is not empty, printing "SKIPPED: <reason>", which
// ctest reports as a skipped test (SKIP_REGULAR_EXPRESSION, tests/CMakeLists.txt).
// Each support header says why its kind of test may not run here
// (gpu_skip.h, backend_skip.h, mpirun.h).
#pragma once

#include <iostream>
#include <string>

#define LOCKSTEP_SKIP_IF(reason)                                                  \
  do {                                                                            \
    const std::string lockstep_skip_reason_ = (reason);                           \
    if (!lockstep_skip_reason_.empty()) {                                         \
      std::cout << "SKIPPED: " << lockstep_skip_reason_ << std::endl;             \
      return;                                                                     \
    }                                                                             \
  } while (0)
