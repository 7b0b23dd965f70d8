// SPDX-License-Identifier: Apache-2.0
// `shardscope calibrate`: fit a cluster's simulator parameters to a measured run and print
// the simulation error before and after.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/fsdp_trace_cli.h"
#include "engine/cli/launch.h"
#include "engine/schedule/step_program.h"
#include "engine/calibrate/calibrate.h"
#include "engine/sim/cost_model.h"
#include "engine/sim/simulator.h"
#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "plans/plan/resolve.h"
#include "engine/calibrate/kernel_fit.h"
#include "engine/calibrate/kernel_samples.h"
#include "engine/measure/step_trace.h"
#include "engine/measure/trace_diff.h"
#include "profiler/analysis/trace_loader.h"

namespace shardscope::cli {

namespace {

// "1e+09 FLOP: 0.450  1e+10 FLOP: 0.650  ..."
void printCurve(const std::vector<std::pair<double, double>>& curve, const char* unit) {
    for (const auto& [x, e] : curve) {
        char b[64];
        std::snprintf(b, sizeof b, "%.3g %s: %.3f  ", x, unit, e);
        std::cout << b;
    }
}

std::string percent(double frac) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%", 100.0 * frac);
    return b;
}

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

// What --step-ms found: the profiler's host time per recorded event that makes the simulated
// step equal the run's step without the profiler, and the steps either side.
struct ProfilerFit {
    bool tried = false;
    double nsPerEvent = 0, profiledStepNs = 0, stepNs = 0;
    std::string note;  // why nothing (or not all) could be taken out
};

// Bisects profiler_ns_per_event: the simulated step shrinks (never grows) as the launch rates
// do. Between 0 and the overhead that takes each rate down to a quarter of its profiled mean.
ProfilerFit fitProfilerOverhead(KernelFit& fit, const KernelFitInputs& in) {
    ProfilerFit r;
    r.tried = true;
    const double target = in.targetStepNs;
    char b[320];
    if (fit.launchForward.fitted <= 0 || fit.eventsPerLaunchForward <= 0 ||
        fit.eventsPerLaunchBackward <= 0) {
        r.note =
            "--step-ms: no launch rates per thread were read (the trace needs ProfilerSteps and "
            "kernels launched by the model's thread and autograd's), so the profiler's share "
            "cannot be fitted";
        return r;
    }
    // Each candidate is simulated on a copy of the fitted cluster with only the launch rates
    // changed; the fit itself (its sources and notes) is written once, at the end.
    ClusterSpec candidate = fit.cluster;
    auto stepAt = [&](double ns) {
        setLaunchRatesWithout(fit, ns, candidate.sim);
        return in.simulatedStepNs(candidate);
    };
    const double hi = 0.75 * std::min(fit.launchForward.fittedNs / fit.eventsPerLaunchForward,
                                      fit.launchBackward.fittedNs / fit.eventsPerLaunchBackward);
    r.profiledStepNs = stepAt(0);
    const double fastest = stepAt(hi);
    double ns = 0;
    if (target >= r.profiledStepNs) {
        std::snprintf(b, sizeof b,
                      "--step-ms: the simulated step with the profiled launch rates, %.1f ms, is "
                      "already no longer than your %.1f ms: nothing of the profiler's is taken out "
                      "(profiler_ns_per_event 0)",
                      r.profiledStepNs * 1e-6, target * 1e-6);
        r.note = b;
    } else if (r.profiledStepNs - fastest < 0.01 * target) {
        std::snprintf(b, sizeof b,
                      "--step-ms: the simulated step hardly depends on the host's pace (%.1f to "
                      "%.1f ms): a device-bound step cannot tell the profiler's share "
                      "(profiler_ns_per_event 0); fit it on a host-bound run",
                      r.profiledStepNs * 1e-6, fastest * 1e-6);
        r.note = b;
    } else if (target <= fastest) {
        ns = hi;
        std::snprintf(b, sizeof b,
                      "--step-ms: even with the launch rates at a quarter of the profiled ones the "
                      "simulated step is %.1f ms, longer than your %.1f ms: the difference is "
                      "elsewhere than the host's pace",
                      fastest * 1e-6, target * 1e-6);
        r.note = b;
    } else {
        double lo = 0, up = hi;
        for (int i = 0; i < 40 && up - lo > 1; ++i) {
            const double mid = 0.5 * (lo + up);
            (stepAt(mid) > target ? lo : up) = mid;
        }
        ns = 0.5 * (lo + up);
    }
    std::snprintf(b, sizeof b,
                  "fitted by `shardscope calibrate --from-trace --step-ms %.3f` (the run's step "
                  "without the profiler)",
                  target * 1e-6);
    r.nsPerEvent = ns;
    r.stepNs = stepAt(ns);
    applyProfilerOverhead(fit, ns, ns > 0 ? std::string(b) : std::string());
    return r;
}

// A fitted median and the held-back steps' (cpu_launch_ns, kernel_gap_ns), as --json says it.
nlohmann::json splitMedianJson(const SplitMedian& m) {
    return {{"fitted", m.fitted},
            {"fitted_median_ns", m.fittedNs},
            {"held_back", m.heldBack},
            {"held_back_median_ns", m.heldBackNs}};
}

// Fits, writes the cluster (and --samples), and prints the held-back table (or --json).
int finishKernelCalibration(const Args& a, const KernelSamples& samples, const ClusterSpec& base,
                            const KernelFitInputs& in) {
    auto fit = fitKernels(samples, base, in.source);
    if (!fit) {
        std::cerr << "error: " << fit.error() << "\n";
        for (const auto& [why, n] : samples.skipped)
            std::cerr << "  skipped " << n << ": " << why << "\n";
        return kExitFailed;
    }
    ProfilerFit pf;
    if (in.targetStepNs > 0 && in.simulatedStepNs) {
        pf = fitProfilerOverhead(*fit, in);
        if (!pf.note.empty()) fit->notes.push_back(pf.note);
    }
    fit->cluster.sources.erase("/sim");
    fit->cluster.name = in.clusterName;
    if (auto check = clusterFromJson(clusterToJson(fit->cluster), a.get("--output")); !check) {
        std::cerr << "error: the calibrated cluster does not validate: " << check.error() << "\n";
        return kExitFailed;
    }
    if (Status w =
            writeFileAtomically(a.get("--output"), clusterToJson(fit->cluster).dump(2) + "\n");
        !w) {
        std::cerr << "error: " << w.error() << "\n";
        return kExitUsage;
    }
    if (a.has("--samples")) {
        // Every priced kernel, measured and predicted: what a user sorts to find the outliers.
        std::ostringstream csv;
        csv.precision(17);
        csv << "trace,step,class,held_out,op,kernel,dtype,flops,bytes,group_size,collective,"
               "measured_ns,before_ns,after_ns,m,n,k\n";
        auto quoted = [](const std::string& v) {
            std::string q = "\"";
            for (char ch : v)
                q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
            return q + "\"";
        };
        for (size_t i = 0; i < samples.samples.size(); ++i) {
            const auto& k = samples.samples[i];
            csv << k.trace << "," << k.step << "," << kernelClassName(k.cls) << ","
                << (fit->heldOut[i] ? 1 : 0) << "," << quoted(k.op) << "," << quoted(k.kernel)
                << "," << dtypeName(k.dtype) << "," << k.flops << "," << k.bytes << ","
                << k.groupSize << "," << k.collective << "," << k.durNs << ","
                << predictKernelNs(base, k) << "," << predictKernelNs(fit->cluster, k) << "," << k.m
                << "," << k.n << "," << k.k << "\n";
        }
        if (Status w = writeFileAtomically(a.get("--samples"), csv.str()); !w) {
            std::cerr << "error: " << w.error() << "\n";
            return kExitUsage;
        }
    }
    nlohmann::json classes = nlohmann::json::array();
    for (const auto& r : fit->classes) {
        nlohmann::json j{{"class", kernelClassName(r.cls)},
                         {"fitted", r.fitted},
                         {"held_out", r.heldOut},
                         {"priced", r.priced},
                         {"held_out_measured_ns", r.measuredNs}};
        if (r.priced) {
            auto err = [&](double v) { return r.measuredNs > 0 ? v / r.measuredNs - 1.0 : 0.0; };
            j["before"] = {{"predicted_ns", r.beforeNs},
                           {"total_error", err(r.beforeNs)},
                           {"median_abs_error", r.beforeMedianErr}};
            j["after"] = {{"predicted_ns", r.afterNs},
                          {"total_error", err(r.afterNs)},
                          {"median_abs_error", r.afterMedianErr}};
        }
        classes.push_back(j);
    }
    nlohmann::json skipped = nlohmann::json::object();
    for (const auto& [why, n] : samples.skipped)
        skipped[why] = n;
    nlohmann::json out{
        {"inputs", in.inputs},
        {"cluster", in.baseLabel},
        {"output", a.get("--output")},
        {"host_only", samples.hostOnly},
        {"record_shapes", samples.hasShapes},
        {"split", fit->split},
        {"classes", classes},
        {"skipped", skipped},
        {"fitted",
         {{"compute_efficiency", fit->cluster.sim.computeEfficiency},
          {"memory_efficiency", fit->cluster.sim.memoryEfficiency},
          {"memory_efficiency_by_bytes", fit->cluster.sim.memoryEfficiencyByBytes},
          {"memory_efficiency_by_op", fit->cluster.sim.memoryEfficiencyByOp},
          {"attention_efficiency", fit->cluster.sim.attentionEfficiency},
          {"masked_attention_efficiency", fit->cluster.sim.maskedAttentionEfficiency},
          {"cpu_launch_ns", fit->cluster.sim.cpuLaunchNs},
          {"launch_gaps", splitMedianJson(fit->launch)},
          {"cpu_launch_forward_ns", fit->cluster.sim.cpuLaunchForwardNs},
          {"forward_launch_gaps", splitMedianJson(fit->launchForward)},
          {"cpu_launch_backward_ns", fit->cluster.sim.cpuLaunchBackwardNs},
          {"backward_launch_gaps", splitMedianJson(fit->launchBackward)},
          {"profiler_events_per_kernel",
           {{"forward", fit->eventsPerLaunchForward}, {"backward", fit->eventsPerLaunchBackward}}},
          {"profiler_ns_per_event", fit->cluster.sim.profilerNsPerEvent},
          {"kernel_gap_ns", fit->cluster.sim.kernelGapNs},
          {"kernel_gaps", splitMedianJson(fit->kernelGap)},
          {"chunk_cat_host_ns_per_block", fit->cluster.sim.chunkCatHostNsPerBlock},
          {"chunk_cat_host",
           {{"fitted", fit->chunkCatHost.fitted},
            {"fitted_median_ns_per_block", fit->chunkCatHost.fittedNs},
            {"held_back", fit->chunkCatHost.heldBack},
            {"held_back_median_ns_per_block", fit->chunkCatHost.heldBackNs},
            {"held_back_measured_ns", fit->chunkCatHost.heldBackMeasuredNs},
            {"held_back_predicted_ns", fit->chunkCatHost.heldBackPredictedNs}}},
          {"host_wait",
           {{"ns_per_step", fit->hostWaitNs},
            {"step_span_ns", fit->stepSpanNs},
            {"steps", fit->hostWaitSteps}}},
          {"hbm_bandwidth_bytes_per_s", fit->cluster.device.hbmBandwidth},
          {"protocols", clusterToJson(fit->cluster)["sim"]["protocols"]},
          {"intra_bandwidth_bytes_per_s", fit->cluster.node.intraBandwidth},
          {"nic_bandwidth_bytes_per_s", fit->cluster.network.nicBandwidth}}},
        {"notes", fit->notes}};
    if (pf.tried)
        out["step_ms_fit"] = {{"step_ms", in.targetStepNs * 1e-6},
                              {"profiled_rates_step_ms", pf.profiledStepNs * 1e-6},
                              {"fitted_step_ms", pf.stepNs * 1e-6},
                              {"profiler_ns_per_event", pf.nsPerEvent}};
    if (a.flag("--json")) return emitJson(out, "").ok() ? kExitOk : kExitUsage;
    std::cout << in.headline << "\n"
              << "  " << fit->split << "\n\n  compute efficiency  ";
    printCurve(fit->cluster.sim.computeEfficiency, "FLOP");
    char line[256];
    std::snprintf(line, sizeof line,
                  "\n  memory efficiency   %.3f of %.0f GB/s (summed bytes); per kernel  ",
                  fit->cluster.sim.memoryEfficiency, fit->cluster.device.hbmBandwidth * 1e-9);
    std::cout << line;
    printCurve(fit->cluster.sim.memoryEfficiencyByBytes, "B");
    std::cout << "\n";
    if (const auto& byOp = fit->cluster.sim.memoryEfficiencyByOp; !byOp.empty()) {
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
    if (fit->cluster.sources.count("/sim/attention_efficiency")) {
        std::cout << "  attention           ";
        printCurve(fit->cluster.sim.attentionEfficiency, "FLOP");
        std::cout << "\n";
    }
    if (fit->cluster.sources.count("/sim/masked_attention_efficiency")) {
        std::cout << "  masked attention    ";
        printCurve(fit->cluster.sim.maskedAttentionEfficiency, "FLOP");
        std::cout << "\n";
    }
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
    printMedian("CPU per kernel      launch to launch", fit->launch);
    if (fit->launchForward.fitted > 0) {
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
                  fit->launchForward, fit->eventsPerLaunchForward,
                  fit->cluster.sim.cpuLaunchForwardNs);
        printMean("  in the backward   autograd's thread (recompute included)", fit->launchBackward,
                  fit->eventsPerLaunchBackward, fit->cluster.sim.cpuLaunchBackwardNs);
        if (const double perEvent = fit->cluster.sim.profilerNsPerEvent; perEvent > 0) {
            std::snprintf(line, sizeof line,
                          "  profiler overhead   %.2f us a recorded event on the host (%s)\n",
                          perEvent * 1e-3, pf.tried ? "fitted to --step-ms" : "the base cluster's");
            std::cout << line;
        }
        if (pf.tried && pf.nsPerEvent > 0) {
            std::snprintf(line, sizeof line,
                          "  step                %.1f ms simulated without the profiler, against "
                          "your %.1f ms (%.1f ms at the profiled pace)\n",
                          pf.stepNs * 1e-6, in.targetStepNs * 1e-6, pf.profiledStepNs * 1e-6);
            std::cout << line;
        }
    }
    printMedian("GPU between kernels from one to the next queued", fit->kernelGap);
    if (const auto& cc = fit->chunkCatHost; cc.fitted > 0) {
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
    if (fit->hostWaitSteps > 0) {
        std::snprintf(line, sizeof line,
                      "  GPU waiting for CPU %.2f ms of a %.1f ms step (%.1f %%; median of %lld "
                      "steps): launched after the device went idle\n",
                      fit->hostWaitNs * 1e-6, fit->stepSpanNs * 1e-6,
                      fit->stepSpanNs > 0 ? 100.0 * fit->hostWaitNs / fit->stepSpanNs : 0.0,
                      static_cast<long long>(fit->hostWaitSteps));
        std::cout << line;
    }
    if (!fit->cluster.sim.protocols.empty() && fit->cluster.sources.count("/sim/protocols")) {
        std::snprintf(line, sizeof line,
                      "  collectives         %.1f us + bytes / %.2f GB/s (bus, within a node)\n",
                      fit->cluster.sim.protocols.front().baseNs * 1e-3,
                      fit->cluster.node.intraBandwidth * fit->cluster.sim.intraEfficiency * 1e-9);
        std::cout << line;
    }
    for (const auto& n : fit->notes)
        std::cout << "  note: " << n << "\n";
    if (!samples.skipped.empty()) {
        std::cout << "  not priced:\n";
        for (const auto& [why, n] : samples.skipped)
            std::cout << "    " << withThousands(n) << "  " << why << "\n";
    }
    std::cout << "\nHeld-back kernels, predicted with " << in.baseLabel
              << " (before) and the calibrated cluster (after):\n";
    Table t({"CLASS", "FITTED", "HELD", "MEASURED", "BEFORE", "ERR", "MEDIAN |ERR|", "AFTER", "ERR",
             "MEDIAN |ERR|"},
            {false, true, true, true, true, true, true, true, true, true});
    for (const auto& r : fit->classes) {
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
    std::cout << "\nWrote " << a.get("--output") << "\n";
    return kExitOk;
}

// Whether the resolved plan has errors; they are printed, then the verdict.
bool reportPlanErrors(const ResolvedPlan& r) {
    if (!r.hasErrors()) return false;
    for (const auto& pr : r.problems)
        std::cerr << pr.toString() << "\n";
    std::cerr << "error: the plan has errors\n";
    return true;
}

// `calibrate --from-trace`: the cluster fitted to the kernels of real profiler traces.
int runCalibrateFromTrace(const Args& a) {
    std::vector<std::string> traces{a.get("--from-trace")};
    for (const auto& p : a.positionals())
        traces.push_back(p);
    auto c = loadClusterNamed(a.get("--cluster"));
    if (failed(c)) return kExitUsage;
    const ClusterSpec base = std::move(*c);
    KinetoImportOptions o = traceImportOptions();
    o.keepAllOpInputs = true;
    // With the model and the plan that ran, the optimizer's foreach kernels are sized by the
    // parameters each rank's AdamW steps (a trace does not size them: record_shapes gives a
    // TensorList's dims as []) and get a curve of their own.
    KernelSampleOptions so;
    double targetStepNs = 0;
    if (a.has("--step-ms")) {
        const std::string v = a.get("--step-ms");
        try {
            size_t used = 0;
            targetStepNs = std::stod(v, &used) * 1e6;
            if (used != v.size() || !(targetStepNs > 0) || targetStepNs > 1e13)
                throw std::invalid_argument("range");
        } catch (const std::exception&) {
            std::cerr << "error: --step-ms: expected the step's milliseconds (a positive number), "
                         "got \""
                      << v << "\"\n";
            return kExitUsage;
        }
        if (!a.has("--model") || !a.has("--plan")) {
            std::cerr << "error: --step-ms needs --model and --plan: the run's step is simulated "
                         "to fit the profiler's share of the host's time\n";
            return kExitUsage;
        }
    }
    std::shared_ptr<const ModelGraph> stepModel;
    std::optional<Plan> stepPlan;
    if (a.has("--model") != a.has("--plan")) {
        std::cerr << "error: --from-trace takes --model and --plan together (the model and plan "
                     "that ran size the optimizer's foreach kernels)\n";
        return kExitUsage;
    }
    if (a.has("--model")) {
        auto model = loadModelArg(a);
        if (failed(model)) return kExitUsage;
        auto plan = loadPlanFile(a.get("--plan"));
        if (failed(plan)) return kExitUsage;
        const ResolvedPlan r = resolvePlan(*model, *plan, &base, a.get("--plan"));
        if (reportPlanErrors(r)) return kExitFailed;
        so.optimizerParamBytes = static_cast<double>(r.optimizerForeach.bytes);
        if (!a.flag("--json"))
            std::cerr << "optimizer: AdamW's foreach kernels sized by "
                      << formatBytes(r.optimizerForeach.bytes) << " of parameters a rank ("
                      << a.get("--model") << ", " << a.get("--plan") << ")\n";
        // For --step-ms (r points into the model: nothing of r is used past here).
        stepModel = std::make_shared<const ModelGraph>(std::move(*model));
        stepPlan = std::move(*plan);
    }
    KernelSamples samples;
    std::vector<std::string> names, skippedFiles;
    int32_t index = 0;
    const bool json = a.flag("--json");
    const Status st = forEachTrace(
        traces, o,
        [&](const std::string& path, Trace&& t) -> Status {
            const size_t before = samples.samples.size();
            collectKernelSamples(t, index++, samples, so);
            names.push_back(path);
            if (!json)
                std::cerr << "read " << path << ": rank " << t.rank << ", "
                          << (samples.samples.size() - before) << " kernels priced\n";
            return {};
        },
        &skippedFiles);
    if (!st) {
        std::cerr << "error: " << st.error() << "\n";
        return kExitUsage;
    }
    for (const auto& s : skippedFiles)
        std::cerr << "skipped " << s << "\n";
    std::string source =
        names.size() == 1 ? names.front()
                          : std::to_string(names.size()) + " traces (" + names.front() + ", ...)";
    if (!samples.hasShapes && samples.deviceKernels > 0)
        std::cerr << "note: " << source
                  << " was recorded without record_shapes: GEMM FLOPs and kernel bytes are "
                     "unknown, only collectives can be fitted (record with "
                     "torch.profiler.profile(record_shapes=True))\n";
    for (const auto& d : samples.deviceNames)
        if (!sameDevice(d, base.device.name))
            std::cerr << "warning: the trace ran on " << d << ", and " << a.get("--cluster")
                      << " describes " << base.device.name
                      << ": efficiencies are fractions of that cluster's peaks, so start from a "
                         "cluster of the GPU that ran the trace\n";
    KernelFitInputs in;
    in.inputs = names;
    in.source = source;
    in.baseLabel = a.get("--cluster");
    in.clusterName =
        base.name + ", calibrated on " + std::filesystem::path(names.front()).filename().string();
    in.headline = "Calibrated " + a.get("--cluster") + " from the kernels of " + source +
                  (samples.hostOnly ? " (CPU only: host ops are the kernels)" : "");
    if (targetStepNs > 0) {
        in.targetStepNs = targetStepNs;
        const std::string planFile = a.get("--plan");
        // The plan is resolved and its program built once, on the first cluster it sees (the
        // fitted one): the search only changes the launch rates, which the program does not
        // depend on.
        struct Built {
            int64_t worldSize = 0;
            StepProgram program;
        };
        auto built = std::make_shared<std::optional<Built>>();
        in.simulatedStepNs = [stepModel, stepPlan, planFile, built](const ClusterSpec& c) {
            if (!*built) {
                const ResolvedPlan r = resolvePlan(*stepModel, *stepPlan, &c, planFile);
                *built = Built{r.worldSize, buildStepProgram(r, stepOptionsFor(*stepPlan, c))};
            }
            const Built& b = **built;
            return static_cast<double>(simulate(b.program, c, b.worldSize).stepNs);
        };
    }
    return finishKernelCalibration(a, samples, base, in);
}

// `calibrate --measure`: microbenchmarks of this machine (shardscope-engine measure on local
// ranks), fitted like a trace's kernels, from --cluster or from a cluster made of what was
// measured (the best GEMM rate per dtype as the peak, the best copy rate as the memory
// bandwidth, the local ranks as one node).
int runCalibrateMeasure(const Args& a) {
    const std::string device = a.has("--device") ? a.get("--device") : "cpu";
    if (device != "cpu" && device != "cuda") {
        std::cerr << "error: --device: expected cpu or cuda, got \"" << device << "\"\n";
        return kExitUsage;
    }
    std::vector<int64_t> ints;
    if (!readIntOptions(a, {"--nproc", "--threads", "--reps", "--timeout-s"}, {1, 1, 2, 1}, ints))
        return kExitUsage;
    const int64_t nproc = ints[0] ? ints[0] : device == "cuda" ? 1 : 2;
    const auto rankThreads = threadsPerRank(nproc, ints[1]);
    if (!rankThreads) {
        std::cerr << "error: " << rankThreads.error() << "\n";
        return kExitUsage;
    }
    const int64_t threads = *rankThreads;
    std::optional<ClusterSpec> given;
    if (a.has("--cluster")) {
        auto c = loadClusterNamed(a.get("--cluster"));
        if (failed(c)) return kExitUsage;
        given = std::move(*c);
    }
    auto engine = findEngine();
    if (failed(engine)) return kExitFailed;
    auto dir = makeRunFolder("shardscope-measure");
    if (failed(dir)) return kExitFailed;
    const int64_t timeoutS = ints[3] ? ints[3] : 300;
    std::vector<std::string> args{engine->string(), "measure",
                                  "--device",       device,
                                  "--threads",      std::to_string(threads),
                                  "--reps",         std::to_string(ints[2] ? ints[2] : 4),
                                  "--timeout-s",    std::to_string(timeoutS)};
    if (a.flag("--quick")) args.push_back("--quick");
    std::cerr << "shardscope calibrate --measure: " << nproc << " rank" << (nproc > 1 ? "s" : "")
              << " on " << (device == "cuda" ? "cuda:0.." : "this CPU") << ", " << threads
              << " thread" << (threads > 1 ? "s" : "") << " each; logs in " << dir->string()
              << "\n";
    if (const int rc =
            launchLocalRanks(args, nproc, *dir, timeoutS, "shardscope calibrate --measure");
        rc != 0)
        return rc;
    const std::string file = (*dir / "rank0.json").string();
    std::ifstream inFile(file);
    const auto m = nlohmann::json::parse(inFile, nullptr, false);
    if (m.is_discarded() || !m.is_object() || !m.contains("samples") || !m["samples"].is_array()) {
        std::cerr << "error: " << file << ": the measurement is not readable JSON with samples\n";
        return kExitFailed;
    }
    KernelSamples samples;
    std::map<DType, double> bestFlops;
    double bestBytes = 0;
    for (const auto& j : m["samples"]) {
        KernelSample k;
        const std::string cls = j.value("class", "");
        k.cls = cls == "gemm"           ? KernelClass::Gemm
                : cls == "memory-bound" ? KernelClass::MemoryBound
                : cls == "collective"   ? KernelClass::Collective
                : cls == "attention"    ? KernelClass::Attention
                                        : KernelClass::Other;
        k.step = j.value("step", 0);
        k.durNs = j.value("dur_ns", int64_t{0});
        k.flops = j.value("flops", 0.0);
        k.bytes = j.value("bytes", 0.0);
        k.groupSize = j.value("group_size", 0);
        k.collective = j.value("collective", "");
        k.op = k.kernel = j.value("op", "");
        if (auto d = parseDType(j.value("dtype", "float32")); d) k.dtype = *d;
        // A GEMM's [M, N, K] (shardscope-engine measure writes them): its shape's own
        // efficiency is fitted, as a trace's are (gemm_efficiency_by_shape). Without them a
        // CPU whose bf16 and fp32 GEMMs scale differently by size (AMX on a Xeon: small bf16
        // GEMMs at a tenth of its peak, fp32 at a third) had both priced by one curve.
        if (const auto sh = j.find("shape");
            k.cls == KernelClass::Gemm && sh != j.end() && sh->is_array() && sh->size() == 3 &&
            std::all_of(sh->begin(), sh->end(), [](const nlohmann::json& x) {
                return x.is_number_integer() && x.get<int64_t>() > 0;
            })) {
            k.m = (*sh)[0].get<int64_t>();
            k.n = (*sh)[1].get<int64_t>();
            k.k = (*sh)[2].get<int64_t>();
        }
        if (k.durNs <= 0) continue;
        const double secs = static_cast<double>(k.durNs) * 1e-9;
        if (k.cls == KernelClass::Gemm)
            bestFlops[k.dtype] = std::max(bestFlops[k.dtype], k.flops / secs);
        if (k.cls == KernelClass::MemoryBound) bestBytes = std::max(bestBytes, k.bytes / secs);
        samples.samples.push_back(std::move(k));
    }
    const auto& dj = m.value("device", nlohmann::json::object());
    const std::string deviceName = dj.value("name", std::string("this machine"));
    const std::string when =
        "measured by `shardscope calibrate --measure` (" + std::to_string(nproc) + " local ranks)";
    ClusterSpec base;
    if (given) {
        base = *given;
        if (!sameDevice(deviceName, base.device.name))
            std::cerr << "warning: measured " << deviceName << ", and " << a.get("--cluster")
                      << " describes " << base.device.name << "\n";
    } else {
        if (bestFlops.empty() || bestBytes <= 0) {
            std::cerr << "error: " << file
                      << ": no GEMM or copy was measured; nothing to make a cluster from\n";
            return kExitFailed;
        }
        base.name = "this machine: " + deviceName + " x " + std::to_string(nproc);
        base.nodes = 1;
        base.device.name = deviceName;
        base.device.kind = dj.value("kind", std::string("cpu")) == "gpu" ? "gpu" : "cpu";
        base.device.memoryBytes = dj.value("memory_bytes", int64_t{0});
        base.device.peakFlops = bestFlops;
        base.device.hbmBandwidth = bestBytes;
        base.node.devicesPerNode = nproc;
        // Placeholders the collective fit replaces (one node: the network is not used).
        base.node.intraBandwidth = bestBytes;
        base.network.nicBandwidth = bestBytes;
        base.host.linkBandwidth = bestBytes;
        for (const char* f : {"/device/peak_flops", "/device/hbm_bandwidth_bytes_per_s",
                              "/device/memory_bytes", "/node/devices_per_node"})
            base.sources[f] =
                when + (std::string(f) == "/device/peak_flops" ? ": the best GEMM rate per dtype"
                        : std::string(f) == "/device/hbm_bandwidth_bytes_per_s"
                            ? ": the best copy or add rate"
                            : "");
        base.sources["/network/nic_bandwidth_bytes_per_s"] =
            "not measured (one node): the memory bandwidth as a placeholder";
        base.sources["/host/link_bandwidth_bytes_per_s"] =
            "not measured: the memory bandwidth as a placeholder";
    }
    std::cerr << "measured " << samples.samples.size() << " points on " << deviceName
              << "; launching one tiny op costs " << static_cast<int64_t>(m.value("launch_ns", 0.0))
              << " ns\n";
    KernelFitInputs in;
    in.inputs = {file};
    in.source = when + " on " + deviceName;
    in.baseLabel = given ? a.get("--cluster") : "the measured peaks";
    in.clusterName = given ? given->name + ", calibrated on this machine" : base.name;
    in.headline = "Measured " + deviceName + " (" + std::to_string(nproc) + " rank" +
                  (nproc > 1 ? "s" : "") + ", " + std::to_string(threads) + " thread" +
                  (threads > 1 ? "s" : "") + " each)";
    const int rc = finishKernelCalibration(a, samples, base, in);
    if (rc == kExitOk) {
        std::error_code ec;
        std::filesystem::remove_all(*dir, ec);
    }
    return rc;
}

// The program op each trace op is (joinOpIds: by id, or for a trace of an earlier version
// of the program, one with ops this one lacks, by unit, phase, kind and order); -1 where
// there is none. Whether the ids had to be joined by key.
std::vector<int32_t> programIdsOf(const std::vector<TraceOp>& ops, const StepProgram& p,
                                  const ResolvedPlan& r, bool& byKey) {
    std::map<int64_t, OpKey> traceKeys, programKeys;
    for (const TraceOp& op : ops)
        if (op.opId >= 0)
            traceKeys.emplace(op.opId,
                              OpKey{op.unit, op.phase, op.kind ? opKindName(*op.kind) : ""});
    for (size_t i = 0; i < p.ops.size(); ++i) {
        const Op& op = p.ops[i];
        programKeys[static_cast<int64_t>(i)] =
            OpKey{r.units[op.unit.index()].name, phaseName(op.phase), opKindName(op.kind)};
    }
    const OpJoin join = joinOpIds(traceKeys, programKeys);
    byKey = join.byKey;
    std::vector<int32_t> ids;
    ids.reserve(ops.size());
    for (const TraceOp& op : ops) {
        auto it = join.toOf.find(op.opId);
        ids.push_back(it == join.toOf.end() ? -1 : static_cast<int32_t>(it->second));
    }
    return ids;
}

int runCalibrate(const Args& a) {
    const int modes = a.has("--trace") + a.has("--from-trace") + a.flag("--measure");
    if (modes != 1) {
        std::cerr << "error: give one of --trace (a measured run, fitted op by op), --from-trace "
                     "(kernels of any profiler trace) or --measure (microbenchmarks of this "
                     "machine), not "
                  << (modes ? "several" : "none") << " (see: shardscope calibrate --help)\n";
        return kExitUsage;
    }
    if (a.flag("--measure")) return runCalibrateMeasure(a);
    if (!a.has("--cluster")) {
        std::cerr << "error: --cluster FILE is required with --trace and --from-trace (the "
                     "cluster to start from)\n";
        return kExitUsage;
    }
    if (a.has("--from-trace")) return runCalibrateFromTrace(a);
    if (!a.positionals().empty()) {
        std::cerr << "error: more trace files (" << a.positionals().front()
                  << ") go with --from-trace; --trace takes one file or folder\n";
        return kExitUsage;
    }
    const std::string tracePath = a.get("--trace");
    auto pytorch = namesPyTorchTraces({tracePath});
    if (failed(pytorch)) return kExitUsage;
    std::vector<MeasuredOp> ops;
    std::optional<PyTorchRun> torchRun;
    std::optional<TraceFile> measured;
    std::optional<ModelGraph> model;
    std::optional<Plan> plan;
    std::optional<ClusterSpec> cluster;
    std::optional<ResolvedPlan> resolved;
    std::string planPath;
    if (*pytorch) {
        // A user's own PyTorch FSDP job: its traces joined to the program of the plan that
        // ran (given, or recovered from the traces).
        auto run = loadPyTorchRun(a, {tracePath});
        if (failed(run)) return kExitUsage;
        torchRun = std::move(*run);
        measured = torchRun->join->file;
        cluster = *torchRun->cluster;
        resolved = *torchRun->resolved;
        planPath = torchRun->planSource;
        if (!a.flag("--json"))
            std::cout << "joined " << torchRun->join->joined << " FSDP ops of "
                      << torchRun->traces.size() << " PyTorch rank trace"
                      << (torchRun->traces.size() > 1 ? "s" : "") << " to the program of the plan "
                      << planPath << "\n";
    } else {
        auto m = readTraceFile(tracePath);
        if (failed(m)) return kExitUsage;
        measured = std::move(*m);
        const auto& run = measured->run;
        auto fromRun = [&](const char* key) -> std::string {
            return run.is_object() && run.contains(key) && run[key].is_string()
                       ? run[key].get<std::string>()
                       : std::string();
        };
        const std::string modelPath = a.has("--model") ? a.get("--model") : fromRun("model");
        planPath = a.has("--plan") ? a.get("--plan") : fromRun("plan_file");
        if (modelPath.empty() || planPath.empty()) {
            std::cerr << "error: " << tracePath
                      << ":/metadata/run: no model and plan recorded (not written by `shardscope "
                         "run --trace`?); give --model and --plan\n";
            return kExitUsage;
        }
        HfLoadOptions ho;
        if (auto d = parseDType(fromRun("param_dtype")); d) ho.paramDtype = *d;
        if (auto d = parseDType(fromRun("activation_dtype")); d) ho.activationDtype = *d;
        auto g = loadModelFile(modelPath, ho);
        if (failed(g)) return kExitUsage;
        model = std::move(*g);
        auto p = loadPlanFile(planPath);
        if (failed(p)) return kExitUsage;
        plan = std::move(*p);
        auto c = loadClusterNamed(a.get("--cluster"));
        if (failed(c)) return kExitUsage;
        cluster = std::move(*c);
        if (run.is_object()) {
            plan->microBatchSize = run.value("micro_batch_size", plan->microBatchSize);
            plan->seqLen = run.value("seq_len", plan->seqLen);
            plan->seqLenDefaulted = false;
            plan->microBatches = run.value("micro_batches", plan->microBatches);
            if (plan->meshShape.empty()) plan->meshShape = {run.value("world_size", int64_t{2})};
        }
        resolved = resolvePlan(*model, *plan, &*cluster, planPath);
        if (reportPlanErrors(*resolved)) return kExitFailed;
    }
    const ResolvedPlan& r = *resolved;
    StepOptions so = stepOptionsFor(*plan, *cluster);
    so.recomputeEarlyStop = false;  // a ShardScope trace: the engine recomputes all of forward
    const StepProgram prog = torchRun ? *torchRun->program : buildStepProgram(r, so);
    bool byKey = false;
    const std::vector<int32_t> ids = programIdsOf(measured->ops, prog, r, byKey);
    if (byKey)
        std::cerr << "note: " << tracePath
                  << ": its op ids name other ops than this program's (recorded by an earlier "
                     "version of it?): joined by unit, phase, kind and order\n";
    for (size_t i = 0; i < measured->ops.size(); ++i) {
        const TraceOp& op = measured->ops[i];
        ops.push_back({ids[i], op.rank, op.step, op.startNs, op.endNs});
    }
    auto fit = calibrate(prog, *cluster, ops, tracePath);
    if (failed(fit)) return kExitFailed;
    fit->cluster.sources.erase("/sim");  // the estimates it described are replaced
    fit->cluster.name = cluster->name + ", calibrated on " +
                        std::filesystem::path(a.get("--trace")).filename().string();
    // What is written must load again (every fitted value within the format's ranges).
    if (auto check = clusterFromJson(clusterToJson(fit->cluster), a.get("--output")); !check) {
        std::cerr << "error: the calibrated cluster does not validate: " << check.error() << "\n";
        return kExitFailed;
    }
    const SimResult before = simulate(prog, *cluster, r.worldSize);
    const SimResult after = simulate(prog, fit->cluster, r.worldSize);
    if (Status st =
            writeFileAtomically(a.get("--output"), clusterToJson(fit->cluster).dump(2) + "\n");
        !st) {
        std::cerr << "error: " << st.error() << "\n";
        return kExitUsage;
    }
    const double ms0 = measured->stepNs;
    const double pk = measured->peakAllocated;
    auto err = [](double pred, double meas) { return meas > 0 ? (pred - meas) / meas : 0.0; };
    nlohmann::json out{
        {"trace", a.get("--trace")},
        {"cluster", a.get("--cluster")},
        {"output", a.get("--output")},
        {"measured_step_time_ns", ms0},
        {"measured_peak_allocated_bytes", static_cast<int64_t>(measured->peakAllocated)},
        {"before",
         {{"step_time_ns", before.stepNs},
          {"step_time_error", err(static_cast<double>(before.stepNs), ms0)},
          {"peak_allocated_bytes", before.peakAllocated},
          {"peak_allocated_error", err(static_cast<double>(before.peakAllocated), pk)}}},
        {"after",
         {{"step_time_ns", after.stepNs},
          {"step_time_error", err(static_cast<double>(after.stepNs), ms0)},
          {"peak_allocated_bytes", after.peakAllocated},
          {"peak_allocated_error", err(static_cast<double>(after.peakAllocated), pk)}}},
        {"fitted",
         {{"compute_efficiency", fit->cluster.sim.computeEfficiency},
          {"memory_efficiency", fit->cluster.sim.memoryEfficiency},
          {"overlap_slowdown", fit->cluster.sim.overlapSlowdown},
          {"cpu_issue_ns", fit->cluster.sim.cpuIssueNs},
          {"collective_latency_ns", fit->latencyNs},
          {"collective_bus_bandwidth_bytes_per_s", fit->busBandwidth},
          {"compute_ops", fit->computeOps},
          {"memory_ops", fit->memoryOps},
          {"collective_ops", fit->collectiveOps}}},
        {"notes", fit->notes}};
    if (a.flag("--json")) return emitJson(out, "").ok() ? kExitOk : kExitUsage;
    std::cout << "Calibrated " << a.get("--cluster") << " from " << a.get("--trace") << " ("
              << measured->ops.size() << " measured ops)\n\n"
              << "  compute efficiency  ";
    printCurve(fit->cluster.sim.computeEfficiency, "FLOP");
    char line[256];
    std::snprintf(line, sizeof line,
                  "\n  memory efficiency   %.3f\n  overlap slowdown    %.2f\n  CPU issue per op    "
                  "%.1f us\n  collectives         %.1f us + bytes / %.2f GB/s (bus)\n",
                  fit->cluster.sim.memoryEfficiency, fit->cluster.sim.overlapSlowdown,
                  fit->cluster.sim.cpuIssueNs * 1e-3, fit->latencyNs * 1e-3,
                  fit->busBandwidth * 1e-9);
    std::cout << line;
    for (const auto& n : fit->notes)
        std::cout << "  note: " << n << "\n";
    std::cout << "\n";
    Table t({"", "MEASURED", "BEFORE", "ERROR", "AFTER", "ERROR"},
            {false, true, true, true, true, true});
    t.row({"step time", formatMs(ms0), formatMs(static_cast<double>(before.stepNs)),
           formatError(ms0, static_cast<double>(before.stepNs)),
           formatMs(static_cast<double>(after.stepNs)),
           formatError(ms0, static_cast<double>(after.stepNs))});
    t.row({"peak allocated", formatMiB(pk), formatMiB(static_cast<double>(before.peakAllocated)),
           formatError(pk, static_cast<double>(before.peakAllocated)),
           formatMiB(static_cast<double>(after.peakAllocated)),
           formatError(pk, static_cast<double>(after.peakAllocated))});
    t.print(std::cout);
    std::cout << "\nWrote " << a.get("--output") << "\n";
    return kExitOk;
}

}  // namespace

std::vector<Command> calibrateCommands() {
    CommandSpec s;
    s.name = "calibrate";
    s.summary =
        "Fit a cluster's simulator parameters to a measured run; print the error before and after.";
    s.description =
        "Reads a `shardscope run --trace` file, rebuilds the run's step program (model, plan and\n"
        "micro-batch come from the trace's metadata unless --model/--plan are given), joins\n"
        "the measured ops to it by op id, and fits: compute efficiency by FLOPs per kernel\n"
        "(from compute ops no collective overlapped), memory efficiency (copies and the\n"
        "optimizer), the slowdown of overlapped compute, collective latency and bus bandwidth\n"
        "(least squares), and the CPU's cost to issue an op. Writes the cluster with the\n"
        "fitted values (each named in \"sources\") and prints the simulated step time and\n"
        "peak allocated memory against the measured ones, before and after.\n\n"
        "PyTorch profiler traces of a user's FSDP2 job work the same way: the plan that ran\n"
        "(--plan, or recovered from the traces as `plan recover` does) gives the program, and\n"
        "the traces' collectives, copies, per-unit compute and optimizer step join its ops by\n"
        "unit, phase, kind, micro-batch and order (`trace diff` shows that join).\n\n"
        "--from-trace fits to the kernels of any real profiler trace instead (a GPU job's, or a\n"
        "CPU-only one's whose host ops are the kernels; no model or plan needed): GEMM kernels\n"
        "take their FLOPs from the launching matmul op's shapes (record_shapes=True), memory-\n"
        "bound kernels their bytes from the launching op's inputs, NCCL kernels their size and\n"
        "group from their args. It fits the compute-efficiency curve, the memory efficiency and\n"
        "the collectives' latency and bus bandwidth on half of the ProfilerSteps, and prints\n"
        "each class's error on the other half, with the starting cluster and the fitted one.\n"
        "What it cannot price (no shapes, convolutions, broadcasts) is counted and named.\n"
        "It also reads the host's side: each thread's time per kernel launch (the model's for\n"
        "the forward, autograd's for the backward), and FSDP2's reduce-scatter copy-in's block\n"
        "table (torch._chunk_cat). Those are the profiled run's pace; with the model, the plan\n"
        "and the run's step time without the profiler (--step-ms, from its training log) it\n"
        "fits the profiler's share and takes it out, and a cluster carrying that share\n"
        "(profiler_ns_per_event) has it taken out of every later calibration.\n\n"
        "--measure runs short microbenchmarks on this machine's devices instead (shardscope-\n"
        "engine measure on --nproc local ranks: GEMMs by size and dtype, copies and adds by\n"
        "bytes, causal attention, the cost of one tiny op, and all-gather, reduce-scatter and\n"
        "all-reduce by size over the ranks) and fits them the same way. Without --cluster the\n"
        "cluster is made from the measurement: the best GEMM rate per dtype is the peak, the\n"
        "best copy rate the memory bandwidth, the local ranks one node.";
    s.options = {
        {"--trace", "FILE|DIR",
         "measured trace from `shardscope run --trace`, or PyTorch profiler traces of an FSDP2 "
         "job (a file per rank or their folder; with --model)",
         "", false, "-t"},
        {"--from-trace", "FILE|DIR",
         "fit to the kernels of real profiler traces instead (GPU or CPU, any job; more traces "
         "may follow as arguments): GEMMs, memory-bound kernels and collectives, with the "
         "error on held-back steps"},
        {"--step-ms", "MS",
         "--from-trace with --model and --plan: the same run's step time without the profiler "
         "(from its training log); fits profiler_ns_per_event, the host time the profiler added "
         "per event it recorded, so that the simulated step equals it"},
        {"--samples", "CSV",
         "--from-trace: also write every priced kernel (class, op, FLOPs or bytes, measured, "
         "predicted before and after) as CSV"},
        {"--measure", "",
         "fit to microbenchmarks of this machine instead: GEMMs by size and dtype, copies, "
         "attention, launch cost, and collectives over --nproc local ranks (Gloo on CPU, NCCL "
         "with --device cuda); without --cluster the cluster is made from what was measured"},
        {"--device", "cpu|cuda", "--measure: what to measure", "cpu"},
        {"--nproc", "N", "--measure: local ranks for the collective sweep [2 on CPU, 1 on CUDA]"},
        {"--threads", "N", "--measure: threads per rank [cores / ranks]"},
        {"--reps", "N", "--measure: times each point is measured, as that many steps", "4"},
        {"--quick", "", "--measure: fewer, smaller points (a few seconds on a CPU)"},
        {"--timeout-s", "S", "--measure: how long a rank waits for the others", "300"},
        {"--cluster", "FILE", "cluster JSON to start from (required with --trace and --from-trace)",
         "", false, "-c"},
        {"--output", "FILE", "where to write the calibrated cluster JSON", "", true, "-o"},
        {"--model", "FILE",
         "model (default: the one the trace records; required for PyTorch traces; with "
         "--from-trace and --plan: sizes the optimizer's foreach kernels)",
         "", false, "-m"},
        {"--param-dtype", "DTYPE", "PyTorch traces: parameter dtype for Hugging Face configs",
         "float32"},
        {"--activation-dtype", "DTYPE", "PyTorch traces: activation dtype for Hugging Face configs",
         "float32"},
        {"--plan", "FILE",
         "plan (default: the one the trace records, or recovered from PyTorch traces; with "
         "--from-trace and --model: sizes the optimizer's foreach kernels)",
         "", false, "-p"},
        {"--json", "", "print a machine summary"}};
    s.examples = {
        "shardscope run -m samples/models/tiny-llama/config.json -p "
        "samples/plans/tiny-llama-2rank.json --trace measured.json",
        "shardscope calibrate -t measured.json -c samples/clusters/cpu-2core.json -o "
        "cpu-calibrated.json",
        "shardscope calibrate --from-trace rank0.pt.trace.json.gz -c "
        "samples/clusters/a100-80gb-8x8.json -o a100-fitted.json",
        "shardscope calibrate --from-trace rank0.pt.trace.json.gz -c "
        "samples/clusters/h200-8x8.json "
        "-m config.json -p plan.json --step-ms 83.8 -o h200-fitted.json",
        "shardscope calibrate --measure -o this-machine.json",
        "shardscope calibrate --measure --device cuda --nproc 8 -c "
        "samples/clusters/h100-sxm-8x8.json "
        "-o h100-measured.json"};
    s.positionalsMetavar = "[TRACE...]";
    return {{s, runCalibrate}};
}

}  // namespace shardscope::cli
