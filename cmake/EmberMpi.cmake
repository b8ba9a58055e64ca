# Multi-process backends of dist/ (DESIGN.md §8: real engines only): MPI (OpenMPI from the system packages) for CPU
# tensors and bootstrap, NCCL for CUDA tensors. Both optional: sets EMBER_WITH_MPI, and EMBER_WITH_NCCL (CUDA builds;
# without MPI to bootstrap it, NCCL serves a launch of one process: Note [NCCL without MPI] in dist/process_group.cpp).
# -DEMBER_MPI=OFF builds without MPI.
option(EMBER_MPI "Build the MPI ProcessGroup backend of dist/ when MPI is found" ON)
set(EMBER_WITH_MPI OFF)
set(EMBER_WITH_NCCL OFF)
if(EMBER_MPI)
  # The C API through the C++ compiler (the project enables no C language): the CXX component, without the
  # deprecated MPI C++ bindings.
  set(MPI_CXX_SKIP_MPICXX ON CACHE BOOL "Do not look for the MPI C++ bindings")
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(EMBER_WITH_MPI ON)
  else()
    message(STATUS "ember: MPI not found: dist/ builds without a multi-process backend (is_available() is false)")
  endif()
endif()
if(EMBER_WITH_CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_ROOT}/include ${NCCL_ROOT}/include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
               HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib $ENV{NCCL_ROOT}/lib ${NCCL_ROOT}/lib)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(EMBER_WITH_NCCL ON)
  endif()
endif()
message(STATUS "ember: MPI ${EMBER_WITH_MPI} ${MPI_CXX_LIBRARY_VERSION_STRING}, NCCL ${EMBER_WITH_NCCL}")
