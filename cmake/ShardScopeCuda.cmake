# SPDX-License-Identifier: Apache-2.0
# CUDA toolkit headers, CUPTI and NCCL (NCCL ships no CMake config: find_path/find_library).
#
# One process must never load two CUDA runtimes, two CUPTIs or two NCCLs. When LibTorch
# comes from the torch wheel, the wheel's own nvidia/* libraries are what libtorch_cuda
# loads, so we link those (same major version as the toolkit's headers) and use the
# toolkit only for headers.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND)
  set(_ss_cuda_roots "${CUDAToolkit_LIBRARY_ROOT}" "${CUDAToolkit_TARGET_DIR}" /usr/local/cuda)
  set(_ss_wheel_nvidia "")
  if(SHARDSCOPE_HAVE_TORCH AND Torch_DIR MATCHES "site-packages/torch/")
    string(REGEX REPLACE "site-packages/torch/.*" "site-packages/nvidia" _ss_wheel_nvidia "${Torch_DIR}")
  endif()
  find_path(SHARDSCOPE_NCCL_INCLUDE_DIR nccl.h
    HINTS "${_ss_wheel_nvidia}/nccl" ${_ss_cuda_roots} $ENV{NCCL_HOME}
    PATH_SUFFIXES include targets/x86_64-linux/include)
  find_library(SHARDSCOPE_NCCL_LIBRARY NAMES libnccl.so.2 nccl NAMES_PER_DIR
    HINTS "${_ss_wheel_nvidia}/nccl" ${_ss_cuda_roots} $ENV{NCCL_HOME}
    PATH_SUFFIXES lib lib64 targets/x86_64-linux/lib)
  find_path(SHARDSCOPE_CUPTI_INCLUDE_DIR cupti.h
    HINTS ${_ss_cuda_roots} PATH_SUFFIXES extras/CUPTI/include include targets/x86_64-linux/include)
  find_library(SHARDSCOPE_CUPTI_LIBRARY NAMES libcupti.so.13 cupti NAMES_PER_DIR
    HINTS "${_ss_wheel_nvidia}/cuda_cupti" "${_ss_wheel_nvidia}/cu13" ${_ss_cuda_roots}
    PATH_SUFFIXES lib lib64 extras/CUPTI/lib64 targets/x86_64-linux/lib
    NO_DEFAULT_PATH)
  # The CUDA runtime from the same place as CUPTI (for tests that drive a device without
  # LibTorch): one directory for both keeps the runtime search path unambiguous.
  find_library(SHARDSCOPE_CUDART_LIBRARY NAMES libcudart.so.13 cudart NAMES_PER_DIR
    HINTS "${_ss_wheel_nvidia}/cuda_runtime" "${_ss_wheel_nvidia}/cu13" ${_ss_cuda_roots}
    PATH_SUFFIXES lib lib64 targets/x86_64-linux/lib
    NO_DEFAULT_PATH)
  if(SHARDSCOPE_CUPTI_INCLUDE_DIR AND SHARDSCOPE_CUDART_LIBRARY AND SHARDSCOPE_CUPTI_LIBRARY
     AND SHARDSCOPE_NCCL_INCLUDE_DIR AND SHARDSCOPE_NCCL_LIBRARY)
    set(SHARDSCOPE_HAVE_CUDA ON)
    message(STATUS "ShardScope: CUDA ${CUDAToolkit_VERSION}; CUPTI ${SHARDSCOPE_CUPTI_LIBRARY}; "
                   "NCCL ${SHARDSCOPE_NCCL_LIBRARY}")
  endif()
endif()
shardscope_optional(CUDA "${SHARDSCOPE_WITH_CUDA}" "${SHARDSCOPE_HAVE_CUDA}"
  "the CUDA toolkit with CUPTI and NCCL was not found")
