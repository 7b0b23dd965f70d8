// SPDX-License-Identifier: Apache-2.0
#pragma once
// Fits a cluster's simulator parameters to a measured run of a step program (the ops a
// `shardscope run` trace recorded, joined to the program by op id):
//  - compute efficiency by FLOPs per kernel: the median achieved fraction of peak of the
//    compute ops that no collective overlapped (under 1% of their time), per half-decade
//    of FLOPs;
//  - memory efficiency: the bytes of all memory-bound ops (copies, the optimizer step) over
//    HBM bandwidth times their measured time;
//  - overlap slowdown: how much longer compute ops ran while a collective overlapped them
//    (those overlapped for at least 5% of their time);
//  - collectives: latency and bus bandwidth by least squares over each message size's median
//    duration (the typical wait for the other ranks included), time = k·latency +
//    factor·bytes / bandwidth (k 2 for all-reduce), as one protocol; latency only from
//    sizes at least 4x apart;
//  - CPU issue cost: the median gap between consecutive ops on the compute stream.
// Every fitted value replaces the cluster's and is named in its "sources".
#include <string>
#include <vector>

#include "engine/schedule/step_program.h"
#include "plans/cluster/cluster.h"
#include "plans/core/expected.h"

namespace shardscope {

struct MeasuredOp {
    int32_t opId = -1;  // into the step program
    int32_t rank = 0;
    int32_t step = 0;
    int64_t startNs = 0;
    int64_t endNs = 0;
};

struct CalibrationFit {
    ClusterSpec cluster;
    int64_t computeOps = 0, memoryOps = 0, collectiveOps = 0;
    double latencyNs = 0, busBandwidth = 0;  // bytes/s
    std::vector<std::string> notes;          // what could not be fitted, and why
};

[[nodiscard]] Expected<CalibrationFit> calibrate(const StepProgram& program,
                                                 const ClusterSpec& base,
                                                 const std::vector<MeasuredOp>& ops,
                                                 const std::string& sourceName);

}  // namespace shardscope
