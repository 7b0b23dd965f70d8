// SPDX-License-Identifier: Apache-2.0
#include "engine/calibrate/kernel_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "engine/calibrate/calibrate.h"
#include "engine/sim/cost_model.h"

namespace shardscope {

namespace {

std::optional<OpKind> collectiveOpKind(const std::string& kind) {
    if (kind == "allreduce") return OpKind::AllReduce;
    if (kind == "allgather") return OpKind::AllGather;
    if (kind == "reduce_scatter") return OpKind::ReduceScatter;
    return std::nullopt;
}

struct Placement {
    int32_t nodes = 1, perNode = 1;
};
Placement placement(const ClusterSpec& c, int32_t n) {
    const auto dpn = static_cast<int32_t>(std::max<int64_t>(1, c.node.devicesPerNode));
    Placement p;
    p.perNode = std::min(n, dpn);
    p.nodes = (n + p.perNode - 1) / p.perNode;
    return p;
}

std::string joinSteps(const std::vector<int32_t>& v) {
    std::ostringstream o;
    for (size_t i = 0; i < v.size(); ++i) {
        if (i == 6 && v.size() > 8) {
            o << ", ... (" << v.size() << " in all)";
            break;
        }
        o << (i ? ", " : "") << v[i];
    }
    return o.str();
}

// An operator's kernels run at very different rates by the ATen kernel template they use:
// a contiguous same-dtype pass vectorises, a dtype cast or strided view does not. The key
// of a memory-bound kernel's own curve names that template; "" when the name shows none
// (a CPU trace's kernels are their ops).
std::string kernelTemplate(const std::string& kernel) {
    static const std::pair<const char*, const char*> kTemplates[] = {
        {"vectorized_elementwise_kernel", "vectorized"},
        {"unrolled_elementwise_kernel", "unrolled"},
        {"elementwise_kernel", "strided"},
        {"reduce_kernel", "reduce"},
    };
    for (const auto& [needle, name] : kTemplates)
        if (kernel.find(needle) != std::string::npos) return name;
    return {};
}

std::string memoryCurveKey(const KernelSample& s) {
    const std::string t = kernelTemplate(s.kernel);
    return t.empty() || s.op.empty() ? s.op : s.op + " [" + t + "]";
}

// FSDP's own copies, which the step program prices as ops of their own: FSDP2's
// reduce-scatter copy-in (torch._chunk_cat), all-gather copy-in and copy-out.
bool fsdpCopyOp(const std::string& op) {
    return op == kChunkCatKey || op == "fsdp::all_gather_copy_in" ||
           op == "aten::split_with_sizes_copy" || op == "aten::_foreach_copy_";
}

}  // namespace

void setLaunchRatesWithout(const KernelFit& fit, double nsPerEvent, SimParams& sim) {
    if (fit.launchForward.fitted <= 0 || fit.launchBackward.fitted <= 0) return;
    sim.profilerNsPerEvent = std::max(nsPerEvent, 0.0);
    auto rate = [&](const SplitMedian& m, double events) {
        return std::round(
            std::max(m.fittedNs - sim.profilerNsPerEvent * events, 0.25 * m.fittedNs));
    };
    sim.cpuLaunchForwardNs = rate(fit.launchForward, fit.eventsPerLaunchForward);
    sim.cpuLaunchBackwardNs = rate(fit.launchBackward, fit.eventsPerLaunchBackward);
}

void applyProfilerOverhead(KernelFit& fit, double nsPerEvent, const std::string& why) {
    if (fit.launchForward.fitted <= 0 || fit.launchBackward.fitted <= 0) return;
    ClusterSpec& c = fit.cluster;
    setLaunchRatesWithout(fit, nsPerEvent, c.sim);
    const double perEvent = c.sim.profilerNsPerEvent;
    const std::string& from = fit.source;
    auto source = [&](const SplitMedian& m, double events, const char* where) {
        char b[160];
        std::snprintf(b, sizeof b, " (mean of %lld launch-to-launch gaps %s",
                      static_cast<long long>(m.fitted), where);
        std::string s = from + b;
        if (perEvent > 0) {
            std::snprintf(b, sizeof b,
                          ", less %.0f ns for each of its %.1f profiler events a kernel", perEvent,
                          events);
            s += b + std::string(": ") + why;
        }
        return s + ")";
    };
    c.sources["/sim/cpu_launch_forward_ns"] =
        source(fit.launchForward, fit.eventsPerLaunchForward,
               "on the thread that runs the ProfilerSteps, outside Optimizer.step");
    c.sources["/sim/cpu_launch_backward_ns"] =
        source(fit.launchBackward, fit.eventsPerLaunchBackward,
               "on the other launching threads: autograd's");
    if (perEvent > 0)
        c.sources["/sim/profiler_ns_per_event"] = why;
    else
        c.sources.erase("/sim/profiler_ns_per_event");
    static const std::string kProfiled =
        "cpu_launch_forward_ns and cpu_launch_backward_ns are the profiled run's pace";
    fit.notes.erase(std::remove_if(fit.notes.begin(), fit.notes.end(),
                                   [](const std::string& n) { return n.rfind(kProfiled, 0) == 0; }),
                    fit.notes.end());
    if (perEvent <= 0)
        fit.notes.push_back(kProfiled +
                            ": the profiler's events are in them; give the base cluster a "
                            "profiler_ns_per_event, or fit one with --step-ms and the run's step "
                            "time without the profiler");
}

double predictKernelNs(const ClusterSpec& c, const KernelSample& s) {
    switch (s.cls) {
        case KernelClass::Gemm:
            if (s.flops <= 0) return 0;
            return s.flops /
                   (c.device.peakFor(s.dtype) *
                    c.sim.gemmEfficiencyFor(s.flops, s.m, s.n, s.k, s.dtype)) *
                   1e9;
        case KernelClass::MemoryBound: {
            // The operator's curve for this kernel template, else the operator's, else
            // the curve by bytes.
            const std::string key = memoryCurveKey(s);
            const double eff = c.sim.memoryEfficiencyByOp.count(key)
                                   ? c.sim.memoryEfficiencyFor(s.bytes, key)
                                   : c.sim.memoryEfficiencyFor(s.bytes, s.op);
            const double bw = c.device.hbmBandwidth * eff;
            return bw > 0 ? s.bytes / bw * 1e9 : 0;
        }
        case KernelClass::Collective: {
            const auto kind = collectiveOpKind(s.collective);
            if (!kind || s.groupSize <= 1) return 0;
            const Placement p = placement(c, s.groupSize);
            return static_cast<double>(collectiveTime(c, *kind, static_cast<int64_t>(s.bytes),
                                                      s.groupSize, p.nodes, p.perNode)
                                           .ns);
        }
        case KernelClass::Attention:
            if (s.flops <= 0) return 0;
            return s.flops /
                   (c.device.peakFor(s.dtype) * (s.masked
                                                     ? c.sim.maskedAttentionEfficiencyFor(s.flops)
                                                     : c.sim.attentionEfficiencyFor(s.flops))) *
                   1e9;
        case KernelClass::Other:
            break;
    }
    return 0;
}

namespace {
// fitKernels, step by step: each method fits one part of the cluster from the fitted half
// of the samples and says where it came from.
class KernelFitter {
public:
    KernelFitter(const KernelSamples& samples, const ClusterSpec& baseCluster,
                 const std::string& source)
        : all(samples),
          base(baseCluster),
          sourceName(source),
          from("fitted by `shardscope calibrate --from-trace` from " + source),
          c(fit.cluster) {
        fit.cluster = base;
    }

