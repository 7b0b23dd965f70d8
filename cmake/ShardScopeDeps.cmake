# SPDX-License-Identifier: Apache-2.0
# Finds the required and optional dependencies and sets SHARDSCOPE_HAVE_{GUI,TORCH,CUDA}.
find_package(nlohmann_json 3.10 REQUIRED)
find_package(ZLIB REQUIRED)
# simdjson (Debian libsimdjson-dev): the trace importer parses each event with its
# On-Demand API, several times faster than building a DOM per event.
find_package(simdjson REQUIRED)
find_package(Threads REQUIRED)

function(shardscope_optional name value found reason)
  if(value STREQUAL "ON" AND NOT found)
    message(FATAL_ERROR "SHARDSCOPE_WITH_${name}=ON but ${reason}")
  endif()
endfunction()

# --- Qt6 (GUI) -----------------------------------------------------------------------
set(SHARDSCOPE_HAVE_GUI OFF)
if(NOT SHARDSCOPE_WITH_GUI STREQUAL "OFF")
  find_package(Qt6 6.2 QUIET COMPONENTS Widgets Concurrent Charts Test)
  if(Qt6_FOUND)
    set(SHARDSCOPE_HAVE_GUI ON)
  endif()
  shardscope_optional(GUI "${SHARDSCOPE_WITH_GUI}" "${Qt6_FOUND}"
    "Qt6 Widgets/Concurrent/Charts/Test were not found (apt: qt6-base-dev qt6-charts-dev libqt6opengl6-dev)")
endif()

# --- LibTorch ----------------------------------------------------------------------------
# From CMAKE_PREFIX_PATH / Torch_DIR, else from the torch wheel of SHARDSCOPE_PYTHON.
set(SHARDSCOPE_HAVE_TORCH OFF)
if(NOT SHARDSCOPE_WITH_TORCH STREQUAL "OFF")
  include(ShardScopeTorch)
endif()

# --- CUDA toolkit, CUPTI, NCCL -------------------------------------------------------------
set(SHARDSCOPE_HAVE_CUDA OFF)
if(NOT SHARDSCOPE_WITH_CUDA STREQUAL "OFF")
  include(ShardScopeCuda)
endif()
