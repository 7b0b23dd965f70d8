// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Chrome traces ShardScope writes (`simulate --trace`, `run --trace`), read through the
// one trace importer (kineto_import.h) and viewed as the step program's ops: the ops that
// carry a step-program op id, the measured steps, the memory counter and the run metadata.
// `calibrate`, `trace diff` and `trace overlap` share it.
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "engine/schedule/step_program.h"
#include "plans/core/expected.h"
#include "profiler/trace/trace.h"

namespace shardscope {

// Process and thread ids in the Chrome traces ShardScope writes. Perfetto treats pid 0 as
// the kernel's idle process and tid 0 as its thread (perfetto#394: "start from pid = 1"),
// and a thread_name record names a tid whatever its process, so ranks must not share tids:
// pid = rank + 1, tid = pid * 1000 + lane. Traces written before carried pid = rank;
// metadata.rank_pid_offset tells them apart.
constexpr int kRankPidOffset = 1;
constexpr int kOverflowLaneStride = 10;  // lane + 10·k: a stream's k-th overflow lane
constexpr size_t kMaxOverflowLanes = 9;  // lanes stay below kStepsLane
constexpr int kStepsLane = 100;          // the measured step spans
constexpr int kCounterLane = 101;        // memory counters (a counter's tid defaults to its pid)
[[nodiscard]] inline int tracePid(int rank) {
    return rank + kRankPidOffset;
}
[[nodiscard]] inline int traceTid(int rank, int lane) {
    return tracePid(rank) * 1000 + lane;
}

struct TraceOp {
    int32_t opId = -1;
    int32_t rank = 0;  // pid - metadata.rank_pid_offset
    int32_t step = 0;
    int64_t startNs = 0, endNs = 0;
    std::optional<OpKind> kind;  // from args.kind; empty when the name is unknown
    std::string label, unit, phase;
    int32_t groupSize = 0;  // a collective's args.group_size (0: not given)
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
    [[nodiscard]] bool measured() const {
        return producer == "shardscope run" || producer == "pytorch profiler";
    }
};

// Errors name the file (cannot open, not a Chrome trace, no op with an op id).
[[nodiscard]] Expected<TraceFile> readTraceFile(const std::string& path);
// The same view of a trace already imported.
[[nodiscard]] Expected<TraceFile> stepTraceOf(const Trace& t, const std::string& path);

[[nodiscard]] inline bool isComputeOp(OpKind k) {
    return k == OpKind::Forward || k == OpKind::Backward || k == OpKind::Recompute ||
           k == OpKind::OptimizerStep;
}

}  // namespace shardscope