    KernelFit run() {
        splitSamples();
        fit.source = from;
        fitGemms();
        fitAttention();
        fitLaunches();
        fitStepWaits();
        fitChunkCat();
        fitKernelGap();
        fitMemoryBound();
        fitCollectives();
        c.simDefaulted = false;
        fit.heldOut = held;
        heldBack();
        return std::move(fit);
    }

private:
    void splitSamples() {
        // 1. The split: alternate steps, or alternate occurrences of each kernel.
        for (const auto& s : all.samples)
            if (s.step >= 0) steps.push_back(s.step);
        std::sort(steps.begin(), steps.end());
        steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
        held.assign(all.samples.size(), 0);
        if (steps.size() >= 2) {
            for (size_t i = 0; i < steps.size(); ++i)
                (i % 2 ? heldSteps : fitSteps).push_back(steps[i]);
            for (size_t i = 0; i < all.samples.size(); ++i)
                held[i] =
                    std::binary_search(heldSteps.begin(), heldSteps.end(), all.samples[i].step);
            fit.split = "fitted on ProfilerSteps " + joinSteps(fitSteps) + "; held back " +
                        joinSteps(heldSteps);
        } else {
            using Key = std::tuple<int, std::string, double, double, int32_t>;
            std::map<Key, int64_t> seen;
            for (size_t i = 0; i < all.samples.size(); ++i) {
                const auto& s = all.samples[i];
                const Key k{static_cast<int>(s.cls), s.kernel, s.flops, s.bytes, s.groupSize};
                held[i] = (seen[k]++ % 2) == 1;
            }
            fit.split = steps.empty()
                            ? "no ProfilerStep in the trace: each kernel's 1st, 3rd, ... "
                              "occurrences fitted, the 2nd, 4th, ... held back"
                            : "one ProfilerStep: each kernel's 1st, 3rd, ... occurrences fitted, "
                              "the 2nd, 4th, ... held back";
        }
    }

