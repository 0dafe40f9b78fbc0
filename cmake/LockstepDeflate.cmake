# Finds libdeflate (optional: the checkpoint checksums' CRC-32, faster than
# zlib's), which has no CMake package of its own, and defines the imported
# target lockstep::deflate.
#
# Used by the build and, installed next to lockstepConfig.cmake, by projects
# that find_package(lockstep) a static lockstep built with it, so that their
# link names the library found on their machine, not the build machine's path.
include_guard(GLOBAL)

# lockstep_find_deflate([HINTS <dir>...]): sets LOCKSTEP_DEFLATE_FOUND (library
# and libdeflate.h), LOCKSTEP_DEFLATE_LIBRARY, LOCKSTEP_DEFLATE_INCLUDE_DIR;
# defines lockstep::deflate where the library is found.
function(lockstep_find_deflate)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "" "HINTS")
  find_path(LOCKSTEP_DEFLATE_INCLUDE_DIR libdeflate.h)
  find_library(LOCKSTEP_DEFLATE_LIBRARY deflate HINTS ${arg_HINTS})
  if(LOCKSTEP_DEFLATE_LIBRARY AND NOT TARGET lockstep::deflate)
    add_library(lockstep::deflate UNKNOWN IMPORTED)
    set_target_properties(lockstep::deflate PROPERTIES
      IMPORTED_LOCATION "${LOCKSTEP_DEFLATE_LIBRARY}")
    if(LOCKSTEP_DEFLATE_INCLUDE_DIR)
      set_target_properties(lockstep::deflate PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${LOCKSTEP_DEFLATE_INCLUDE_DIR}")
    endif()
  endif()
  if(LOCKSTEP_DEFLATE_LIBRARY AND LOCKSTEP_DEFLATE_INCLUDE_DIR)
    set(LOCKSTEP_DEFLATE_FOUND TRUE PARENT_SCOPE)
  else()
    set(LOCKSTEP_DEFLATE_FOUND FALSE PARENT_SCOPE)
  endif()
endfunction()
