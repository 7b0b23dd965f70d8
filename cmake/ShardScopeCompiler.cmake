# SPDX-License-Identifier: Apache-2.0
# Compiler launcher and warnings shared by every target.
find_program(SHARDSCOPE_CCACHE ccache)
if(SHARDSCOPE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  set(CMAKE_CXX_COMPILER_LAUNCHER "${SHARDSCOPE_CCACHE}")
  message(STATUS "ShardScope: using ccache at ${SHARDSCOPE_CCACHE}")
endif()

add_library(shardscope_warnings INTERFACE)
target_compile_options(shardscope_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic -Wno-unused-parameter>)
