# Runs a training command and fails unless it prints "test accuracy: X" with
# X >= MIN_ACCURACY. Used by ctest:
#   cmake -DCOMMAND="a;b;c" -DMIN_ACCURACY=0.89 -P check_accuracy.cmake
if(NOT DEFINED COMMAND OR NOT DEFINED MIN_ACCURACY)
  message(FATAL_ERROR "usage: cmake -DCOMMAND=<list> -DMIN_ACCURACY=<x> -P check_accuracy.cmake")
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "training exited with ${rc}")
endif()
if(NOT out MATCHES "test accuracy: ([0-9.]+)")
  message(FATAL_ERROR "no 'test accuracy:' line in the output")
endif()
set(acc "${CMAKE_MATCH_1}")
# Compare the first four decimals as integers (CMake has no float compare).
string(REGEX REPLACE "^0\\.([0-9][0-9][0-9][0-9]).*" "\\1" acc_digits "${acc}")
string(REGEX REPLACE "^0\\.([0-9]+)$" "\\1" min_digits "${MIN_ACCURACY}0000")
string(SUBSTRING "${min_digits}" 0 4 min_digits)
if(acc_digits LESS min_digits)
  message(FATAL_ERROR "test accuracy ${acc} is below the required ${MIN_ACCURACY}")
endif()
message("test accuracy ${acc} >= ${MIN_ACCURACY}: ok")
