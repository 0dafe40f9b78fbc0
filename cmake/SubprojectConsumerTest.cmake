# ctest "subproject_consumer": configures tests/subproject/, a project that
# add_subdirectory()s lockstep's source, without a build type and with its own
# BUILD_TESTING, and checks what lockstep did to it and where its programs go.
# Configures only (building would compile the library again). Run with
# cmake -P; inputs (-D):
#   LOCKSTEP_SOURCE_DIR   lockstep's source tree
#   PROJECT_DIR           tests/subproject
#   WORK_DIR              scratch folder (emptied first)
#   GENERATOR             CMake generator
#   CXX_COMPILER          the C++ compiler lockstep was built with
cmake_policy(VERSION 3.25)

foreach(var LOCKSTEP_SOURCE_DIR PROJECT_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if("${${var}}" STREQUAL "")
    message(FATAL_ERROR "SubprojectConsumerTest.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(build "${WORK_DIR}/build")

# The optional toolkits off: they only cost time to look for here.
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${PROJECT_DIR}" -B "${build}" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DLOCKSTEP_SOURCE_DIR=${LOCKSTEP_SOURCE_DIR}"
    -DLOCKSTEP_CUDA=OFF -DLOCKSTEP_NCCL=OFF -DLOCKSTEP_MPI=OFF -DLOCKSTEP_GLOO=OFF
  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "subproject_consumer: configure failed (${result}):\n${output}")
endif()

set(failures "")
# The build type is the project's to choose: an empty one stays empty.
file(STRINGS "${build}/CMakeCache.txt" build_type REGEX "^CMAKE_BUILD_TYPE:")
if(NOT build_type STREQUAL "" AND NOT build_type MATCHES "^CMAKE_BUILD_TYPE:[A-Z]+=$")
  list(APPEND failures "the project's build type was set: ${build_type}")
endif()

# lockstep's tests, examples and benchmarks find its programs in its own
# build folder's bin/ (LOCKSTEP_BINARY_DIR/bin), where they must be built.
file(READ "${build}/lockstep-run-dir.txt" run_dir)
if(NOT run_dir STREQUAL "${build}/lockstep/bin")
  string(CONCAT failure "lockstep-run is built in ${run_dir}, where lockstep's tests, "
    "which look in ${build}/lockstep/bin, do not find it")
  list(APPEND failures "${failure}")
endif()

# The program links the OpenBLAS lockstep calls into, not the BLAS the project
# chose for itself (a link command to read only from Ninja).
if(GENERATOR MATCHES "Ninja")
  file(STRINGS "${build}/CMakeCache.txt" make_program REGEX "^CMAKE_MAKE_PROGRAM:")
  string(REGEX REPLACE "^[^=]*=" "" make_program "${make_program}")
  execute_process(COMMAND "${make_program}" -C "${build}" -t commands lockstep_consumer
    RESULT_VARIABLE result OUTPUT_VARIABLE commands ERROR_VARIABLE commands)
  string(REGEX MATCH "[^\n]*-o lockstep_consumer[^\n]*" link_line "${commands}")
  if(NOT result EQUAL 0 OR NOT link_line)
    list(APPEND failures "no link command for lockstep_consumer from ninja -t commands:\n"
      "${commands}")
  elseif(NOT link_line MATCHES "openblas")
    list(APPEND failures "lockstep_consumer does not link OpenBLAS, whose own functions "
      "lockstep calls: ${link_line}")
  endif()
endif()

if(failures)
  list(JOIN failures "\n  " text)
  message(FATAL_ERROR "subproject_consumer:\n  ${text}")
endif()
message(STATUS "subproject_consumer: passed")