    std::vector<const KernelSample*> fitSet(KernelClass cls) const {
        std::vector<const KernelSample*> v;
        for (size_t i = 0; i < all.samples.size(); ++i)
            if (!held[i] && all.samples[i].cls == cls) v.push_back(&all.samples[i]);
        return v;
    }
    // Achieved fraction of the dtype's peak of a GEMM or attention sample (the peak as it
    // stands: raised when GEMMs outran it).
    double fractionOfPeak(const KernelSample& s) const {
        return s.flops / (c.device.peakFor(s.dtype) * static_cast<double>(s.durNs) * 1e-9);
    }

    void fitGemms() {
        // 2. GEMMs: the efficiency curve, by half-decade of FLOPs per kernel.
        const auto gemms = fitSet(KernelClass::Gemm);
        if (!gemms.empty()) {
            std::vector<std::pair<double, double>> points;
            for (const auto* s : gemms)
                if (s->durNs > 0) points.push_back({s->flops, fractionOfPeak(*s)});
            auto curve = halfDecadeMedians(points, 1e-6);
            if (const double top = capCurveAtOne(curve); top > 1.0) {
                for (auto& [dt, peak] : c.device.peakFlops)
                    peak *= top;
                fit.notes.push_back(
                    "GEMMs ran above the cluster's listed peak (TF32 for float32 matmuls, or the "
                    "wrong device): peak_flops raised " +
                    std::to_string(top) + "x so efficiencies stay at most 1");
                c.sources["/device/peak_flops"] =
                    "raised by `shardscope calibrate --from-trace` from " + sourceName +
                    ": GEMMs exceeded it";
            }
            if (!curve.empty()) {
                c.sim.computeEfficiency = curve;
                c.sources["/sim/compute_efficiency"] =
                    from + " (" + std::to_string(gemms.size()) + " GEMM kernels)";
            }
            // 2a. Each GEMM shape's own efficiency (the median of its kernels): cuBLAS picks a
            //     kernel by shape and layout, so a linear layer's forward, input gradient and
            //     weight gradient, of equal FLOPs, run at different rates (V100 ResNet-50's fc:
            //     25, 25 and 19 us). Shapes of the base cluster that this trace lacks are kept.
            using ShapeKey = std::tuple<int, int64_t, int64_t, int64_t>;
            std::map<ShapeKey, std::vector<double>> byShape;
            for (const auto* s : gemms)
                if (s->durNs > 0 && s->m > 0 && s->n > 0 && s->k > 0)
                    byShape[{static_cast<int>(s->dtype), s->m, s->n, s->k}].push_back(
                        fractionOfPeak(*s));
            if (!byShape.empty()) {
                auto& table = c.sim.gemmEfficiencyByShape;
                for (auto& [key, fractions] : byShape) {
                    const auto& [dt, m, n, k] = key;
                    std::sort(fractions.begin(), fractions.end());
                    GemmShapeEfficiency e{m, n, k, static_cast<DType>(dt),
                                          std::clamp(fractions[fractions.size() / 2], 1e-6, 1.0)};
                    const auto same = std::find_if(table.begin(), table.end(), [&](const auto& x) {
                        return x.m == e.m && x.n == e.n && x.k == e.k && x.dtype == e.dtype;
                    });
                    if (same != table.end())
                        *same = e;
                    else
                        table.push_back(e);
                }
                std::sort(table.begin(), table.end(), [](const auto& a, const auto& b) {
                    return std::tuple(static_cast<int>(a.dtype), a.m, a.n, a.k) <
                           std::tuple(static_cast<int>(b.dtype), b.m, b.n, b.k);
                });
                c.sources["/sim/gemm_efficiency_by_shape"] =
                    from + " (" + std::to_string(byShape.size()) + " GEMM shapes)";
            }
        } else {
            fit.notes.push_back(
                "compute efficiency kept: no GEMM with FLOPs among the fitted kernels");
        }
    }

