# Run with cmake -P after a Catch2 test executable is built (see
# LockstepCatchDiscover.cmake): lists its test cases matching TEST_SPEC and
# writes CTEST_FILE, a ctest script with one add_test() per test case.
#
# Inputs (-D): TEST_TARGET, TEST_EXECUTABLE, TEST_WORKING_DIR, TEST_SPEC,
# TEST_PROPERTIES, TEST_PREFIX, TEST_DISCOVERY_TIMEOUT, CTEST_FILE.
#
# Test case names are free text: they may hold ';', '[' and ']', which CMake
# lists would split or nest on. So names never go through a list: the listing
# is split into lines with those characters swapped for control characters,
# and every name is written as one bracket argument.
cmake_policy(VERSION 3.25)

# `value` as a bracket argument: one argument, taken literally.
function(bracket out value)
  set(equals "=")
  while("${value}]" MATCHES "]${equals}]")
    string(APPEND equals "=")
  endwhile()
  set(${out} "[${equals}[${value}]${equals}]" PARENT_SCOPE)
endfunction()

# Writes a script with one test that fails with `reason`, so a broken discovery
# shows up in ctest instead of failing or hanging the build.
function(write_discovery_failure reason)
  message(WARNING "Catch2 test discovery for ${TEST_TARGET} failed: ${reason}")
  bracket(name "${TEST_TARGET}_DISCOVERY_FAILED ${TEST_SPEC}")
  bracket(text "test discovery failed: running '${TEST_EXECUTABLE} ${TEST_SPEC} --list-test-names-only': ${reason}")
  file(WRITE "${CTEST_FILE}"
    "add_test(${name} [==[${CMAKE_COMMAND}]==] -E echo ${text})\n"
    "set_tests_properties(${name} PROPERTIES FAIL_REGULAR_EXPRESSION [==[test discovery failed]==])\n")
endfunction()

if(NOT EXISTS "${TEST_EXECUTABLE}")
  write_discovery_failure("the executable does not exist")
  return()
endif()

execute_process(
  COMMAND "${TEST_EXECUTABLE}" ${TEST_SPEC} --list-test-names-only
  OUTPUT_VARIABLE output
  ERROR_VARIABLE error_output
  RESULT_VARIABLE result
  WORKING_DIRECTORY "${TEST_WORKING_DIR}"
  TIMEOUT ${TEST_DISCOVERY_TIMEOUT})

# Catch2 2.x exits with the number of listed tests (modulo 256), so any exit
# code is fine; a crash or the timeout gives a non-numeric result instead.
if(NOT result MATCHES "^[0-9]+$")
  write_discovery_failure("${result} (discovery timeout: ${TEST_DISCOVERY_TIMEOUT} s) ${error_output}")
  return()
endif()

# Properties shared by every test, each a bracket argument.
bracket(working_dir "${TEST_WORKING_DIR}")
set(properties "WORKING_DIRECTORY ${working_dir}")
foreach(item IN LISTS TEST_PROPERTIES)
  bracket(item "${item}")
  string(APPEND properties " ${item}")
endforeach()
bracket(executable "${TEST_EXECUTABLE}")

string(ASCII 1 open_sq)
string(ASCII 2 close_sq)
string(ASCII 3 semicolon)
string(REPLACE "[" "${open_sq}" output "${output}")
string(REPLACE "]" "${close_sq}" output "${output}")
string(REPLACE ";" "${semicolon}" output "${output}")
string(REPLACE "\n" ";" lines "${output}")

set(script "")
foreach(line IN LISTS lines)
  string(REPLACE "${open_sq}" "[" test_name "${line}")
  string(REPLACE "${close_sq}" "]" test_name "${test_name}")
  string(REPLACE "${semicolon}" ";" test_name "${test_name}")
  if("${test_name}" STREQUAL "")
    continue()
  endif()
  # Catch2 reads the argument as a test spec: escape the characters it treats
  # specially so the test case is selected by its exact name.
  set(spec_name "${test_name}")
  foreach(char IN ITEMS "\\" "," "[" "]")
    string(REPLACE "${char}" "\\${char}" spec_name "${spec_name}")
  endforeach()
  bracket(ctest_name "${TEST_PREFIX}${test_name}")
  bracket(spec_name "${spec_name}")
  # --warn NoTests: fail, rather than pass, if the name selects no test case.
  string(APPEND script
    "add_test(${ctest_name} ${executable} ${spec_name} --warn NoTests)\n"
    "set_tests_properties(${ctest_name} PROPERTIES ${properties})\n")
endforeach()

file(WRITE "${CTEST_FILE}" "${script}")
