# Helpers shared by the top-level and per-folder CMakeLists.txt.
include_guard(GLOBAL)

include(GNUInstallDirs)

# lockstep_tristate_option(<var> <doc>)
# A cache option that is AUTO (default), ON or OFF. Other spellings of true and
# false (1, YES, TRUE, 0, NO, FALSE, ...) are normalised to ON and OFF.
function(lockstep_tristate_option var doc)
  set(${var} AUTO CACHE STRING "${doc} (AUTO, ON or OFF)")
  set_property(CACHE ${var} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${var}}" value)
  if(value STREQUAL "AUTO")
    set(value AUTO)
  elseif(value MATCHES "^(1|ON|YES|TRUE|Y)$")
    set(value ON)
  elseif(value MATCHES "^(0|OFF|NO|FALSE|N)$")
    set(value OFF)
  else()
    message(FATAL_ERROR "${var}='${${var}}': expected AUTO, ON or OFF.")
  endif()
  set(${var} ${value} PARENT_SCOPE)
endfunction()

# lockstep_resolve_option(<NAME> <label> <missing> <how-to-install>)
# Decides LOCKSTEP_HAVE_<NAME> from the tristate LOCKSTEP_<NAME> and what the
# search found missing (an empty string: nothing missing).
#   OFF                    -> off
#   nothing missing        -> on
#   AUTO and missing       -> off, with a note saying what is missing
#   ON and missing         -> configure error saying what is missing and how to
#                             install it
function(lockstep_resolve_option name label missing how_to)
  set(option LOCKSTEP_${name})
  if("${${option}}" STREQUAL "OFF")
    set(have OFF)
    set(LOCKSTEP_${name}_NOTE "disabled by -D${option}=OFF" PARENT_SCOPE)
  elseif("${missing}" STREQUAL "")
    set(have ON)
  else()
    string(REPLACE ";" ", " missing_text "${missing}")
    if("${${option}}" STREQUAL "ON")
      message(FATAL_ERROR
        "${option}=ON, but ${missing_text} not found.\n"
        "${how_to}\n"
        "Or configure with -D${option}=AUTO (use it where found) or -D${option}=OFF.")
    endif()
    message(STATUS "Note: ${option}=AUTO: building without ${label}; not found: ${missing_text}. ${how_to}")
    set(have OFF)
    set(LOCKSTEP_${name}_NOTE "not found: ${missing_text}" PARENT_SCOPE)
  endif()
  set(LOCKSTEP_HAVE_${name} ${have} PARENT_SCOPE)
endfunction()

# lockstep_target_warnings(<target>)
# -Wall -Wextra (and -Werror with LOCKSTEP_WARNINGS_AS_ERRORS) for our own code.
# Without -Wmissing-field-initializers: options aggregates are meant to be
# written with designated initializers that leave fields at their defaults
# (`group.allreduce(t, {.op = ReduceOp::Avg})`), which GCC would flag. Without
# GCC's -Wpsabi note on the SIMD helpers' vector arguments: they never cross
# a library boundary (runtime/cpu/simd.h), so an ABI change long ago is moot.
function(lockstep_target_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    # C++ sources only: nvcc takes host-compiler warnings through -Xcompiler.
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-missing-field-initializers>
      $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wno-psabi>
      $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${LOCKSTEP_WARNINGS_AS_ERRORS}>>:-Werror>)
  endif()
endfunction()