    void fitAttention() {
        // 2b. Attention: its own curve, by FLOPs per SDPA op (forward or backward), as
        //     torch.utils.flop_counter counts them (causal kernels do about half of that work,
        //     which the curve absorbs, as the simulator counts the same FLOPs).
        // Ops through a mask (a sliding window's) get a curve of their own: the kernel does all
        // s x s of the work.
        for (const bool masked : {false, true}) {
            std::vector<std::pair<double, double>> points;
            size_t n = 0;
            for (const auto* s : fitSet(KernelClass::Attention))
                if (s->flops > 0 && s->durNs > 0 && s->masked == masked) {
                    points.push_back({s->flops, fractionOfPeak(*s)});
                    ++n;
                }
            // Four points a decade: a layer's backward SDPA counts 2.5 times its forward's
            // FLOPs and runs at its own rate (Mistral-7B's masked calls on an H200: 0.47 of the
            // peak forward, 0.37 backward), which a half-decade would fold into one point.
            auto curve = binMedians(points, 1e-6, 4);
            // Up to twice the peak: a causal kernel does about half the counted FLOPs; above
            // that only with a wrong peak.
            for (auto& [f, e] : curve)
                e = std::min(e, 2.0);
            const std::string key = masked ? "masked_attention_efficiency" : "attention_efficiency";
            if (!curve.empty()) {
                (masked ? c.sim.maskedAttentionEfficiency : c.sim.attentionEfficiency) = curve;
                c.sources["/sim/" + key] = from + " (" + std::to_string(n) + " attention ops" +
                                           (masked ? " with a mask)" : ")");
            } else if (!masked) {
                fit.notes.push_back(
                    "attention efficiency kept: no attention op with record_shapes inputs among "
                    "the fitted kernels");
            }
        }
    }

    // Whether a figure of this step is held back, as the samples are (1.): by its step, or,
    // in a trace without steps, every other one (`k` counts them).
    bool isHeldBack(int32_t step, size_t& k) const {
        return steps.size() >= 2 ? std::binary_search(heldSteps.begin(), heldSteps.end(), step)
                                 : (k++ % 2) == 1;
    }
    // 2c. CPU per kernel launch (cpu_launch_ns) and 2d. the device's time between queued
    //     kernels (kernel_gap_ns): each the median on the fitted steps, checked against the
    //     held-back steps' median; 2c'. below, a thread's gaps by their mean.
    using L = KernelSamples::Launcher;
    SplitMedian splitGaps(const std::vector<KernelSamples::LaunchGap>& gaps, std::optional<L> who,
                          double (*statistic)(std::vector<double>)) const {
        SplitMedian m;
        std::vector<double> f, h;
        size_t k = 0;
        for (const auto& g : gaps)
            if (!who || g.by == *who)
                (isHeldBack(g.step, k) ? h : f).push_back(static_cast<double>(g.ns));
        if (f.empty()) return m;
        m.fittedNs = std::round(statistic(f));
        m.fitted = static_cast<int64_t>(f.size());
        if (!h.empty()) {
            m.heldBackNs = statistic(h);
            m.heldBack = static_cast<int64_t>(h.size());
        }
        return m;
    }
    static double mean(std::vector<double> v) {
        double sum = 0;
        for (double x : v)
            sum += x;
        return sum / static_cast<double>(v.size());
    }

