# Run with cmake -P after a Catch2 test executable is built (see
# LockstepCatchDiscover.cmake): lists its test cases matching TEST_SPEC and
# writes CTEST_FILE, a ctest script with one add_test() per test case.
#
# Inputs (-D): TEST_TARGET, TEST_EXECUTABLE, TEST_WORKING_DIR, TEST_SPEC,
# TEST_PROPERTIES, TEST_PREFIX, TEST_DISCOVERY_TIMEOUT, CTEST_FILE.
cmake_policy(VERSION 3.25)

set(script "")

# Appends `command(arg...)` to `script`, bracket-quoting every argument.
function(add_command command)
  set(line "${command}(")
  foreach(arg IN LISTS ARGN)
    string(APPEND line " [==[${arg}]==]")
  endforeach()
  set(script "${script}${line} )\n" PARENT_SCOPE)
endfunction()

# Registers one test that fails with `reason`, so a broken discovery shows up
# in ctest instead of failing or hanging the build.
function(write_discovery_failure reason)
  message(WARNING "Catch2 test discovery for ${TEST_TARGET} failed: ${reason}")
  set(name "${TEST_TARGET}_DISCOVERY_FAILED ${TEST_SPEC}")
  set(script "")
  add_command(add_test "${name}" "${CMAKE_COMMAND}" -E echo
    "test discovery failed: running '${TEST_EXECUTABLE} ${TEST_SPEC} --list-test-names-only': ${reason}")
  add_command(set_tests_properties "${name}" PROPERTIES
    FAIL_REGULAR_EXPRESSION "test discovery failed")
  file(WRITE "${CTEST_FILE}" "${script}")
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

string(REPLACE "\n" ";" lines "${output}")
foreach(test_name IN LISTS lines)
  if("${test_name}" STREQUAL "")
    continue()
  endif()
  # Catch2 reads the argument as a test spec: escape the characters it treats
  # specially so the test case is selected by its exact name.
  set(spec_name "${test_name}")
  foreach(char \\ , [ ])
    string(REPLACE "${char}" "\\${char}" spec_name "${spec_name}")
  endforeach()
  set(ctest_name "${TEST_PREFIX}${test_name}")
  add_command(add_test "${ctest_name}" "${TEST_EXECUTABLE}" "${spec_name}")
  add_command(set_tests_properties "${ctest_name}" PROPERTIES
    WORKING_DIRECTORY "${TEST_WORKING_DIR}" ${TEST_PROPERTIES})
endforeach()

file(WRITE "${CTEST_FILE}" "${script}")
