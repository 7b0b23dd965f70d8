// SPDX-License-Identifier: Apache-2.0
#include "engine/calibrate/kernel_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace shardscope {

namespace {
// A fitted median and the held-back steps' (cpu_launch_ns, kernel_gap_ns), as --json says it.
nlohmann::json splitMedianJson(const SplitMedian& m) {
    return {{"fitted", m.fitted},
            {"fitted_median_ns", m.fittedNs},
            {"held_back", m.heldBack},
            {"held_back_median_ns", m.heldBackNs}};
}

}  // namespace

// Bisects profiler_ns_per_event: the simulated step shrinks (never grows) as the launch rates
// do. Between 0 and the overhead that takes each rate down to a quarter of its profiled mean.
ProfilerFit fitProfilerOverhead(KernelFit& fit, double targetStepNs,
                                const std::function<double(const ClusterSpec&)>& simulatedStepNs) {
    ProfilerFit r;
    r.tried = true;
    const double target = targetStepNs;
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
        return simulatedStepNs(candidate);
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

std::string kernelSamplesCsv(const KernelSamples& samples, const KernelFit& fit,
                             const ClusterSpec& base) {
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
            << (fit.heldOut[i] ? 1 : 0) << "," << quoted(k.op) << "," << quoted(k.kernel) << ","
            << dtypeName(k.dtype) << "," << k.flops << "," << k.bytes << "," << k.groupSize << ","
            << k.collective << "," << k.durNs << "," << predictKernelNs(base, k) << ","
            << predictKernelNs(fit.cluster, k) << "," << k.m << "," << k.n << "," << k.k << "\n";
    }
    return csv.str();
}

nlohmann::json kernelFitJson(const KernelFit& fit, const KernelSamples& samples,
                             const ProfilerFit& pf, const KernelReportInputs& in) {
    nlohmann::json classes = nlohmann::json::array();
    for (const auto& r : fit.classes) {
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
        {"output", in.output},
        {"host_only", samples.hostOnly},
        {"record_shapes", samples.hasShapes},
        {"split", fit.split},
        {"classes", classes},
        {"skipped", skipped},
        {"fitted",
         {{"compute_efficiency", fit.cluster.sim.computeEfficiency},
          {"memory_efficiency", fit.cluster.sim.memoryEfficiency},
          {"memory_efficiency_by_bytes", fit.cluster.sim.memoryEfficiencyByBytes},
          {"memory_efficiency_by_op", fit.cluster.sim.memoryEfficiencyByOp},
          {"attention_efficiency", fit.cluster.sim.attentionEfficiency},
          {"masked_attention_efficiency", fit.cluster.sim.maskedAttentionEfficiency},
          {"cpu_launch_ns", fit.cluster.sim.cpuLaunchNs},
          {"launch_gaps", splitMedianJson(fit.launch)},
          {"cpu_launch_forward_ns", fit.cluster.sim.cpuLaunchForwardNs},
          {"forward_launch_gaps", splitMedianJson(fit.launchForward)},
          {"cpu_launch_backward_ns", fit.cluster.sim.cpuLaunchBackwardNs},
          {"backward_launch_gaps", splitMedianJson(fit.launchBackward)},
          {"profiler_events_per_kernel",
           {{"forward", fit.eventsPerLaunchForward}, {"backward", fit.eventsPerLaunchBackward}}},
          {"profiler_ns_per_event", fit.cluster.sim.profilerNsPerEvent},
          {"kernel_gap_ns", fit.cluster.sim.kernelGapNs},
          {"kernel_gaps", splitMedianJson(fit.kernelGap)},
          {"chunk_cat_host_ns_per_block", fit.cluster.sim.chunkCatHostNsPerBlock},
          {"chunk_cat_host",
           {{"fitted", fit.chunkCatHost.fitted},
            {"fitted_median_ns_per_block", fit.chunkCatHost.fittedNs},
            {"held_back", fit.chunkCatHost.heldBack},
            {"held_back_median_ns_per_block", fit.chunkCatHost.heldBackNs},
            {"held_back_measured_ns", fit.chunkCatHost.heldBackMeasuredNs},
            {"held_back_predicted_ns", fit.chunkCatHost.heldBackPredictedNs}}},
          {"host_wait",
           {{"ns_per_step", fit.hostWaitNs},
            {"step_span_ns", fit.stepSpanNs},
            {"steps", fit.hostWaitSteps}}},
          {"hbm_bandwidth_bytes_per_s", fit.cluster.device.hbmBandwidth},
          {"protocols", clusterToJson(fit.cluster)["sim"]["protocols"]},
          {"intra_bandwidth_bytes_per_s", fit.cluster.node.intraBandwidth},
          {"nic_bandwidth_bytes_per_s", fit.cluster.network.nicBandwidth}}},
        {"notes", fit.notes}};
    if (pf.tried)
        out["step_ms_fit"] = {{"step_ms", in.targetStepNs * 1e-6},
                              {"profiled_rates_step_ms", pf.profiledStepNs * 1e-6},
                              {"fitted_step_ms", pf.stepNs * 1e-6},
                              {"profiler_ns_per_event", pf.nsPerEvent}};
    return out;
}

}  // namespace shardscope
