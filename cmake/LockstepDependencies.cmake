# Finds what lockstep builds against. Required: Threads, fmt, zlib, OpenBLAS
# (with cblas.h). Optional, each behind a tristate option (AUTO/ON/OFF):
# LOCKSTEP_CUDA (CUDA toolkit + cuBLAS + cuDNN), LOCKSTEP_NCCL (needs CUDA),
# LOCKSTEP_MPI, LOCKSTEP_GLOO. Sets LOCKSTEP_HAVE_<PART> (ON/OFF) and
# LOCKSTEP_<PART>_NOTE (one line for the configure summary) for each.
include_guard(GLOBAL)

include(CheckCXXSourceCompiles)
include(CMakePushCheckState)
include(LockstepHelpers)
include(LockstepCudaLibs)
include(LockstepDeflate)

set(LOCKSTEP_SETUP_HINT "scripts/setup installs it")

# lockstep_require(<package> <apt packages> [find_package args...])
macro(lockstep_require package apt)
  find_package(${package} ${ARGN} QUIET)
  if(NOT ${package}_FOUND)
    message(FATAL_ERROR "${package} not found. Install it with: apt-get install ${apt} "
      "(${LOCKSTEP_SETUP_HINT}).")
  endif()
endmacro()

# ---- required ---------------------------------------------------------------

set(THREADS_PREFER_PTHREAD_FLAG ON)
lockstep_require(Threads "libc6-dev")
lockstep_require(fmt "libfmt-dev")
lockstep_require(ZLIB "zlib1g-dev")
# libdeflate (optional): the checkpoint checksums' CRC-32 (the same CRC as
# zlib's) at 6-8 GB/s with carry-less multiplies, where zlib's runs at about
# 2 GB/s. Without it checkpoints use zlib's, with identical files, slower.
# The library is target lockstep::deflate, which a static lockstep's package
# finds again on the consumer's machine.
lockstep_find_deflate()
if(LOCKSTEP_DEFLATE_FOUND)
  set(LOCKSTEP_HAVE_DEFLATE 1)
  get_filename_component(LOCKSTEP_DEFLATE_LIBRARY_DIR "${LOCKSTEP_DEFLATE_LIBRARY}" DIRECTORY)
else()
  set(LOCKSTEP_HAVE_DEFLATE 0)
endif()

# OpenBLAS: the library through FindBLAS, cblas.h from OpenBLAS's own include
# folder (pkg-config openblas) so that header and library match, whatever
# Debian's cblas.h alternative points at. Always OpenBLAS, whatever BLA_VENDOR
# (or BLAS::BLAS) a project that builds lockstep as a part of itself chose:
# the library calls OpenBLAS's own functions (openblas_set_num_threads), which
# no other BLAS has. BLA_VENDOR and BLAS_LIBRARIES are set in this directory's
# scope only.
set(BLA_VENDOR OpenBLAS)
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(LOCKSTEP_PC_OPENBLAS QUIET openblas)
endif()
find_package(BLAS QUIET)
find_path(LOCKSTEP_CBLAS_INCLUDE_DIR cblas.h
  HINTS ${LOCKSTEP_PC_OPENBLAS_INCLUDE_DIRS}
  PATH_SUFFIXES openblas x86_64-linux-gnu/openblas-pthread x86_64-linux-gnu/openblas-openmp
                aarch64-linux-gnu/openblas-pthread)
if(NOT BLAS_FOUND OR NOT LOCKSTEP_CBLAS_INCLUDE_DIR)
  message(FATAL_ERROR "OpenBLAS (library and cblas.h) not found. "
    "Install it with: apt-get install libopenblas-dev (${LOCKSTEP_SETUP_HINT}).")
endif()
# What the library links: lockstep::openblas, the libraries just found (not
# BLAS::BLAS, which an enclosing project may have made of another BLAS), and
# which a static lockstep's package finds again by the name and folder of the
# library found here (cmake/LockstepOpenBLAS.cmake).
if(NOT TARGET lockstep::openblas)
  add_library(lockstep::openblas INTERFACE IMPORTED)
  target_link_libraries(lockstep::openblas INTERFACE ${BLAS_LIBRARIES} ${BLAS_LINKER_FLAGS})
endif()
list(GET BLAS_LIBRARIES 0 _blas_library)
get_filename_component(LOCKSTEP_OPENBLAS_LIBRARY_NAME "${_blas_library}" NAME)
get_filename_component(LOCKSTEP_OPENBLAS_LIBRARY_DIR "${_blas_library}" DIRECTORY)
set(LOCKSTEP_OPENBLAS_VERSION "${LOCKSTEP_PC_OPENBLAS_VERSION}")
if(NOT LOCKSTEP_OPENBLAS_VERSION AND EXISTS "${LOCKSTEP_CBLAS_INCLUDE_DIR}/openblas_config.h")
  file(STRINGS "${LOCKSTEP_CBLAS_INCLUDE_DIR}/openblas_config.h" _line
    REGEX "#define OPENBLAS_VERSION")
  string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" LOCKSTEP_OPENBLAS_VERSION "${_line}")
