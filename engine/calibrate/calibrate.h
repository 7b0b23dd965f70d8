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

// The median (the mean of the middle two for an even count; 0 for none).
[[nodiscard]] double medianOf(std::vector<double> v);

// An efficiency curve from (size, efficiency) samples: one point per half-decade of size, at
// the median size and the median efficiency of its samples (at least `floor`), in increasing
// size. The kernels of one shape and their neighbours decide their own point; an outlier
// moves no point.
[[nodiscard]] std::vector<std::pair<double, double>> halfDecadeMedians(
    const std::vector<std::pair<double, double>>& samples, double floor);
// A curve from (size, seconds) samples, for work a model prices in aggregate: one point per
// half-decade of size, at the median size and the bin's total size over its total time,
// divided by `peak` (a fraction of it, at least `floor`). Large kernels weigh by their size,
// as they do in the time of the work they make up.
[[nodiscard]] std::vector<std::pair<double, double>> halfDecadeRates(
    const std::vector<std::pair<double, double>>& sizeAndSeconds, double peak, double floor);
// The same with `binsPerDecade` points a decade (halfDecadeMedians: 2).
[[nodiscard]] std::vector<std::pair<double, double>> binMedians(
    const std::vector<std::pair<double, double>>& samples, double floor, int binsPerDecade);

// Scales a curve so that no point is above 1; returns the factor (1 when none was): the
// caller raises the peak the efficiencies are fractions of by it.
[[nodiscard]] double capCurveAtOne(std::vector<std::pair<double, double>>& curve,
                                   double alsoConsider = 0);

// One collective line, time = k·latency + x / bus bandwidth, by least squares over the mean
// duration of each (k, x): x is factor·bytes (factor (n-1)/n, 2(n-1)/n for an all-reduce),
// k the latency's multiplier (2 for an all-reduce's two phases). With sizes less than 4x
// apart, or durations that do not grow with size, the latency stays `keepLatencyNs` and
// only the bandwidth is fitted (said in `note`).
struct CollectivePoint {
    double k = 1, x = 0, durNs = 0;
};
struct CollectiveLine {
    double latencyNs = 0, busBandwidth = 0;  // bytes/s
    bool fitted = false;
    std::string note;
};
[[nodiscard]] CollectiveLine fitCollectiveLine(const std::vector<CollectivePoint>& points,
                                               double keepLatencyNs);

[[nodiscard]] Expected<CalibrationFit> calibrate(const StepProgram& program,
                                                 const ClusterSpec& base,
                                                 const std::vector<MeasuredOp>& ops,
                                                 const std::string& sourceName);

}  // namespace shardscope