    void fitLaunches() {
        fit.launch = splitGaps(all.launchGaps, std::nullopt, medianOf);
        // 2c'. The units' launches per thread: the mean gap of the model's thread (forward) and of
        //      autograd's (backward, recompute), outside the optimizer. Both or neither: a trace
        //      without ProfilerSteps cannot tell the model's thread from autograd's.
        {
            // The profiler's events per kernel on each thread, over the fitted steps.
            auto eventsPerLaunch = [&](L who) {
                double launches = 0, events = 0;
                for (const auto& x : all.launcherEvents)
                    if (x.by == who &&
                        (steps.size() < 2 ||
                         std::binary_search(fitSteps.begin(), fitSteps.end(), x.step))) {
                        launches += static_cast<double>(x.launches);
                        events += static_cast<double>(x.events);
                    }
                return launches > 0 ? events / launches : 0.0;
            };
            constexpr int64_t kMinGaps = 20;
            SplitMedian fw = splitGaps(all.launchGaps, L::Forward, mean),
                        bw = splitGaps(all.launchGaps, L::Backward, mean);
            if (fw.fitted >= kMinGaps && bw.fitted >= kMinGaps) {
                fit.launchForward = fw;
                fit.launchBackward = bw;
                fit.eventsPerLaunchForward = eventsPerLaunch(L::Forward);
                fit.eventsPerLaunchBackward = eventsPerLaunch(L::Backward);
                applyProfilerOverhead(fit, base.sim.profilerNsPerEvent,
                                      "the base cluster's profiler_ns_per_event");
            }
        }
        if (fit.launch.fitted > 0) {
            c.sim.cpuLaunchNs = fit.launch.fittedNs;
            c.sources["/sim/cpu_launch_ns"] = from + " (median of " +
                                              std::to_string(fit.launch.fitted) +
                                              " launch-to-launch gaps on the launching threads)";
            fit.notes.push_back(
                "cpu_launch_ns (the optimizer's launches, and any where no thread's rate is "
                "fitted) "
                "is the profiled run's pace: the profiler's own work (record_shapes, with_stack) "
                "is "
                "in it, so an unprofiled run launches faster");
        }
    }

    void fitStepWaits() {
        // 2e. The device waiting for the host, per step: reported, not fitted (the simulator's
        //     host pays each thread's launch rate per kernel and FSDP2's copy-in table, 2c' and
        //     2f).
        if (!all.stepDevice.empty()) {
            std::vector<double> spans, waits;
            for (const auto& d : all.stepDevice) {
                spans.push_back(static_cast<double>(d.spanNs));
                waits.push_back(static_cast<double>(d.hostWaitNs));
            }
            fit.stepSpanNs = medianOf(spans);
            fit.hostWaitNs = medianOf(waits);
            fit.hostWaitSteps = static_cast<int64_t>(waits.size());
            if (fit.stepSpanNs > 0 && fit.hostWaitNs >= 0.05 * fit.stepSpanNs)
                fit.notes.push_back(
                    "the device waited for the host " +
                    std::to_string(
                        static_cast<int>(std::lround(100 * fit.hostWaitNs / fit.stepSpanNs))) +
                    " % of a step (launches after it went idle): a host-bound step, and the "
                    "profiler slows the host, so compare with steps timed without it (--step-ms "
                    "takes the profiler's share out of the launch rates)");
        }
    }

    // 2f. FSDP2's reduce-scatter copy-in on the host: torch._chunk_cat's block table, by the
    //     blocks of one chunk. Copy-ins of fewer than 65,536 blocks (128 MiB a chunk) are
    //     left out: there the op's fixed costs (dispatch, the pinned buffer, the allocation)
    //     would weigh on a per-block figure.
    void fitChunkCat() {
        constexpr int64_t kMinBlocks = 65536;
        std::vector<double> f, h;
        auto& cc = fit.chunkCatHost;
        std::vector<const KernelSamples::ChunkCatHost*> held;
        size_t k = 0;
        for (const auto& x : all.chunkCatHost) {
            if (x.blocks < kMinBlocks) continue;
            const double perBlock = static_cast<double>(x.ns) / static_cast<double>(x.blocks);
            if (isHeldBack(x.step, k)) {
                h.push_back(perBlock);
                held.push_back(&x);
            } else {
                f.push_back(perBlock);
            }
        }
        if (!f.empty()) {
            // The lower quartile, not the median: the host builds the same table slower while
            // the device lags behind it (an H200 Llama-8B layer over one GPU: 1.9-7.2 ms where
            // the device was behind, 1.3-1.6 ms where it waited for the host), and the figure
            // matters only where the host is behind.
            std::sort(f.begin(), f.end());
            cc.fittedNs = f[(f.size() - 1) / 4];
            cc.fitted = static_cast<int64_t>(f.size());
            c.sim.chunkCatHostNsPerBlock = cc.fittedNs;
            c.sources["/sim/chunk_cat_host_ns_per_block"] =
                from + " (lower quartile of " + std::to_string(cc.fitted) +
                " reduce-scatter copy-ins, aten::_chunk_cat: host time to its kernel's launch "
                "over the blocks of one chunk)";
            if (!h.empty()) {
                cc.heldBackNs = medianOf(h);
                cc.heldBack = static_cast<int64_t>(h.size());
                for (const auto* x : held) {
                    cc.heldBackMeasuredNs += static_cast<double>(x->ns);
                    cc.heldBackPredictedNs += cc.fittedNs * static_cast<double>(x->blocks);
                }
            }
        } else if (!all.chunkCatHost.empty()) {
            fit.notes.push_back(
                "chunk_cat_host_ns_per_block kept: no reduce-scatter copy-in of 128 MiB a chunk "
                "or more to time (over many ranks its host work is small)");
        }
    }

