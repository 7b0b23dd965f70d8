// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the LibTorch runtime offers this process: versions, CUDA devices, and whether the
// c10d backends work (a one-rank Gloo all-reduce is run for real). Kept free of torch
// headers so the CLI can include it cheaply.
#include <nlohmann/json.hpp>

namespace shardscope::exec {

[[nodiscard]] nlohmann::json runtimeInfo();

}  // namespace shardscope::exec
