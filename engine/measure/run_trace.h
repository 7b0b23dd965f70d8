// SPDX-License-Identifier: Apache-2.0
#pragma once
// The multi-rank trace `shardscope run --trace` writes from the ranks' results: per rank,
// the FSDP ops on one lane per stream (overflow lanes where measured ops overlap), the
// measured steps, the allocator's memory counter, and, from a CUDA run, the GPU work
// CUPTI recorded (device_activity) in the PyTorch profiler's terms.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace shardscope {

// Measured step breakdown of one rank's last step: compute busy time, communication time
// (union of collective intervals) and the part of it no compute overlapped. From the FSDP
// op spans on CPU; from the GPU's kernels when the rank has a CUPTI recording.
struct Breakdown {
    int64_t computeNs = 0, commNs = 0, exposedNs = 0;
};
[[nodiscard]] Breakdown measuredBreakdown(const nlohmann::json& rank);

[[nodiscard]] nlohmann::json mergedTrace(const std::vector<nlohmann::json>& ranks,
                                         const std::string& plan, nlohmann::json run);

}  // namespace shardscope