    void fitKernelGap() {
        fit.kernelGap = splitGaps(all.deviceGaps, std::nullopt, medianOf);
        if (fit.kernelGap.fitted > 0) {
            c.sim.kernelGapNs = fit.kernelGap.fittedNs;
            c.sources["/sim/kernel_gap_ns"] =
                from + " (median of " + std::to_string(fit.kernelGap.fitted) +
                " gaps between a kernel and the next, already queued, on its stream)";
        }
    }

    void fitMemoryBound() {
        // 3. Memory-bound kernels: the achieved fraction of memory bandwidth by bytes per kernel
        //    (median per half-decade: small kernels pay their launch, mid-sized ones may run
        //    from cache), and one efficiency for aggregated bytes (their sums), which a unit's
        //    elementwise work and the optimizer use.
        const auto mem = fitSet(KernelClass::MemoryBound);
        const double hbm = c.device.hbmBandwidth;
        if (!mem.empty() && hbm > 0) {
            std::vector<std::pair<double, double>> points;
            double bytes = 0, seconds = 0;
            for (const auto* s : mem)
                // The optimizer's foreach kernels get a curve of their own (below), which prices
                // them; their equal shares of an op's bytes stay out of this one. So does FSDP2's
                // reduce-scatter copy-in (torch._chunk_cat, priced by its own curve: 0.39-0.41 of
                // the bandwidth on an H200, where copies of its size ran 0.85-0.88): at Llama-70B
                // widths its kernels were the only ones of 4-6 GB and set the curve's top, at
                // which the step program prices a unit's copy-in and copy-out. So do kernels
                // with a broadcast input, slower than dense ones of their size: the curve by
                // bytes is the dense streaming kernel's (their operators' curves price them).
                if (s->durNs > 0 && s->op != kForeachOptimizerKey && s->op != kChunkCatKey &&
                    !s->broadcast) {
                    points.push_back(
                        {s->bytes, s->bytes / (hbm * static_cast<double>(s->durNs) * 1e-9)});
                    bytes += s->bytes;
                    seconds += static_cast<double>(s->durNs) * 1e-9;
                }
            auto curve = halfDecadeMedians(points, 1e-6);
            double scalar = seconds > 0 ? bytes / (hbm * seconds) : 0;
            if (const double top = capCurveAtOne(curve, scalar); top > 1.0) {
                scalar /= top;
                c.device.hbmBandwidth *= top;
                fit.notes.push_back(
                    "memory-bound kernels ran faster than the listed memory bandwidth (from "
                    "cache): "
                    "hbm bandwidth raised " +
                    std::to_string(top) + "x so efficiencies stay at most 1");
                c.sources["/device/hbm_bandwidth_bytes_per_s"] =
                    "raised by `shardscope calibrate --from-trace` from " + sourceName +
                    ": kernels exceeded it";
            }
            if (!curve.empty() && scalar > 0) {
                c.sim.memoryEfficiencyByBytes = curve;
                c.sim.memoryEfficiency = std::clamp(scalar, 1e-6, 1.0);
                const std::string what =
                    from + " (" + std::to_string(mem.size()) + " memory-bound kernels)";
                c.sources["/sim/memory_efficiency"] = what;
                c.sources["/sim/memory_efficiency_by_bytes"] = what;
                // 3b. Per operator: kernels of one size run at very different speeds by what
                //     they do; an operator with kMinOpKernels fitted kernels gets its own curve
                //     (at the bandwidth as raised above), the others keep the curve by bytes.
                constexpr size_t kMinOpKernels = 4;
                std::map<std::string, std::vector<std::pair<double, double>>> byOp;
                for (const auto* s : mem)
                    if (s->durNs > 0 && !s->op.empty()) {
                        const std::pair<double, double> pt{
                            s->bytes, s->bytes / (c.device.hbmBandwidth *
                                                  static_cast<double>(s->durNs) * 1e-9)};
                        byOp[s->op].push_back(pt);
                        if (const std::string key = memoryCurveKey(*s); key != s->op)
                            byOp[key].push_back(pt);
                    }
                c.sim.memoryEfficiencyByOp.clear();
                size_t kernels = 0;
                for (auto& [op, pts] : byOp) {
                    if (pts.size() < kMinOpKernels) continue;
                    auto opCurve = halfDecadeMedians(pts, 1e-6);
                    for (auto& [b, e] : opCurve)
                        e = std::min(e, 1.0);
                    if (opCurve.empty()) continue;
                    kernels += pts.size();
                    c.sim.memoryEfficiencyByOp[op] = std::move(opCurve);
                }
                // 3c. The modules' kernels, broadcast ones included: what the step program's
                //     compute ops take for their memory-bound work (kModuleKernelsKey), whose
                //     kernels it does not name by operator. The optimizer's and FSDP's copies
                //     have curves of their own.
                //     Each half-decade's point is its kernels' bytes over their time (not the
                //     median kernel's rate): the step program spreads a module's bytes evenly
                //     over its kernels, so its price has to be the bytes' rate.
                std::vector<std::pair<double, double>> modulePts;
                for (const auto* s : mem)
                    if (s->durNs > 0 && s->op != kForeachOptimizerKey && !fsdpCopyOp(s->op))
                        modulePts.push_back({s->bytes, static_cast<double>(s->durNs) * 1e-9});
                if (modulePts.size() >= kMinOpKernels) {
                    auto moduleCurve = halfDecadeRates(modulePts, c.device.hbmBandwidth, 1e-6);
                    for (auto& [b, e] : moduleCurve)
                        e = std::min(e, 1.0);
                    if (!moduleCurve.empty()) {
                        c.sim.memoryEfficiencyByOp[kModuleKernelsKey] = std::move(moduleCurve);
                        c.sources[std::string("/sim/memory_efficiency_by_op/") +
                                  kModuleKernelsKey] =
                            from + " (" + std::to_string(modulePts.size()) +
                            " memory-bound kernels, broadcast ones included, without the "
                            "optimizer's and FSDP's copies)";
                    }
                }
                if (!c.sim.memoryEfficiencyByOp.empty())
                    c.sources["/sim/memory_efficiency_by_op"] =
                        from + " (" + std::to_string(c.sim.memoryEfficiencyByOp.size()) +
                        " operators with at least " + std::to_string(kMinOpKernels) +
                        " kernels each, " + std::to_string(kernels) + " kernels)";
            }
        } else {
            fit.notes.push_back(mem.empty() ? "memory efficiency kept: no memory-bound kernel with "
                                              "its bytes among the fitted kernels"
                                            : "memory efficiency kept: the cluster lists no memory "
                                              "bandwidth");
        }
    }

