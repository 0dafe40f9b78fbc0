# lockstep_discover_tests(<target>
#     [TEST_SPEC <spec>...] [PROPERTIES <name> <value>...]
#     [DISCOVERY_TIMEOUT <seconds>] [WORKING_DIRECTORY <dir>] [TEST_PREFIX <prefix>])
#
# Registers every Catch2 test case of <target> matching TEST_SPEC as its own
# ctest test, like catch_discover_tests() from Catch2's Catch.cmake, with the
# same POST_BUILD discovery. Catch2 2.13 (Debian 12) has no DISCOVERY_TIMEOUT
# and its argument parser would silently swallow that keyword into PROPERTIES,
# and a test binary that crashes or hangs while listing breaks or stalls the
# build. Here the listing runs under a timeout (default 60 s); when it fails,
# the build still finishes and ctest shows one failing test,
# <target>_DISCOVERY_FAILED, that says why.
#
# The function may be called several times for one target with different specs
# (e.g. "~[gpu]" and "[gpu]" with different PROPERTIES).
include_guard(GLOBAL)

set(_LOCKSTEP_CATCH_ADD_TESTS_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/LockstepCatchAddTests.cmake"
  CACHE INTERNAL "Script run after building a Catch2 test executable")

function(lockstep_discover_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "DISCOVERY_TIMEOUT;WORKING_DIRECTORY;TEST_PREFIX"
    "TEST_SPEC;PROPERTIES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "lockstep_discover_tests: unknown arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_DISCOVERY_TIMEOUT)
    set(arg_DISCOVERY_TIMEOUT 60)
  endif()
  if(NOT arg_WORKING_DIRECTORY)
    set(arg_WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  endif()

  # One pair of files per (target, spec, properties), so several calls coexist.
  string(SHA1 hash "${arg_TEST_SPEC}|${arg_PROPERTIES}|${arg_TEST_PREFIX}")
  string(SUBSTRING "${hash}" 0 8 hash)
  set(base "${CMAKE_CURRENT_BINARY_DIR}/${target}-tests-${hash}")
  set(tests_file "${base}.cmake")
  set(include_file "${base}-include.cmake")

  add_custom_command(TARGET ${target} POST_BUILD
    BYPRODUCTS "${tests_file}"
    COMMAND "${CMAKE_COMMAND}"
      -D "TEST_TARGET=${target}"
      -D "TEST_EXECUTABLE=$<TARGET_FILE:${target}>"
      -D "TEST_WORKING_DIR=${arg_WORKING_DIRECTORY}"
      -D "TEST_SPEC=${arg_TEST_SPEC}"
      -D "TEST_PROPERTIES=${arg_PROPERTIES}"
      -D "TEST_PREFIX=${arg_TEST_PREFIX}"
      -D "TEST_DISCOVERY_TIMEOUT=${arg_DISCOVERY_TIMEOUT}"
      -D "CTEST_FILE=${tests_file}"
      -P "${_LOCKSTEP_CATCH_ADD_TESTS_SCRIPT}"
    VERBATIM)

  file(WRITE "${include_file}"
    "if(EXISTS \"${tests_file}\")\n"
    "  include(\"${tests_file}\")\n"
    "else()\n"
    "  add_test(${target}_NOT_BUILT-${hash} ${target}_NOT_BUILT-${hash})\n"
    "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")
endfunction()
