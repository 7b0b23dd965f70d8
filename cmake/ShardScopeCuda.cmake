# SPDX-License-Identifier: Apache-2.0
# CUDA toolkit with CUPTI, and NCCL (which ships no CMake config: find_path/find_library).
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  set(_ss_cuda_roots "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}" /usr/local/cuda)
  find_path(SHARDSCOPE_NCCL_INCLUDE_DIR nccl.h
    HINTS ${_ss_cuda_roots} $ENV{NCCL_HOME} PATH_SUFFIXES include targets/x86_64-linux/include)
  find_library(SHARDSCOPE_NCCL_LIBRARY NAMES nccl
    HINTS ${_ss_cuda_roots} $ENV{NCCL_HOME} PATH_SUFFIXES lib lib64 targets/x86_64-linux/lib)
  if(TARGET CUDA::cupti AND SHARDSCOPE_NCCL_INCLUDE_DIR AND SHARDSCOPE_NCCL_LIBRARY)
    set(SHARDSCOPE_HAVE_CUDA ON)
    message(STATUS "ShardScope: CUDA ${CUDAToolkit_VERSION}, CUPTI, NCCL at ${SHARDSCOPE_NCCL_LIBRARY}")
  endif()
endif()
shardscope_optional(CUDA "${SHARDSCOPE_WITH_CUDA}" "${SHARDSCOPE_HAVE_CUDA}"
  "the CUDA toolkit with CUPTI and NCCL was not found")