endif()

# ---- CUDA: toolkit (cudart), cuBLAS, cuDNN ----------------------------------

lockstep_tristate_option(LOCKSTEP_CUDA "Build CUDA support (CUDA toolkit, cuBLAS, cuDNN)")
# One architecture by default: every extra one multiplies the kernels' build
# time (-DCMAKE_CUDA_ARCHITECTURES="80;90" for more).
set(CMAKE_CUDA_ARCHITECTURES 90 CACHE STRING "CUDA architectures to build kernels for")
set(_missing "")
if(NOT LOCKSTEP_CUDA STREQUAL "OFF")
  if(NOT DEFINED CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT}
     AND NOT DEFINED ENV{CUDA_PATH} AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    list(APPEND _missing "the CUDA toolkit")
  elseif(CUDAToolkit_VERSION VERSION_LESS 12.8)
    # The pinned-memory cache asks a stream for its device (cudaStreamGetDevice).
    list(APPEND _missing "CUDA 12.8 or newer (found ${CUDAToolkit_VERSION} in ${CUDAToolkit_BIN_DIR})")
  else()
    get_filename_component(LOCKSTEP_CUDA_TOOLKIT_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
    if(NOT TARGET CUDA::cublas)
      list(APPEND _missing "cuBLAS")
    endif()
    lockstep_find_cudnn()
    if(NOT LOCKSTEP_CUDNN_FOUND)
      list(APPEND _missing "cuDNN (cudnn.h, libcudnn)")
    endif()
  endif()
endif()
lockstep_resolve_option(CUDA CUDA "${_missing}"
  "Install the CUDA toolkit with cuBLAS and cuDNN (NVIDIA's apt repository: cuda-toolkit and cudnn9-cuda-<major>), or point -DCUDAToolkit_ROOT= / -DCUDNN_ROOT= at an existing install.")
if(LOCKSTEP_HAVE_CUDA)
  # The kernels (runtime/cuda/kernels/*.cu) with the toolkit's own nvcc and
  # our C++ compiler as its host compiler.
  if(NOT CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_COMPILER "${CUDAToolkit_NVCC_EXECUTABLE}")
  endif()
  if(NOT CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
  endif()
  if(LOCKSTEP_USE_CCACHE AND LOCKSTEP_CCACHE_PROGRAM AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${LOCKSTEP_CCACHE_PROGRAM})
  endif()
  enable_language(CUDA)
  # C++17 in the kernels: CMake 3.25 does not know nvcc's C++20 flag, and
  # kernels need nothing newer (they see only cuda/kernels/*.h).
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  set(_cublas_version "")
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(NOT _cublas_version)
      _lockstep_read_header_version("${_dir}/cublas_api.h" CUBLAS_VER_ PATCH _cublas_version)
    endif()
  endforeach()
  set(LOCKSTEP_CUDA_NOTE "CUDA ${CUDAToolkit_VERSION} (${LOCKSTEP_CUDA_TOOLKIT_ROOT}), cuBLAS ${_cublas_version}, cuDNN ${LOCKSTEP_CUDNN_VERSION} (${LOCKSTEP_CUDNN_LIBRARY}), architectures ${CMAKE_CUDA_ARCHITECTURES}")
endif()

# ---- NCCL (needs CUDA) ------------------------------------------------------

lockstep_tristate_option(LOCKSTEP_NCCL "Build the NCCL collectives backend (needs LOCKSTEP_CUDA)")
set(_missing "")
if(NOT LOCKSTEP_NCCL STREQUAL "OFF")
  if(NOT LOCKSTEP_HAVE_CUDA)
    list(APPEND _missing "CUDA, which NCCL needs (LOCKSTEP_CUDA is off or CUDA was not found)")
  else()
    lockstep_find_nccl()
    if(NOT LOCKSTEP_NCCL_FOUND)
      list(APPEND _missing "NCCL (nccl.h, libnccl)")
    elseif(LOCKSTEP_NCCL_VERSION AND LOCKSTEP_NCCL_VERSION VERSION_LESS 2.14)
      # Non-blocking communicators (a bounded wait for peers) came with NCCL 2.14.
      list(APPEND _missing "NCCL 2.14 or newer (found ${LOCKSTEP_NCCL_VERSION} in ${LOCKSTEP_NCCL_LIBRARY})")
    endif()
  endif()
endif()
lockstep_resolve_option(NCCL NCCL "${_missing}"
  "Install NCCL (NVIDIA's apt repository: libnccl-dev; or use a CUDA toolkit that bundles it), or point -DNCCL_ROOT= at an existing install.")
if(LOCKSTEP_HAVE_NCCL)
  set(LOCKSTEP_NCCL_NOTE "NCCL ${LOCKSTEP_NCCL_VERSION} (${LOCKSTEP_NCCL_LIBRARY})")
endif()

# ---- MPI --------------------------------------------------------------------

lockstep_tristate_option(LOCKSTEP_MPI "Build the MPI collectives backend")
set(_missing "")
if(NOT LOCKSTEP_MPI STREQUAL "OFF")
  # The C API from C++: do not link the deprecated MPI C++ bindings.
  set(MPI_CXX_SKIP_MPICXX ON CACHE BOOL "Do not use the MPI C++ bindings")
  find_package(MPI QUIET COMPONENTS CXX)
  if(NOT MPI_CXX_FOUND)
    list(APPEND _missing "MPI (C++ bindings)")
  endif()
endif()
lockstep_resolve_option(MPI MPI "${_missing}"
  "Install Open MPI with: apt-get install libopenmpi-dev openmpi-bin (${LOCKSTEP_SETUP_HINT}).")
if(LOCKSTEP_HAVE_MPI)
  # The implementation and its version, from mpi.h (no test program to run).
  set(_mpi_library "MPI")
  find_file(_mpi_header mpi.h PATHS ${MPI_CXX_INCLUDE_DIRS} NO_DEFAULT_PATH NO_CACHE)
  if(_mpi_header)
    file(STRINGS "${_mpi_header}" _lines REGEX "#define (OMPI_(MAJOR|MINOR|RELEASE)_VERSION|MPICH_VERSION) ")
    if(_lines MATCHES "OMPI_MAJOR_VERSION +([0-9]+).*OMPI_MINOR_VERSION +([0-9]+).*OMPI_RELEASE_VERSION +([0-9]+)")
      set(_mpi_library "Open MPI ${CMAKE_MATCH_1}.${CMAKE_MATCH_2}.${CMAKE_MATCH_3}")
    elseif(_lines MATCHES "MPICH_VERSION +\"([^\"]+)\"")
      set(_mpi_library "MPICH ${CMAKE_MATCH_1}")
    endif()
  endif()
  set(LOCKSTEP_MPI_NOTE "${_mpi_library}, MPI standard ${MPI_CXX_VERSION} (${MPIEXEC_EXECUTABLE})")
endif()

# ---- Gloo -------------------------------------------------------------------

lockstep_tristate_option(LOCKSTEP_GLOO "Build the Gloo collectives backend")
set(_missing "")
if(NOT LOCKSTEP_GLOO STREQUAL "OFF")
  find_package(Gloo CONFIG QUIET)
  if(NOT Gloo_FOUND OR NOT TARGET gloo)
    list(APPEND _missing "Gloo (its CMake package with target gloo)")
  else()
    # Debian's package config only gives a bare imported target (no Threads, a
    # RelWithDebInfo-only location): check that a TCP device really compiles and
    # links before relying on it. A failed check is retried on every configure.
    cmake_push_check_state(RESET)
    set(CMAKE_REQUIRED_LIBRARIES gloo Threads::Threads)
    set(CMAKE_REQUIRED_QUIET ON)
    check_cxx_source_compiles([[
      #include <gloo/config.h>
      #include <gloo/rendezvous/hash_store.h>
      #include <gloo/transport/tcp/device.h>
      int main() {
        gloo::rendezvous::HashStore store;
        gloo::transport::tcp::attr attr("127.0.0.1");
        auto device = gloo::transport::tcp::CreateDevice(attr);
        return device ? 0 : 1;
      }]] LOCKSTEP_GLOO_LINKS)
    cmake_pop_check_state()
    if(NOT LOCKSTEP_GLOO_LINKS)
      unset(LOCKSTEP_GLOO_LINKS CACHE)
      list(APPEND _missing "a usable Gloo (a test program against target gloo did not build)")
    endif()
  endif()
endif()
lockstep_resolve_option(GLOO Gloo "${_missing}"
  "Install Gloo with: apt-get install libgloo-dev (${LOCKSTEP_SETUP_HINT}).")
if(LOCKSTEP_HAVE_GLOO)
  get_target_property(_gloo_configs gloo IMPORTED_CONFIGURATIONS)
  list(GET _gloo_configs 0 _gloo_config)
  get_target_property(_gloo_location gloo IMPORTED_LOCATION_${_gloo_config})
  set(LOCKSTEP_GLOO_NOTE "Gloo ${Gloo_VERSION} (${_gloo_location})")
endif()

unset(_missing)
