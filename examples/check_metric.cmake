# Runs a training command and fails unless its output has a line matching
# PATTERN (one capture: a number) with that number >= MIN or <= MAX. Used by
# ctest:
#   cmake -DCOMMAND="a;b;c" "-DPATTERN=test accuracy: ([0-9.]+)" -DMIN=0.89 -P check_metric.cmake
if(NOT DEFINED COMMAND OR NOT DEFINED PATTERN OR (NOT DEFINED MIN AND NOT DEFINED MAX))
  message(FATAL_ERROR "usage: cmake -DCOMMAND=<list> -DPATTERN=<regex> -DMIN=<x>|-DMAX=<x> "
                      "-P check_metric.cmake")
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "training exited with ${rc}")
endif()
if(NOT out MATCHES "${PATTERN}")
  message(FATAL_ERROR "no line matching '${PATTERN}' in the output")
endif()
set(value "${CMAKE_MATCH_1}")
if(DEFINED MIN AND value LESS MIN)
  message(FATAL_ERROR "${value} is below the required ${MIN}")
endif()
if(DEFINED MAX AND value GREATER MAX)
  message(FATAL_ERROR "${value} is above the allowed ${MAX}")
endif()
message("${value} is within the bound: ok")
