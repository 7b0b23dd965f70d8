// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reads the Chrome traces ShardScope writes (`simulate --trace`, `run --trace`): the ops that
// carry a step-program op id, the measured steps, the memory counter and the run metadata.
// `calibrate`, `trace diff` and `trace overlap` share it.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "engine/schedule/step_program.h"
#include "plans/core/expected.h"

namespace shardscope::cli {

struct TraceOp {
    int32_t opId = -1;
    int32_t rank = 0;  // the trace's pid
    int32_t step = 0;
    int64_t startNs = 0, endNs = 0;
    std::optional<OpKind> kind;  // from args.kind; empty when the name is unknown
    std::string label, unit, phase;
};

struct TraceFile {
    std::string path, producer;
    nlohmann::json run;  // metadata.run (`shardscope run --trace`), or null
    std::vector<TraceOp> ops;
    int ranks = 0;
    // Measured traces: the slowest rank's mean of its step spans; simulated ones (no step
    // spans): the last op's end.
    double stepNs = 0;
    double peakAllocated = 0;  // the largest "memory (bytes)" counter of any rank
    [[nodiscard]] bool measured() const { return producer == "shardscope run"; }
};

// Errors name the file (cannot open, not a Chrome trace, no op with an op id).
[[nodiscard]] Expected<TraceFile> readTraceFile(const std::string& path);

[[nodiscard]] inline bool isComputeOp(OpKind k) {
    return k == OpKind::Forward || k == OpKind::Backward || k == OpKind::Recompute ||
           k == OpKind::OptimizerStep;
}

}  // namespace shardscope::cli
