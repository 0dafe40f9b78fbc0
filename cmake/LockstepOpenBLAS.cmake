# Finds the OpenBLAS library a static lockstep was built with and defines the
# imported target lockstep::openblas, for projects that find_package(lockstep).
#
# lockstep's archives call OpenBLAS's own functions (openblas_set_num_threads,
# openblas_get_corename), which no other BLAS has: the package looks for that
# library by name, apart from FindBLAS, so that a project's BLA_VENDOR or its
# own BLAS::BLAS (a reference BLAS, MKL) cannot stand in for it and fail only
# at the link. The build itself links lockstep::openblas as FindBLAS found it
# (cmake/LockstepDependencies.cmake).
include_guard(GLOBAL)

# lockstep_find_openblas([NAMES <name>...] [HINTS <dir>...]): sets
# LOCKSTEP_OPENBLAS_LIBRARY; defines lockstep::openblas where it is found.
function(lockstep_find_openblas)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "NAMES;HINTS")
  find_library(LOCKSTEP_OPENBLAS_LIBRARY NAMES ${arg_NAMES} openblas HINTS ${arg_HINTS}
    PATH_SUFFIXES openblas-pthread openblas-openmp)
  if(LOCKSTEP_OPENBLAS_LIBRARY AND NOT TARGET lockstep::openblas)
    add_library(lockstep::openblas UNKNOWN IMPORTED)
    set_target_properties(lockstep::openblas PROPERTIES
      IMPORTED_LOCATION "${LOCKSTEP_OPENBLAS_LIBRARY}")
  endif()
endfunction()
