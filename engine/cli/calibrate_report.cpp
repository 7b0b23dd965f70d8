// SPDX-License-Identifier: Apache-2.0
// The text report of `calibrate --from-trace` / `--measure`: the fitted curves, the host's
// pace, and the held-back kernels predicted before and after.
#include "engine/cli/calibrate_report.h"

#include <cstdio>
#include <iostream>

#include "engine/cli/common.h"
#include "engine/sim/cost_model.h"
#include "plans/core/strings.h"

namespace shardscope::cli {

// "1e+09 FLOP: 0.450  1e+10 FLOP: 0.650  ..."
void printCurve(const std::vector<std::pair<double, double>>& curve, const char* unit) {
    for (const auto& [x, e] : curve) {
        char b[64];
        std::snprintf(b, sizeof b, "%.3g %s: %.3f  ", x, unit, e);
        std::cout << b;
    }
}

namespace {

std::string percent(double frac) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%", 100.0 * frac);
    return b;
}

// The fitted efficiency curves: compute, memory (by bytes and by operator), attention.
void printCurves(const KernelFit& fit, const std::string& headline) {
    std::cout << headline << "\n"
              << "  " << fit.split << "\n\n  compute efficiency  ";
    printCurve(fit.cluster.sim.computeEfficiency, "FLOP");
    char line[256];
    std::snprintf(line, sizeof line,
                  "\n  memory efficiency   %.3f of %.0f GB/s (summed bytes); per kernel  ",
                  fit.cluster.sim.memoryEfficiency, fit.cluster.device.hbmBandwidth * 1e-9);
    std::cout << line;
    printCurve(fit.cluster.sim.memoryEfficiencyByBytes, "B");
    std::cout << "\n";
    if (const auto& byOp = fit.cluster.sim.memoryEfficiencyByOp; !byOp.empty()) {
        // The operators with their own curve (alphabetical, the first few named).
        std::cout << "  per operator        " << byOp.size() << " with their own curve (";
        size_t k = 0;
        for (const auto& [op, curve] : byOp) {
            if (k == 4) {
                std::cout << ", ...";
                break;
            }
            std::cout << (k++ ? ", " : "") << op;
        }
        std::cout << "); the others use the curve by bytes\n";
        // The curves the simulator itself takes (its kernel lists name no operator).
        const std::pair<const char*, const char*> simulated[] = {
            {kModuleKernelsKey, "  modules' kernels    "},
            {kForeachOptimizerKey, "  optimizer (foreach) "}};
        for (const auto& [key, what] : simulated)
            if (auto it = byOp.find(key); it != byOp.end()) {
                std::cout << what;
                printCurve(it->second, "B");
                std::cout << "\n";
            }
    }
    if (fit.cluster.sources.count("/sim/attention_efficiency")) {
        std::cout << "  attention           ";
        printCurve(fit.cluster.sim.attentionEfficiency, "FLOP");
        std::cout << "\n";
    }
    if (fit.cluster.sources.count("/sim/masked_attention_efficiency")) {
        std::cout << "  masked attention    ";
        printCurve(fit.cluster.sim.maskedAttentionEfficiency, "FLOP");
        std::cout << "\n";
    }
}

// The host's pace: launch rates per thread, the profiler's share, gaps between kernels,
// the reduce-scatter copy-in's host time, the device waiting for the host, collectives.
void printHost(const KernelFit& fit, const ProfilerFit& pf, double targetStepNs) {
    char line[256];
    // A fitted median and the held-back steps' (cpu_launch_ns, kernel_gap_ns).
    auto printMedian = [&](const char* label, const SplitMedian& m) {
        if (m.fitted <= 0) return;
        std::snprintf(line, sizeof line, "  %s %.1f us (median of %lld)", label, m.fittedNs * 1e-3,
                      static_cast<long long>(m.fitted));
        std::cout << line;
        if (m.heldBack > 0) {
            std::snprintf(line, sizeof line, "; held-back steps %.1f us (%+.1f%%)",
                          m.heldBackNs * 1e-3, 100.0 * (m.fittedNs / m.heldBackNs - 1.0));
            std::cout << line;
        }
        std::cout << "\n";
    };
    printMedian("CPU per kernel      launch to launch", fit.launch);
    if (fit.launchForward.fitted > 0) {
        auto printMean = [&](const char* label, const SplitMedian& m, double events,
                             double written) {
            std::snprintf(line, sizeof line, "  %s %.1f us (mean of %lld)", label,
                          m.fittedNs * 1e-3, static_cast<long long>(m.fitted));
            std::cout << line;
            if (m.heldBack > 0) {
                std::snprintf(line, sizeof line, "; held-back steps %.1f us (%+.1f%%)",
                              m.heldBackNs * 1e-3, 100.0 * (m.fittedNs / m.heldBackNs - 1.0));
                std::cout << line;
            }
            std::snprintf(line, sizeof line, "; %.1f profiler events a kernel", events);
            std::cout << line;
            if (written != m.fittedNs) {
                std::snprintf(line, sizeof line, "; without the profiler %.1f us", written * 1e-3);
                std::cout << line;
            }
            std::cout << "\n";
        };
        printMean("  in the forward    the model's thread, outside the optimizer",
                  fit.launchForward, fit.eventsPerLaunchForward,
                  fit.cluster.sim.cpuLaunchForwardNs);
        printMean("  in the backward   autograd's thread (recompute included)", fit.launchBackward,
                  fit.eventsPerLaunchBackward, fit.cluster.sim.cpuLaunchBackwardNs);
        if (const double perEvent = fit.cluster.sim.profilerNsPerEvent; perEvent > 0) {
            std::snprintf(line, sizeof line,
                          "  profiler overhead   %.2f us a recorded event on the host (%s)\n",
                          perEvent * 1e-3, pf.tried ? "fitted to --step-ms" : "the base cluster's");
            std::cout << line;
        }
        if (pf.tried && pf.nsPerEvent > 0) {
            std::snprintf(line, sizeof line,
                          "  step                %.1f ms simulated without the profiler, against "
                          "your %.1f ms (%.1f ms at the profiled pace)\n",
                          pf.stepNs * 1e-6, targetStepNs * 1e-6, pf.profiledStepNs * 1e-6);
            std::cout << line;
        }
    }
    printMedian("GPU between kernels from one to the next queued", fit.kernelGap);
    if (const auto& cc = fit.chunkCatHost; cc.fitted > 0) {
        std::snprintf(line, sizeof line,
                      "  CPU per _chunk_cat  %.2f ns a block of one chunk (lower quartile of %lld "
                      "reduce-scatter copy-ins)",
                      cc.fittedNs, static_cast<long long>(cc.fitted));
        std::cout << line;
        if (cc.heldBack > 0 && cc.heldBackMeasuredNs > 0) {
            std::snprintf(line, sizeof line,
                          "; held-back steps' %lld: %.2f ms measured, %.2f ms predicted (%+.1f%%)",
                          static_cast<long long>(cc.heldBack), cc.heldBackMeasuredNs * 1e-6,
                          cc.heldBackPredictedNs * 1e-6,
                          100.0 * (cc.heldBackPredictedNs / cc.heldBackMeasuredNs - 1.0));
            std::cout << line;
        }
        std::cout << "\n";
    }
    if (fit.hostWaitSteps > 0) {
        std::snprintf(line, sizeof line,
                      "  GPU waiting for CPU %.2f ms of a %.1f ms step (%.1f %%; median of %lld "
                      "steps): launched after the device went idle\n",
                      fit.hostWaitNs * 1e-6, fit.stepSpanNs * 1e-6,
                      fit.stepSpanNs > 0 ? 100.0 * fit.hostWaitNs / fit.stepSpanNs : 0.0,
                      static_cast<long long>(fit.hostWaitSteps));
        std::cout << line;
    }
    if (!fit.cluster.sim.protocols.empty() && fit.cluster.sources.count("/sim/protocols")) {
        std::snprintf(line, sizeof line,
                      "  collectives         %.1f us + bytes / %.2f GB/s (bus, within a node)\n",
                      fit.cluster.sim.protocols.front().baseNs * 1e-3,
                      fit.cluster.node.intraBandwidth * fit.cluster.sim.intraEfficiency * 1e-9);
        std::cout << line;
    }
}

}  // namespace

