# SPDX-License-Identifier: Apache-2.0
# Locates LibTorch. Any LibTorch >= 2.6 given through CMAKE_PREFIX_PATH or Torch_DIR works;
# otherwise the torch wheel of SHARDSCOPE_PYTHON (the set-up script's virtual environment)
# provides it via torch.utils.cmake_prefix_path.
if(NOT Torch_DIR AND SHARDSCOPE_PYTHON)
  execute_process(
    COMMAND "${SHARDSCOPE_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _ss_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _ss_torch_rc ERROR_QUIET)
  if(_ss_torch_rc EQUAL 0 AND EXISTS "${_ss_torch_prefix}/Torch")
    list(APPEND CMAKE_PREFIX_PATH "${_ss_torch_prefix}")
  endif()
endif()
# Caffe2's CUDA setup otherwise try_run()s a GPU probe, which cannot work on build machines
# without a GPU. We compile no kernels of our own; the list covers A100 and H100/H200.
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0" CACHE STRING "CUDA architectures for LibTorch's CMake config")
endif()
find_package(Torch QUIET CONFIG)
if(Torch_FOUND)
  if(Torch_VERSION VERSION_LESS 2.6)
    message(WARNING "LibTorch ${Torch_VERSION} found but ShardScope needs >= 2.6; LibTorch parts disabled")
  else()
    # The torch wheel ships the compiled Gloo inside libtorch_cpu but not Gloo's headers,
    # which ProcessGroupGloo.hpp includes. Debian's libgloo-dev supplies headers only; its
    # library is never linked (one process, one Gloo).
    find_path(SHARDSCOPE_GLOO_INCLUDE_DIR gloo/algorithm.h
      HINTS "${TORCH_INSTALL_PREFIX}/include" /usr/include /usr/local/include)
    if(SHARDSCOPE_GLOO_INCLUDE_DIR)
      set(SHARDSCOPE_HAVE_TORCH ON)
      message(STATUS "ShardScope: LibTorch ${Torch_VERSION} at ${Torch_DIR}; Gloo headers in ${SHARDSCOPE_GLOO_INCLUDE_DIR}")
    else()
      message(WARNING "LibTorch found but Gloo headers are missing (apt: libgloo-dev); LibTorch parts disabled")
    endif()
  endif()
endif()
shardscope_optional(TORCH "${SHARDSCOPE_WITH_TORCH}" "${SHARDSCOPE_HAVE_TORCH}"
  "LibTorch >= 2.6 was not found (give CMAKE_PREFIX_PATH or SHARDSCOPE_PYTHON)")
