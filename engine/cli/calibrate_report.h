// SPDX-License-Identifier: Apache-2.0
#pragma once
// The text report of a kernel calibration (`calibrate --from-trace`, `--measure`).
#include <string>
#include <utility>
#include <vector>

#include "engine/calibrate/kernel_fit.h"
#include "engine/calibrate/kernel_report.h"
#include "engine/calibrate/kernel_samples.h"

namespace shardscope::cli {

// An efficiency curve on one line: "1e+09 FLOP: 0.450  1e+10 FLOP: 0.650  ...".
void printCurve(const std::vector<std::pair<double, double>>& curve, const char* unit);

// Prints the fitted curves, the host's pace, the notes, what was not priced and the
// held-back kernels predicted with `baseLabel`'s cluster (before) and the fitted one.
void printKernelFit(const KernelFit& fit, const KernelSamples& samples, const ProfilerFit& pf,
                    const std::string& headline, const std::string& baseLabel, double targetStepNs);

}  // namespace shardscope::cli
