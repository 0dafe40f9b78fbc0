# Runs a gpt_train command and fails unless it prints "validation: X
# bits/byte" with X <= MAX_BITS. Used by ctest:
#   cmake -DCOMMAND="a;b;c" -DMAX_BITS=2.6 -P check_bits.cmake
if(NOT DEFINED COMMAND OR NOT DEFINED MAX_BITS)
  message(FATAL_ERROR "usage: cmake -DCOMMAND=<list> -DMAX_BITS=<x> -P check_bits.cmake")
endif()
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "training exited with ${rc}")
endif()
if(NOT out MATCHES "validation: ([0-9.]+) bits/byte")
  message(FATAL_ERROR "no 'validation: X bits/byte' line in the output")
endif()
set(bits "${CMAKE_MATCH_1}")
if(NOT bits LESS_EQUAL MAX_BITS)
  message(FATAL_ERROR "validation loss ${bits} bits/byte is above the required ${MAX_BITS}")
endif()
message("validation loss ${bits} bits/byte <= ${MAX_BITS}: ok")
