// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a kernel calibration reports besides the fitted cluster: the profiler's host share
// fitted to a step timed without the profiler, every priced kernel as CSV (measured, before
// and after), and the report as JSON (`calibrate --from-trace --json`).
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "engine/calibrate/kernel_fit.h"
#include "engine/calibrate/kernel_samples.h"
#include "plans/cluster/cluster.h"

namespace shardscope {

// What --step-ms found: the profiler's host time per recorded event that makes the simulated
// step equal the run's step without the profiler, and the steps either side.
struct ProfilerFit {
    bool tried = false;
    double nsPerEvent = 0, profiledStepNs = 0, stepNs = 0;
    std::string note;  // why nothing (or not all) could be taken out
};

// Bisects profiler_ns_per_event so that `simulatedStepNs` of the fitted cluster equals
// `targetStepNs` (the run's step without the profiler), and applies it to `fit`.
[[nodiscard]] ProfilerFit fitProfilerOverhead(
    KernelFit& fit, double targetStepNs,
    const std::function<double(const ClusterSpec&)>& simulatedStepNs);

// Every priced kernel, measured and predicted with `base` and the fitted cluster: what a
// user sorts to find the outliers (`calibrate --samples`).
[[nodiscard]] std::string kernelSamplesCsv(const KernelSamples& samples, const KernelFit& fit,
                                           const ClusterSpec& base);

// The report's inputs as the user named them.
struct KernelReportInputs {
    std::vector<std::string> inputs;  // traces, or the measurement's file
    std::string baseLabel;            // the starting cluster
    std::string output;               // the cluster written
    double targetStepNs = 0;          // --step-ms, 0 when not given
};

// The report as `calibrate --from-trace --json` prints it.
[[nodiscard]] nlohmann::json kernelFitJson(const KernelFit& fit, const KernelSamples& samples,
                                           const ProfilerFit& pf, const KernelReportInputs& in);

}  // namespace shardscope
