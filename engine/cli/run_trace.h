// SPDX-License-Identifier: Apache-2.0
#pragma once
// The multi-rank trace `shardscope run --trace` writes from the ranks' results: per rank,
// the FSDP ops on one lane per stream (overflow lanes where measured ops overlap), the
// measured steps, the allocator's memory counter, and, from a CUDA run, the GPU work
// CUPTI recorded (device_activity) in the PyTorch profiler's terms.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace shardscope::cli {

[[nodiscard]] nlohmann::json mergedTrace(const std::vector<nlohmann::json>& ranks,
                                         const std::string& plan, nlohmann::json run);

}  // namespace shardscope::cli