# lockstep_add_library(<folder> [SOURCES <file>...] [PUBLIC <dep>...]
#                      [PRIVATE <dep>...] [TOOLKITS <dep>...]
#                      [EXCLUDE_HEADER_DIRS <subdir>...])
#
# Defines the library of one top-level source folder: target lockstep_<folder>,
# alias lockstep::<folder>, exported as lockstep::<folder>. With no SOURCES it is
# an INTERFACE library (a folder without .cpp files yet still gives a target to
# link against; PRIVATE deps are then dropped). Installs the folder's headers to
# <prefix>/include/lockstep/<folder>/, keeping subfolders, except detail/
# folders (internal headers, included only by the library's own sources) and
# those named in EXCLUDE_HEADER_DIRS (parts that are not built in).
# TOOLKITS are the optional toolkits its sources use (CUDA, cuDNN, NCCL, MPI,
# Gloo), whose headers no header outside the backends' folders includes: a
# static library passes them on to its users (they are needed at the final
# link), a shared one keeps them private, so that a program linking it needs
# none of them. The in-tree programs get them through lockstep_in_tree.
function(lockstep_add_library folder)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "SOURCES;PUBLIC;PRIVATE;TOOLKITS;EXCLUDE_HEADER_DIRS")
  set_property(GLOBAL APPEND PROPERTY LOCKSTEP_TOOLKITS ${arg_TOOLKITS})
  set(target lockstep_${folder})
  if(arg_SOURCES)
    add_library(${target} ${arg_SOURCES})
    set(scope PUBLIC)
    target_link_libraries(${target} PUBLIC ${arg_PUBLIC} PRIVATE ${arg_PRIVATE})
    if(BUILD_SHARED_LIBS)
      target_link_libraries(${target} PRIVATE ${arg_TOOLKITS})
    else()
      target_link_libraries(${target} PUBLIC ${arg_TOOLKITS})
    endif()
    lockstep_target_warnings(${target})
    # Position-independent even when static, so the archives can go into a
    # downstream shared library.
    # Before 1.0 a minor version may break the ABI.
    set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON
      VERSION ${PROJECT_VERSION}
      SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  else()
    add_library(${target} INTERFACE)
    set(scope INTERFACE)
    target_link_libraries(${target} INTERFACE ${arg_PUBLIC} ${arg_TOOLKITS})
  endif()
  target_compile_features(${target} ${scope} cxx_std_20)
  target_include_directories(${target} ${scope}
    $<BUILD_INTERFACE:${LOCKSTEP_BUILD_INCLUDE_DIR}>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${folder})
  add_library(lockstep::${folder} ALIAS ${target})

  install(TARGETS ${target} EXPORT lockstepTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
    RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  set(excludes PATTERN "detail" EXCLUDE)
  foreach(dir IN LISTS arg_EXCLUDE_HEADER_DIRS)
    list(APPEND excludes PATTERN "${dir}" EXCLUDE)
  endforeach()
  install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/lockstep/${folder}
    FILES_MATCHING PATTERN "*.h" PATTERN "*.hpp" ${excludes})
  # The same headers, as "lockstep/<folder>/<path>", in the global property
  # LOCKSTEP_INSTALLED_HEADERS (tests/ compiles each alone).
  file(GLOB_RECURSE headers RELATIVE ${CMAKE_CURRENT_SOURCE_DIR} CONFIGURE_DEPENDS
    ${CMAKE_CURRENT_SOURCE_DIR}/*.h ${CMAKE_CURRENT_SOURCE_DIR}/*.hpp)
  foreach(dir IN ITEMS detail ${arg_EXCLUDE_HEADER_DIRS})
    list(FILTER headers EXCLUDE REGEX "(^|/)${dir}/")
  endforeach()
  list(TRANSFORM headers PREPEND "lockstep/${folder}/")
  set_property(GLOBAL APPEND PROPERTY LOCKSTEP_INSTALLED_HEADERS ${headers})
endfunction()

# lockstep_add_program(<name> <source>...)
# An executable in build/bin linked against the whole library, the example
# models and the toolkits (lockstep_in_tree), CLI11 and
# nlohmann-json (examples and benchmarks).
function(lockstep_add_program name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE lockstep_in_tree CLI11::CLI11
    nlohmann_json::nlohmann_json)
  lockstep_target_warnings(${name})
  lockstep_driver_code(${name})
endfunction()
