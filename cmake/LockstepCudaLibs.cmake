# Finds cuDNN and NCCL, which have no CMake package of their own, and defines the
# imported targets lockstep::cudnn and lockstep::nccl.
#
# Used by the build and, installed next to lockstepConfig.cmake, by projects
# that find_package(lockstep), so both sides see the same targets. Looks in
# CUDNN_ROOT / NCCL_ROOT (variable or environment), then in the CUDA toolkit
# (run find_package(CUDAToolkit) first), then in the system paths.
include_guard(GLOBAL)

# Reads "#define <prefix>MAJOR 9"-style macros from `header` into `out`
# ("9.19.0"); leaves `out` empty when they are not there.
function(_lockstep_read_header_version header prefix patch_name out)
  set(version "")
  if(EXISTS "${header}")
    file(STRINGS "${header}" lines REGEX "^#define ${prefix}(MAJOR|MINOR|${patch_name})[ \t]+[0-9]+")
    foreach(part MAJOR MINOR ${patch_name})
      string(REGEX MATCH "#define ${prefix}${part}[ \t]+([0-9]+)" match "${lines}")
      if(NOT match)
        set(version "")
        break()
      endif()
      list(APPEND version "${CMAKE_MATCH_1}")
    endforeach()
    list(JOIN version "." version)
  endif()
  set(${out} "${version}" PARENT_SCOPE)
endfunction()

# lockstep_find_cudnn(): sets LOCKSTEP_CUDNN_FOUND, LOCKSTEP_CUDNN_VERSION,
# LOCKSTEP_CUDNN_LIBRARY, LOCKSTEP_CUDNN_INCLUDE_DIR; defines lockstep::cudnn.
function(lockstep_find_cudnn)
  set(roots ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_ROOT})
  find_path(LOCKSTEP_CUDNN_INCLUDE_DIR cudnn.h
    HINTS ${roots} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  # libcudnn.so.9: pip's nvidia-cudnn wheels ship no unversioned library.
  find_library(LOCKSTEP_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9
    HINTS ${roots} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
  set(found FALSE)
  set(version "")
  if(LOCKSTEP_CUDNN_INCLUDE_DIR AND LOCKSTEP_CUDNN_LIBRARY)
    set(found TRUE)
    # cuDNN 8 and later keep the version in cudnn_version.h.
    _lockstep_read_header_version("${LOCKSTEP_CUDNN_INCLUDE_DIR}/cudnn_version.h"
      CUDNN_ PATCHLEVEL version)
    if(NOT version)
      _lockstep_read_header_version("${LOCKSTEP_CUDNN_INCLUDE_DIR}/cudnn.h"
        CUDNN_ PATCHLEVEL version)
    endif()
    if(NOT TARGET lockstep::cudnn)
      add_library(lockstep::cudnn UNKNOWN IMPORTED)
      set_target_properties(lockstep::cudnn PROPERTIES
        IMPORTED_LOCATION "${LOCKSTEP_CUDNN_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${LOCKSTEP_CUDNN_INCLUDE_DIR}")
      if(TARGET CUDA::cudart)
        set_property(TARGET lockstep::cudnn PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
      endif()
    endif()
  endif()
  set(LOCKSTEP_CUDNN_FOUND ${found} PARENT_SCOPE)
  set(LOCKSTEP_CUDNN_VERSION "${version}" PARENT_SCOPE)
endfunction()

# lockstep_find_nccl(): sets LOCKSTEP_NCCL_FOUND, LOCKSTEP_NCCL_VERSION,
# LOCKSTEP_NCCL_LIBRARY, LOCKSTEP_NCCL_INCLUDE_DIR; defines lockstep::nccl.
function(lockstep_find_nccl)
  set(roots ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT})
  find_path(LOCKSTEP_NCCL_INCLUDE_DIR nccl.h
    HINTS ${roots} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
  find_library(LOCKSTEP_NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS ${roots} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib64 lib)
  set(found FALSE)
  set(version "")
  if(LOCKSTEP_NCCL_INCLUDE_DIR AND LOCKSTEP_NCCL_LIBRARY)
    set(found TRUE)
    _lockstep_read_header_version("${LOCKSTEP_NCCL_INCLUDE_DIR}/nccl.h" NCCL_ PATCH version)
    if(NOT TARGET lockstep::nccl)
      add_library(lockstep::nccl UNKNOWN IMPORTED)
      set_target_properties(lockstep::nccl PROPERTIES
        IMPORTED_LOCATION "${LOCKSTEP_NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${LOCKSTEP_NCCL_INCLUDE_DIR}")
      if(TARGET CUDA::cudart)
        set_property(TARGET lockstep::nccl PROPERTY INTERFACE_LINK_LIBRARIES CUDA::cudart)
      endif()
    endif()
  endif()
  set(LOCKSTEP_NCCL_FOUND ${found} PARENT_SCOPE)
  set(LOCKSTEP_NCCL_VERSION "${version}" PARENT_SCOPE)
endfunction()
