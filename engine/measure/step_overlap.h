// SPDX-License-Identifier: Apache-2.0
#pragma once
// `trace overlap` on a ShardScope trace (measured or simulated): per FSDP unit, phase and
// collective kind, the collectives' time and the part no compute on the same rank
// overlapped (exposed), summed over ranks and steps, largest exposure first. Collectives
// that run at the same time each count their own exposed time.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/measure/step_trace.h"

namespace shardscope {

struct StepOverlap {
    struct Row {
        std::string unit, phase, kind;     // unit "<root>" for the root
        double commNs = 0, exposedNs = 0;  // summed over rank-steps
        int64_t count = 0;
    };
    // Each collective on its own, in trace order (what the rows sum).
    struct Collective {
        std::string unit, phase, kind;
        int32_t rank = 0, step = 0;
        int64_t startNs = 0, endNs = 0, exposedNs = 0;
        int64_t peerWaitNs = -1;  // before the last rank started it (peer_wait.h); -1: unknown
    };
    std::vector<Row> rows;
    std::vector<Collective> collectives;
    int64_t rankSteps = 0;  // divide a row's sums by this for "per step"
    // Several ranks: the collectives of the group of every rank matched across ranks, and
    // their time waiting for the last rank to start them (summed over rank-steps).
    int64_t peerWaitMatched = 0;
    double peerWaitNs = 0;
};

[[nodiscard]] StepOverlap stepOverlap(const TraceFile& t);

}  // namespace shardscope
