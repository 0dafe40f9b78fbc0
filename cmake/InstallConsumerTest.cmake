# ctest "install_consumer": installs the current build into a scratch prefix,
# then configures, builds and runs tests/consumer/ against it with
# find_package(lockstep). Run with cmake -P; inputs (-D):
#   LOCKSTEP_BINARY_DIR   the build tree to install
#   CONSUMER_SOURCE_DIR   tests/consumer
#   WORK_DIR              scratch folder (emptied first)
#   CONFIG                build configuration (Release, Debug, ...)
#   GENERATOR             CMake generator for the consumer build
#   CXX_COMPILER          the C++ compiler lockstep was built with
#   SANITIZE_FLAGS        lockstep's sanitizer flags (LOCKSTEP_SANITIZE), if any:
#                         its static libraries need them at the consumer's link
#   FMT_VERSION           the fmt version lockstep was built with
#   SHARED                ON when lockstep was built with BUILD_SHARED_LIBS: the
#                         consumer is then configured with CMake barred from
#                         finding zlib, a BLAS, CUDA, MPI and Gloo, which the
#                         shared libraries must keep to themselves
cmake_policy(VERSION 3.25)

foreach(var LOCKSTEP_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR CONFIG GENERATOR CXX_COMPILER)
  if("${${var}}" STREQUAL "")
    message(FATAL_ERROR "InstallConsumerTest.cmake: -D${var}=... is required")
  endif()
endforeach()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/build")