    void fitCollectives() {
        // 4. Collectives: within a node and across nodes.
        std::vector<CollectivePoint> intra, inter;
        int64_t unpriced = 0;
        for (const auto* s : fitSet(KernelClass::Collective)) {
            const auto kind = collectiveOpKind(s->collective);
            if (!kind) {
                ++unpriced;
                continue;
            }
            const double n = s->groupSize;
            const double k = *kind == OpKind::AllReduce ? 2.0 : 1.0;
            const CollectivePoint pt{k, k * (n - 1) / n * s->bytes, static_cast<double>(s->durNs)};
            (placement(base, s->groupSize).nodes > 1 ? inter : intra).push_back(pt);
        }
        if (unpriced > 0)
            fit.notes.push_back(std::to_string(unpriced) +
                                " collectives other than all-reduce, all-gather and reduce-scatter "
                                "(broadcast, all-to-all, send/recv) are not in the cost model: "
                                "left out of the fit");
        const double keepLat = c.sim.protocols.empty() ? 0 : c.sim.protocols.front().baseNs;
        std::optional<CollectiveLine> intraLine, interLine;
        if (!intra.empty()) intraLine = fitCollectiveLine(intra, keepLat);
        if (!inter.empty()) interLine = fitCollectiveLine(inter, keepLat);
        if (intraLine && intraLine->fitted) {
            if (!intraLine->note.empty()) fit.notes.push_back("within a node: " + intraLine->note);
            c.node.intraBandwidth = intraLine->busBandwidth / std::max(1e-9, c.sim.intraEfficiency);
            c.node.intraLatencyNs = static_cast<int64_t>(std::llround(intraLine->latencyNs));
            c.sources["/node/intra_bandwidth_bytes_per_s"] =
                from + " (" + std::to_string(intra.size()) + " collectives within a node)";
        }
        if (interLine && interLine->fitted) {
            if (!interLine->note.empty()) fit.notes.push_back("across nodes: " + interLine->note);
            const auto dpn = static_cast<double>(std::max<int64_t>(1, c.node.devicesPerNode));
            c.network.nicBandwidth =
                interLine->busBandwidth / (dpn * std::max(1e-9, c.sim.networkEfficiency));
            c.sources["/network/nic_bandwidth_bytes_per_s"] =
                from + " (" + std::to_string(inter.size()) + " collectives across nodes)";
        }
        const CollectiveLine* latency = intraLine && intraLine->fitted   ? &*intraLine
                                        : interLine && interLine->fitted ? &*interLine
                                                                         : nullptr;
        if (latency) {
            c.sim.protocols = {{"calibrated", latency->latencyNs, 0, 0, 1.0}};
            c.sources["/sim/protocols"] = from;
            if (intraLine && interLine && intraLine->fitted && interLine->fitted)
                fit.notes.push_back("one latency for all collectives: the within-node fit's");
        } else if (intra.empty() && inter.empty()) {
            fit.notes.push_back(
                "collective model kept: no sized all-reduce, all-gather or "
                "reduce-scatter among the fitted kernels");
        }
    }

