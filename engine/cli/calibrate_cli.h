// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the `calibrate` command's files share: the kernel fit's inputs and its finish (fit,
// write, report), and the modes each file implements.
#include <functional>
#include <string>
#include <vector>

#include "engine/calibrate/kernel_samples.h"
#include "engine/cli/args.h"
#include "plans/cluster/cluster.h"
#include "plans/plan/resolve.h"

namespace shardscope::cli {

// What a kernel fit was made from, for its report and the cluster it writes.
struct KernelFitInputs {
    std::vector<std::string> inputs;  // traces, or the measurement's file
    std::string source;               // for "sources" and errors
    std::string baseLabel;            // the starting cluster, as the user knows it
    std::string clusterName;          // the written cluster's name
    std::string headline;             // the report's first line
    // --step-ms: the run's step time without the profiler (ns), and the simulated step of the
    // run's model and plan on a cluster; the fit's profiler_ns_per_event makes them equal.
    double targetStepNs = 0;
    std::function<double(const ClusterSpec&)> simulatedStepNs;
};

// Fits, writes the cluster (and --samples), and prints the held-back table (or --json).
int finishKernelCalibration(const Args& a, const KernelSamples& samples, const ClusterSpec& base,
                            const KernelFitInputs& in);

// Whether the resolved plan has errors; they are printed, then the verdict.
bool reportPlanErrors(const ResolvedPlan& r);

// `calibrate --measure` (cmd_calibrate_measure.cpp).
int runCalibrateMeasure(const Args& a);

// `calibrate --trace` (cmd_calibrate_run.cpp).
int runCalibrateOpByOp(const Args& a);

}  // namespace shardscope::cli