# Runs a command, echoing it; stops with its output when it fails.
function(run_step what)
  message(STATUS "install_consumer: ${what}")
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    list(JOIN ARGN " " command_line)
    message(FATAL_ERROR "install_consumer: ${what} failed (${result}):\n"
      "  ${command_line}\n${output}")
  endif()
  set(step_output "${output}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

run_step("install into ${prefix}"
  "${CMAKE_COMMAND}" --install "${LOCKSTEP_BINARY_DIR}" --prefix "${prefix}" --config "${CONFIG}")

# The package names what it links by target, each found again by
# lockstepConfig.cmake on the consumer's machine: a library path baked in at
# build time would fail there only at the link, as a file ninja cannot make.
file(GLOB export_files "${prefix}/lib*/cmake/lockstep/lockstepTargets.cmake")
foreach(export_file IN LISTS export_files)
  file(STRINGS "${export_file}" link_lines REGEX "INTERFACE_LINK_LIBRARIES")
  foreach(line IN LISTS link_lines)
    if(line MATCHES "\"(.*;)?(/[^;\"]*)")
      message(FATAL_ERROR "install_consumer: ${export_file} links the build machine's "
        "${CMAKE_MATCH_2} by path, which the package does not look for:\n${line}")
    endif()
  endforeach()
endforeach()

set(sanitize_options "")
if(SANITIZE_FLAGS)
  list(JOIN SANITIZE_FLAGS " " flags)
  set(sanitize_options "-DCMAKE_CXX_FLAGS=${flags}" "-DCMAKE_EXE_LINKER_FLAGS=${flags}")
endif()

set(barred_packages "")
if(SHARED)
  foreach(package IN ITEMS ZLIB BLAS CUDAToolkit MPI Gloo)
    list(APPEND barred_packages "-DCMAKE_DISABLE_FIND_PACKAGE_${package}=ON")
  endforeach()
endif()

# A fmt of the next major version (a stand-in without a library), found
# first on the path (the environment's CMAKE_PREFIX_PATH, before the system's):
# a static lockstep must pass it over for the fmt it was
# built with, whose symbols (fmt::v9::..., say) its archives call.
set(other_fmt "")
if(NOT SHARED AND FMT_VERSION)
  string(REGEX MATCH "^[0-9]+" fmt_major "${FMT_VERSION}")
  math(EXPR fmt_major "${fmt_major} + 1")
  set(other_fmt "${WORK_DIR}/other-fmt")
  set(fmt_dir "${other_fmt}/lib/cmake/fmt")
  file(WRITE "${fmt_dir}/fmt-config.cmake" "add_library(fmt::fmt INTERFACE IMPORTED)\n")
  file(WRITE "${fmt_dir}/fmt-config-version.cmake" "set(PACKAGE_VERSION ${fmt_major}.0.0)
if(PACKAGE_FIND_VERSION_RANGE)
  if(PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION_MIN OR
     (PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL EXCLUDE AND
      PACKAGE_VERSION VERSION_GREATER_EQUAL PACKAGE_FIND_VERSION_MAX) OR
     (PACKAGE_FIND_VERSION_RANGE_MAX STREQUAL INCLUDE AND
      PACKAGE_VERSION VERSION_GREATER PACKAGE_FIND_VERSION_MAX))
    set(PACKAGE_VERSION_COMPATIBLE FALSE)
  else()
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  endif()
elseif(PACKAGE_VERSION VERSION_LESS PACKAGE_FIND_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
")
endif()

# A project that builds fmt of the next major version itself (FetchContent,
# add_subdirectory: fmt's CMakeLists.txt, here a stand-in, gives its target
# fmt::fmt a VERSION but sets no fmt_VERSION) before it finds a static
# lockstep: the package must refuse it, naming that version, rather than
# configure a program that fails only at the link for want of fmt::v9::...
if(NOT SHARED AND FMT_VERSION)
  set(fetched "${WORK_DIR}/fetched-fmt")
  file(WRITE "${fetched}/fmt/CMakeLists.txt" "project(FMT VERSION ${fmt_major}.0.0 LANGUAGES CXX)
add_library(fmt INTERFACE)
set_target_properties(fmt PROPERTIES VERSION \${FMT_VERSION})
add_library(fmt::fmt ALIAS fmt)
")
  file(WRITE "${fetched}/CMakeLists.txt" "cmake_minimum_required(VERSION 3.25)
project(fetched_fmt LANGUAGES CXX)
add_subdirectory(fmt)
find_package(lockstep REQUIRED)
")
  message(STATUS "install_consumer: configure a project that builds fmt ${fmt_major} itself")
  execute_process(COMMAND "${CMAKE_COMMAND}" -S "${fetched}" -B "${fetched}/build"
      -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}"
      -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
    RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  if(result EQUAL 0 OR NOT output MATCHES
     "has fmt ${fmt_major}\\.0\\.0[ \n]+\\(target[ \n]+fmt::fmt")
    message(FATAL_ERROR "install_consumer: a project that builds fmt ${fmt_major} itself "
      "was not refused by name at configure time (exit ${result}):\n${output}")
  endif()
endif()

# A component that is not one of the parts is refused, naming it and the parts.
set(unknown "${WORK_DIR}/unknown-component")
file(WRITE "${unknown}/CMakeLists.txt" "cmake_minimum_required(VERSION 3.25)
project(unknown_component LANGUAGES CXX)
find_package(lockstep REQUIRED COMPONENTS nn ddp)
")
message(STATUS "install_consumer: configure a project that asks for a component ddp")
execute_process(COMMAND "${CMAKE_COMMAND}" -S "${unknown}" -B "${unknown}/build"
    -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" "-DCMAKE_PREFIX_PATH=${prefix}"
    -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON
  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(result EQUAL 0 OR NOT output MATCHES "no[ \n]+component[ \n]+'ddp'.*models")
  message(FATAL_ERROR "install_consumer: a project that asks for a component ddp was not "
    "refused, naming it and the parts (exit ${result}):\n${output}")
endif()

run_step("configure the consumer project"
  "${CMAKE_COMMAND}" -E env "CMAKE_PREFIX_PATH=${other_fmt}"
  "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}" -G "${GENERATOR}"
  ${sanitize_options} ${barred_packages}
  "-DCMAKE_BUILD_TYPE=${CONFIG}"
  "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
  "-DCMAKE_PREFIX_PATH=${prefix}"
  -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)

run_step("build the consumer project"
  "${CMAKE_COMMAND}" --build "${consumer_build}" --config "${CONFIG}")

# Single- and multi-config generators put the executable in different places.
file(GLOB_RECURSE consumer_exe LIST_DIRECTORIES false "${consumer_build}/lockstep_consumer")
if(NOT consumer_exe)
  message(FATAL_ERROR "install_consumer: no lockstep_consumer executable under ${consumer_build}")
endif()
list(GET consumer_exe 0 consumer_exe)
run_step("run ${consumer_exe}" "${consumer_exe}")
message(STATUS "install_consumer: consumer says: ${step_output}")
if(NOT step_output MATCHES "numel 6")
  message(FATAL_ERROR "install_consumer: unexpected output from the consumer: ${step_output}")
endif()
message(STATUS "install_consumer: passed")
