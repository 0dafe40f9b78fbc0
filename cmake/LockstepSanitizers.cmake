# LOCKSTEP_SANITIZE: build the library, tools, tests, examples and benchmarks
# with compiler sanitizers. A comma-separated list of "address", "undefined",
# "leak" and "thread" (thread excludes address and leak), e.g.
#   -DLOCKSTEP_SANITIZE=address,undefined     AddressSanitizer (with leaks) + UBSan
#   -DLOCKSTEP_SANITIZE=thread                ThreadSanitizer
# Undefined behaviour stops the program at its first report
# (-fno-sanitize-recover). Tests run with the options tests/CMakeLists.txt
# sets (the leak suppressions in tests/sanitizers/). C++ only: CUDA device code is
# not instrumented. LOCKSTEP_SANITIZE_FLAGS holds the flags, for builds that
# link against this one (the install test's consumer).
set(LOCKSTEP_SANITIZE "" CACHE STRING
  "Sanitizers for everything built: address,undefined or thread (empty: none)")

set(LOCKSTEP_SANITIZE_FLAGS "")
if(LOCKSTEP_SANITIZE)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    message(FATAL_ERROR "LOCKSTEP_SANITIZE needs GCC or Clang, not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  string(REPLACE "," ";" _sanitizers "${LOCKSTEP_SANITIZE}")
  foreach(s IN LISTS _sanitizers)
    if(NOT s MATCHES "^(address|undefined|leak|thread)$")
      message(FATAL_ERROR "LOCKSTEP_SANITIZE=${LOCKSTEP_SANITIZE}: '${s}' is not one of "
        "address, undefined, leak, thread (e.g. -DLOCKSTEP_SANITIZE=address,undefined)")
    endif()
  endforeach()
  if("thread" IN_LIST _sanitizers AND ("address" IN_LIST _sanitizers OR "leak" IN_LIST _sanitizers))
    message(FATAL_ERROR "LOCKSTEP_SANITIZE=${LOCKSTEP_SANITIZE}: ThreadSanitizer cannot be "
      "combined with AddressSanitizer or LeakSanitizer; build them separately")
  endif()
  set(LOCKSTEP_SANITIZE_FLAGS -fsanitize=${LOCKSTEP_SANITIZE} -fno-omit-frame-pointer)
  if("undefined" IN_LIST _sanitizers)
    list(APPEND LOCKSTEP_SANITIZE_FLAGS -fno-sanitize-recover=undefined)
  endif()
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:${LOCKSTEP_SANITIZE_FLAGS}>")
  add_link_options(${LOCKSTEP_SANITIZE_FLAGS})
endif()

# lockstep_driver_code(<target>): a target whose own code only drives the
# library (tests, their workers, examples, benchmarks). Sanitized, it is
# compiled at -O0: optimising instrumented code takes two to three times as
# long, and little of a test's time is spent in its own code. The library keeps
# the build type's optimisation, so what the tests exercise runs at speed.
function(lockstep_driver_code target)
  if(LOCKSTEP_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-O0>)
  endif()
endfunction()

# lockstep_test_code(<target>): driver code whose only job is to check (the
# tests, their workers, the README's program). In an optimising build it is
# compiled at -O1: -O3 takes about 1.6 times as long to compile it, and the
# library under test keeps the build type's optimisation. A sanitized build
# compiles it at -O0 (lockstep_driver_code).
#
# A sanitized test executable is linked without PIE: the instrumented test
# binary had about 7 million relative relocations, and applying them (and
# copying the pages they touch) took about 0.8 s of each test process's
# 1.45 s start, paid by every one of the ~1200 tests (0.65 s without).
#
# Under AddressSanitizer the test code's own globals are not instrumented
# (GCC's asan-globals=0): at -O0 every string literal of every CHECK became
# a global with a redzone and a descriptor (about 0.7 MB per test file, three
# quarters of the binary's data), and registering them all took most of the
# rest of each test process's start. The library's globals stay checked.
function(lockstep_test_code target)
  lockstep_driver_code(${target})
  if(NOT LOCKSTEP_SANITIZE)
    target_compile_options(${target} PRIVATE
      $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release,RelWithDebInfo>>:-O1>)
  else()
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      target_link_options(${target} PRIVATE -no-pie)
    endif()
    if(LOCKSTEP_SANITIZE MATCHES "address" AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:--param=asan-globals=0>)
    endif()
  endif()
endfunction()