    void heldBack() {
        // 5. Held-back kernels, before and after. Attention is priced when its ops had shapes
        //    (SDPA with record_shapes); other attention kernels (a serving engine's own) are
        //    measured only.
        const bool attentionPriced = std::any_of(
            all.samples.begin(), all.samples.end(),
            [](const KernelSample& s) { return s.cls == KernelClass::Attention && s.flops > 0; });
        for (KernelClass cls :
             {KernelClass::Gemm, KernelClass::MemoryBound, KernelClass::Collective,
              KernelClass::Attention, KernelClass::Other}) {
            KernelClassFit r;
            r.cls = cls;
            r.priced = cls == KernelClass::Gemm || cls == KernelClass::MemoryBound ||
                       (cls == KernelClass::Attention && attentionPriced) ||
                       cls == KernelClass::Collective;
            std::vector<double> before, after;
            for (size_t i = 0; i < all.samples.size(); ++i) {
                const auto& s = all.samples[i];
                if (s.cls != cls) continue;
                // Broadcasts, all-to-alls: noted above, in no total.
                if (cls == KernelClass::Collective && !collectiveOpKind(s.collective)) continue;
                // Attention without shapes beside some with: measured, not priced.
                if (cls == KernelClass::Attention && attentionPriced && s.flops <= 0) continue;
                if (!held[i]) {
                    ++r.fitted;
                    continue;
                }
                ++r.heldOut;
                const double m = static_cast<double>(s.durNs);
                r.measuredNs += m;
                if (!r.priced) continue;
                const double b = predictKernelNs(base, s), a = predictKernelNs(c, s);
                r.beforeNs += b;
                r.afterNs += a;
                if (m > 0) {
                    before.push_back(std::abs(b / m - 1.0));
                    after.push_back(std::abs(a / m - 1.0));
                }
            }
            r.beforeMedianErr = medianOf(before);
            r.afterMedianErr = medianOf(after);
            if (r.fitted + r.heldOut > 0) fit.classes.push_back(r);
        }
    }

    const KernelSamples& all;
    const ClusterSpec& base;
    const std::string& sourceName;
    const std::string from;
    KernelFit fit;
    ClusterSpec& c;
    std::vector<int32_t> steps, fitSteps, heldSteps;
    std::vector<uint8_t> held;
};
}  // namespace

Expected<KernelFit> fitKernels(const KernelSamples& all, const ClusterSpec& base,
                               const std::string& sourceName) {
    if (all.samples.empty())
        return Error{sourceName +
                     ": no kernel could be priced: no GEMM with shapes, memory-bound " +
                     "kernel with its bytes or sized collective (" +
                     std::to_string(all.deviceKernels) + " device kernels" +
                     (all.deviceKernels == 0 ? ", no host matmul or data-moving op" : "") + ")"};
    return KernelFitter(all, base, sourceName).run();
}

}  // namespace shardscope