void printKernelFit(const KernelFit& fit, const KernelSamples& samples, const ProfilerFit& pf,
                    const std::string& headline, const std::string& baseLabel,
                    double targetStepNs) {
    printCurves(fit, headline);
    printHost(fit, pf, targetStepNs);
    for (const auto& n : fit.notes)
        std::cout << "  note: " << n << "\n";
    if (!samples.skipped.empty()) {
        std::cout << "  not priced:\n";
        for (const auto& [why, n] : samples.skipped)
            std::cout << "    " << withThousands(n) << "  " << why << "\n";
    }
    std::cout << "\nHeld-back kernels, predicted with " << baseLabel
              << " (before) and the calibrated cluster (after):\n";
    Table t({"CLASS", "FITTED", "HELD", "MEASURED", "BEFORE", "ERR", "MEDIAN |ERR|", "AFTER", "ERR",
             "MEDIAN |ERR|"},
            {false, true, true, true, true, true, true, true, true, true});
    for (const auto& r : fit.classes) {
        if (!r.priced) {
            t.row({kernelClassName(r.cls), withThousands(r.fitted), withThousands(r.heldOut),
                   formatMs(r.measuredNs, 3), "not priced", "", "", "", "", ""});
            continue;
        }
        if (r.heldOut == 0) {
            t.row({kernelClassName(r.cls), withThousands(r.fitted), "0", "-", "-", "", "", "-", "",
                   ""});
            continue;
        }
        t.row({kernelClassName(r.cls), withThousands(r.fitted), withThousands(r.heldOut),
               formatMs(r.measuredNs, 3), formatMs(r.beforeNs, 3),
               formatError(r.measuredNs, r.beforeNs), percent(r.beforeMedianErr),
               formatMs(r.afterNs, 3), formatError(r.measuredNs, r.afterNs),
               percent(r.afterMedianErr)});
    }
    t.print(std::cout);
}

}  // namespace shardscope::cli
