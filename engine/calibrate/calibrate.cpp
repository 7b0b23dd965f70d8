// SPDX-License-Identifier: Apache-2.0
#include "engine/calibrate/calibrate.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "engine/sim/cost_model.h"

namespace shardscope {

namespace {

bool isCompute(OpKind k) {
    return k == OpKind::Forward || k == OpKind::Backward || k == OpKind::Recompute;
}
// FSDP's copies into and out of the all-gather: what memory_efficiency is fitted to. The
// reduce-scatter copy-in (1c) and the optimizer step (1b) get rates of their own.
bool isCopy(const Op& op) {
    return op.kind == OpKind::CopyIn || op.kind == OpKind::CopyOut;
}

int64_t overlap(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    return std::max<int64_t>(0, std::min(a1, b1) - std::max(a0, b0));
}

// The measured ops of some kinds, per (rank, step), and another op's overlap with them.
class OpIntervals {
public:
    template <class Pred>
    OpIntervals(const StepProgram& p, const std::vector<const MeasuredOp*>& ops, Pred kind) {
        for (const auto* m : ops)
            if (kind(p.ops[static_cast<size_t>(m->opId)].kind))
                by_[{m->rank, m->step}].push_back({m->startNs, m->endNs});
    }
    [[nodiscard]] int64_t overlapNs(const MeasuredOp& m) const {
        int64_t ov = 0;
        if (auto it = by_.find({m.rank, m.step}); it != by_.end())
            for (const auto& [a, b] : it->second)
                ov += overlap(m.startNs, m.endNs, a, b);
        return ov;
    }

private:
    std::map<std::pair<int32_t, int32_t>, std::vector<std::pair<int64_t, int64_t>>> by_;
};

}  // namespace

double medianOf(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::vector<std::pair<double, double>> halfDecadeMedians(
    const std::vector<std::pair<double, double>>& samples, double floor) {
    return binMedians(samples, floor, 2);
}

std::vector<std::pair<double, double>> binMedians(
    const std::vector<std::pair<double, double>>& samples, double floor, int binsPerDecade) {
    std::map<int, std::pair<std::vector<double>, std::vector<double>>> buckets;
    for (const auto& [x, e] : samples)
        if (x > 0) {
            auto& b = buckets[static_cast<int>(std::floor(std::log10(x) * binsPerDecade))];
            b.first.push_back(x);
            b.second.push_back(e);
        }
    std::vector<std::pair<double, double>> curve;
    for (auto& [_, b] : buckets)
        curve.push_back({medianOf(b.first), std::max(medianOf(b.second), floor)});
    return curve;
}

std::vector<std::pair<double, double>> halfDecadeRates(
    const std::vector<std::pair<double, double>>& sizeAndSeconds, double peak, double floor) {
    struct Bin {
        std::vector<double> sizes;
        double size = 0, seconds = 0;
    };
    std::map<int, Bin> bins;
    for (const auto& [x, t] : sizeAndSeconds)
        if (x > 0 && t > 0) {
            Bin& b = bins[static_cast<int>(std::floor(std::log10(x) * 2))];
            b.sizes.push_back(x);
            b.size += x;
            b.seconds += t;
        }
    std::vector<std::pair<double, double>> curve;
    if (peak <= 0) return curve;
    for (auto& [k, b] : bins) {
        double size = 0, seconds = 0;
        for (int j = k - 1; j <= k + 1; ++j)
            if (auto it = bins.find(j); it != bins.end()) {
                size += it->second.size;
                seconds += it->second.seconds;
            }
        curve.push_back({medianOf(b.sizes), std::max(size / (seconds * peak), floor)});
    }
    return curve;
}

double capCurveAtOne(std::vector<std::pair<double, double>>& curve, double alsoConsider) {
    double top = alsoConsider;
    for (const auto& [_, e] : curve)
        top = std::max(top, e);
    if (top <= 1.0) return 1.0;
    for (auto& [_, e] : curve)
        e /= top;
    return top;
}

CollectiveLine fitCollectiveLine(const std::vector<CollectivePoint>& points, double keepLatencyNs) {
    CollectiveLine line;
    std::map<std::pair<double, double>, std::vector<double>> bySize;  // (k, x) -> durations
    for (const auto& pt : points)
        if (pt.x > 0 && pt.durNs > 0) bySize[{pt.k, pt.x}].push_back(pt.durNs);
    if (bySize.empty()) return line;
    double sKK = 0, sKX = 0, sXX = 0, sKD = 0, sXD = 0;
    for (auto& [kx, v] : bySize) {
        // The mean: the simulator's collectives of one size all take one time, and the time
        // this machine spends on them includes the slowed ones (CPU contention with compute
        // on a CPU run, congestion on a GPU one); the median would drop exactly those.
        double d = 0;
        for (double x : v)
            d += x;
        d /= static_cast<double>(v.size());
        const auto [k, x] = kx;
        sKK += k * k;
        sKX += k * x;
        sXX += x * x;
        sKD += k * d;
        sXD += x * d;
    }
    const double det = sKK * sXX - sKX * sKX;
    double xMin = 0, xMax = 0;
    for (const auto& [kx, _] : bySize) {
        xMin = xMin == 0 ? kx.second : std::min(xMin, kx.second);
        xMax = std::max(xMax, kx.second);
    }
    // A latency needs sizes far enough apart to separate it from bandwidth (4x here);
    // closer sizes only say how long bytes take.
    const bool spread = xMin > 0 && xMax >= 4 * xMin;
    if (bySize.size() >= 2 && spread && det > 1e-9 * sKK * sXX) {
        double lat = (sKD * sXX - sXD * sKX) / det;  // ns
        double nsPerByte = (sKK * sXD - sKX * sKD) / det;
        if (lat < 0 || nsPerByte <= 0) {
            // Durations do not grow with size over the sizes measured: keep the cluster's
            // latency and put the rest on bandwidth, which extrapolates to larger messages.
            lat = keepLatencyNs;
            nsPerByte = std::max(1e-6, (sXD - lat * sKX) / sXX);
            line.note =
                "collective durations did not grow with message size: latency kept, bandwidth "
                "fitted";
        }
        line.latencyNs = lat;
        line.busBandwidth = 1e9 / nsPerByte;
    } else {
        // Sizes too close together: keep the base latency, fit the bandwidth.
        line.latencyNs = keepLatencyNs;
        line.busBandwidth = sXX > 0 ? 1e9 * sXX / std::max(1.0, sXD - keepLatencyNs * sKX) : 0;
        line.note = "collective sizes within 4x of each other: latency kept, bandwidth fitted";
    }
    line.fitted = line.busBandwidth > 0;
    return line;
}

namespace {
// calibrate, step by step: each method fits one part of the cluster from the measured ops
// that join the step program.
class OpCalibrator {
public:
    OpCalibrator(const StepProgram& program, const ClusterSpec& base,
                 std::vector<const MeasuredOp*> measured, const std::string& source)
        : p(program),
          valid(std::move(measured)),
          sourceName(source),
          c(fit.cluster),
          hbm(base.device.hbmBandwidth),
          comm(p, valid, [](OpKind k) { return isCollective(k); }) {
        fit.cluster = base;
    }

    CalibrationFit run() {
        fitCopies();
        fitOptimizer();
        fitChunkCat();
        fitCompute();
        fitCollectives();
        fitIssueCost();
        c.simDefaulted = false;
        const std::string from = "fitted by `shardscope calibrate` from " + sourceName;
        c.sources["/sim/compute_efficiency"] =
            from + " (" + std::to_string(fit.computeOps) + " compute ops)";
        c.sources["/sim/memory_efficiency"] =
            from + " (" + std::to_string(fit.memoryOps) + " memory-bound ops)";
        c.sources["/sim/overlap_slowdown"] = from;
        c.sources["/sim/cpu_issue_ns"] = from + " (median gap between compute-stream ops)";
        if (fit.busBandwidth > 0) {
            c.sources["/sim/protocols"] =
                from + " (" + std::to_string(fit.collectiveOps) + " collectives)";
            c.sources["/node/intra_bandwidth_bytes_per_s"] = from;
            c.sources["/node/intra_latency_ns"] = from;
        }
        return std::move(fit);
    }

private:
    // The overlapped fraction of a compute op's time, by collectives of its rank and step.
    double overlapped(const MeasuredOp& m) const {
        return std::min(
            1.0, static_cast<double>(comm.overlapNs(m)) / static_cast<double>(m.endNs - m.startNs));
    }
    // The bytes the measured ops that `which` picks moved, their time and their count.
    struct Moved {
        double bytes = 0, seconds = 0;
        int64_t ops = 0;
    };
    template <class Which>
    Moved moved(Which which) const {
        Moved r;
        for (const auto* m : valid) {
            const Op& op = p.ops[static_cast<size_t>(m->opId)];
            if (!which(op) || op.memBytes <= 0) continue;
            r.bytes += op.memBytes;
            r.seconds += static_cast<double>(m->endNs - m->startNs) * 1e-9;
            ++r.ops;
        }
        return r;
    }

    void fitCopies() {
        // 1. FSDP's copies: one efficiency for the bytes they move.
        const Moved copies = moved(isCopy);
        fit.memoryOps = copies.ops;
        if (copies.ops > 0 && hbm > 0 && copies.seconds > 0)
            c.sim.memoryEfficiency = std::clamp(copies.bytes / (hbm * copies.seconds), 1e-4, 1.0);
        else
            fit.notes.push_back("memory efficiency kept: no copy was measured");
        hbmEff = hbm * c.sim.memoryEfficiency;
    }

    // 1b. The optimizer step: its own rate, at its size, from the measured steps. A GPU step
    //     lists its foreach kernels (multi_tensor_apply's kernels run slower than copies of
    //     their size: 3.6-4.0 TB/s on an H200 whose copies reach 4.3); on a CPU device the
    //     step is one op, offloaded or not, which ran 1.7-1.9x as fast as the copies' rate
    //     on the tiny Llama over two ranks (a 2-core machine, 2026-11-27).
    void fitOptimizer() {
        double obytes = 0, oseconds = 0, okernels = 0;
        for (const auto* m : valid) {
            const Op& op = p.ops[static_cast<size_t>(m->opId)];
            if (op.kind != OpKind::OptimizerStep) continue;
            if (op.mix >= 0 && static_cast<size_t>(op.mix) < p.mixes.size() &&
                op.stream != Stream::Host) {
                const KernelMix& mix = p.mixes[static_cast<size_t>(op.mix)];
                for (const KernelEntry& e : mix.entries)
                    obytes += e.count * e.perKernel;
                okernels += static_cast<double>(mix.kernels);
            } else if (c.device.isHost() && op.memBytes > 0) {
                obytes += op.memBytes;
                okernels += 1;
            } else {
                continue;
            }
            oseconds += static_cast<double>(m->endNs - m->startNs) * 1e-9;
        }
        if (obytes > 0 && oseconds > 0 && okernels > 0 && hbm > 0) {
            c.sim.memoryEfficiencyByOp[kForeachOptimizerKey] = {
                {obytes / okernels, std::clamp(obytes / (hbm * oseconds), 1e-4, 1.0)}};
            c.sources[std::string("/sim/memory_efficiency_by_op/") + kForeachOptimizerKey] =
                "fitted by `shardscope calibrate --trace` from " + sourceName +
                ": the measured optimizer steps";
        }
    }

    void fitChunkCat() {
        // 1c. The reduce-scatter copy-in: FSDP2's torch._chunk_cat, a copy of its own (its rate
        //     is what the cost model prices it by, under that operator's name). On the tiny
        //     Llama over two CPU ranks it ran at half the copy-ins' rate.
        if (const Moved rs =
                moved([](const Op& op) { return op.kind == OpKind::ReduceScatterCopyIn; });
            rs.ops > 0 && rs.seconds > 0 && hbm > 0) {
            c.sim.memoryEfficiencyByOp[kChunkCatKey] = {
                {rs.bytes / static_cast<double>(rs.ops),
                 std::clamp(rs.bytes / (hbm * rs.seconds), 1e-4, 1.0)}};
            c.sources[std::string("/sim/memory_efficiency_by_op/") + kChunkCatKey] =
                "fitted by `shardscope calibrate --trace` from " + sourceName +
                ": the measured reduce-scatter copy-ins";
        }
    }

    void fitCompute() {
        // 2. Compute efficiency from the compute ops no collective overlapped (all of them when
        //    too few were alone), by half-decade of FLOPs per kernel.
        struct Sample {
            double perKernel, eff, ratioInput, overlapFrac;
            const MeasuredOp* m;
        };
        std::vector<Sample> samples;
        for (const auto* m : valid) {
            const Op& op = p.ops[static_cast<size_t>(m->opId)];
            if (!isCompute(op.kind) || op.flops <= 0) continue;
            double d = static_cast<double>(m->endNs - m->startNs) * 1e-9;
            double flops = op.flops, perKernel = op.flops / std::max(1, op.groupSize);
            double memT = hbmEff > 0 ? op.memBytes / hbmEff : 0;
            if (op.mix >= 0 && static_cast<size_t>(op.mix) < p.mixes.size()) {
                // Kernel by kernel, as the cost model prices it: the memory-bound kernels at the
                // fitted bandwidth, the rest is GEMM and attention time.
                const KernelMix& mix = p.mixes[static_cast<size_t>(op.mix)];
                const MixParts parts = mixParts(c, mix, op.computeDtype);
                if (parts.computeKernels == 0 || parts.computeFlops <= 0) continue;
                flops = parts.computeFlops;
                perKernel = flops / static_cast<double>(parts.computeKernels);
                memT = parts.memorySeconds;
                if (c.device.isHost())
                    d -= c.sim.cpuLaunchNs * 1e-9 * static_cast<double>(mix.kernels);
                d -=
                    c.sim.kernelGapNs * 1e-9 * static_cast<double>(mix.kernels);  // between kernels
            }
            const double computeT = std::max(d - memT, 0.05 * d);
            const double eff = flops / (c.device.peakFor(op.computeDtype) * computeT);
            samples.push_back({perKernel, eff, d, overlapped(*m), m});
        }
        fit.computeOps = static_cast<int64_t>(samples.size());
        if (!samples.empty()) {
            size_t alone = 0;
            for (const auto& s : samples)
                alone += s.overlapFrac < 0.01;
            const bool useAlone = alone >= 3;
            std::vector<std::pair<double, double>> points;
            for (const auto& s : samples)
                if (!useAlone || s.overlapFrac < 0.01) points.push_back({s.perKernel, s.eff});
            auto curve = halfDecadeMedians(points, 1e-4);
            // Above 1 the device outran its listed peak (or the FLOP count is generous, as
            // with causal attention): raise the peak so the curve stays a fraction; predicted
            // times are unchanged.
            if (const double top = capCurveAtOne(curve); top > 1.0) {
                for (auto& [dt, peak] : c.device.peakFlops)
                    peak *= top;
                fit.notes.push_back(
                    "measured compute ran above the listed peak: peak_flops raised " +
                    std::to_string(top) + "x so efficiencies stay at most 1");
                c.sources["/device/peak_flops"] = "raised by `shardscope calibrate` from " +
                                                  sourceName + ": the measured rate exceeded it";
            }
            c.sim.computeEfficiency = curve;
            if (!useAlone)
                fit.notes.push_back(
                    "fewer than 3 compute ops ran without a collective overlapping "
                    "them: the efficiency curve includes overlapped ones");
            // 3. Overlap slowdown: measured / predicted without overlap, per overlapped fraction.
            std::vector<double> slow;
            for (const auto& s : samples) {
                if (s.overlapFrac < 0.05) continue;
                const Op& op = p.ops[static_cast<size_t>(s.m->opId)];
                const double pred = op.mix >= 0
                                        ? static_cast<double>(opDurationNs(c, op, &p)) * 1e-9
                                        : op.flops / (c.device.peakFor(op.computeDtype) *
                                                      c.sim.efficiencyFor(s.perKernel)) +
                                              (hbmEff > 0 ? op.memBytes / hbmEff : 0);
                if (pred > 0) slow.push_back((s.ratioInput / pred - 1.0) / s.overlapFrac);
            }
            if (!slow.empty()) {
                const double v = medianOf(slow);
                c.sim.overlapSlowdown = std::clamp(v, 0.0, 1.0);  // the cluster format's range
                if (v > 1.0)
                    fit.notes.push_back("overlapped compute ran " + std::to_string(1.0 + v) +
                                        "x as long: overlap slowdown capped at 1 (was the machine "
                                        "busy with other work?)");
            } else
                fit.notes.push_back(
                    "overlap slowdown kept: no compute op was overlapped for 5% "
                    "of its time or more");
        } else {
            fit.notes.push_back("compute efficiency kept: no compute op with FLOPs was measured");
        }
    }

    void fitCollectives() {
        // 4. Collectives: k·latency + x/bandwidth by least squares (x = factor · bytes) over
        //    the mean of each message size. A measured collective also waits for the other
        //    ranks to reach it; the simulator's ranks are alike, so that typical skew is part of
        //    the fitted cost.
        //    On a CPU device compute slows the collectives it overlaps (Gloo's threads share the
        //    cores): the line is fitted to the collectives no compute overlapped (when there are
        //    at least 3), and comm_overlap_slowdown to the others (4b).
        const OpIntervals computeIv(p, valid, isCompute);
        auto computeOverlapNs = [&](const MeasuredOp& m) {
            return std::min(computeIv.overlapNs(m), m.endNs - m.startNs);
        };
        const bool hostDevice = c.device.isHost();
        std::vector<CollectivePoint> points, alonePoints;
        std::vector<const MeasuredOp*> overlappedColl;
        for (const auto* m : valid) {
            const Op& op = p.ops[static_cast<size_t>(m->opId)];
            if (!isCollective(op.kind) || op.groupSize <= 1 || op.commBytes <= 0) continue;
            const double n = op.groupSize;
            const double k = op.kind == OpKind::AllReduce ? 2.0 : 1.0;
            const CollectivePoint pt{k, k * (n - 1) / n * static_cast<double>(op.commBytes),
                                     static_cast<double>(m->endNs - m->startNs)};
            points.push_back(pt);
            const double frac = static_cast<double>(computeOverlapNs(*m)) /
                                static_cast<double>(m->endNs - m->startNs);
            if (frac < 0.01)
                alonePoints.push_back(pt);
            else if (frac >= 0.05)
                overlappedColl.push_back(m);
            ++fit.collectiveOps;
        }
        const bool byAlone = hostDevice && alonePoints.size() >= 3 && !overlappedColl.empty();
        if (byAlone) points = alonePoints;
        if (!points.empty()) {
            const CollectiveLine line = fitCollectiveLine(
                points, c.sim.protocols.empty() ? 0 : c.sim.protocols.front().baseNs);
            fit.latencyNs = line.latencyNs;
            fit.busBandwidth = line.busBandwidth;
            if (!line.note.empty()) fit.notes.push_back(line.note);
        } else {
            fit.notes.push_back("collective model kept: no collective was measured");
        }
        if (fit.busBandwidth > 0) {
            c.sim.protocols = {{"calibrated", fit.latencyNs, 0, 0, 1.0}};
            c.node.intraBandwidth = fit.busBandwidth / std::max(1e-9, c.sim.intraEfficiency);
            c.node.intraLatencyNs = static_cast<int64_t>(std::llround(fit.latencyNs));
        }
        // 4b. comm_overlap_slowdown (a CPU device): the median over the overlapped collectives of
        //     their time beyond the line's, per unit of the time compute overlapped them.
        if (byAlone && fit.busBandwidth > 0) {
            std::vector<double> slow;
            for (const auto* m : overlappedColl) {
                const Op& op = p.ops[static_cast<size_t>(m->opId)];
                const double pred = static_cast<double>(opDurationNs(c, op, &p));
                const double ov = static_cast<double>(computeOverlapNs(*m));
                if (pred > 0 && ov > 0)
                    slow.push_back((static_cast<double>(m->endNs - m->startNs) - pred) / ov);
            }
            // Below 5 % it is noise of the line's fit (a run without the effect reads 0.003).
            if (const double v = slow.empty() ? 0.0 : medianOf(slow); v >= 0.05) {
                c.sim.commOverlapSlowdown = std::min(v, 20.0);
                c.sources["/sim/comm_overlap_slowdown"] =
                    "fitted by `shardscope calibrate --trace` from " + sourceName + " (" +
                    std::to_string(slow.size()) + " collectives overlapped by compute, against " +
                    std::to_string(alonePoints.size()) + " alone)";
            }
        } else if (hostDevice && !points.empty()) {
            fit.notes.push_back(
                "comm overlap slowdown kept: fewer than 3 collectives ran without compute "
                "overlapping them, or none with");
        }
    }

    void fitIssueCost() {
        // 5. CPU issue cost: between consecutive compute-stream ops the CPU issued every
        //    program op in between; gaps before ops that wait on a collective (copy-out, the
        //    optimizer step) are waits, not issue cost, and are left out.
        std::map<std::pair<int32_t, int32_t>, std::vector<const MeasuredOp*>> computeStream;
        for (const auto* m : valid)
            if (p.ops[static_cast<size_t>(m->opId)].stream == Stream::Compute)
                computeStream[{m->rank, m->step}].push_back(m);
        std::vector<double> perOp;
        for (auto& [_, v] : computeStream) {
            std::sort(v.begin(), v.end(), [](const MeasuredOp* a, const MeasuredOp* b) {
                return a->startNs < b->startNs;
            });
            for (size_t i = 1; i < v.size(); ++i) {
                const Op& next = p.ops[static_cast<size_t>(v[i]->opId)];
                if (next.kind == OpKind::CopyOut || next.kind == OpKind::OptimizerStep) continue;
                const int32_t between = v[i]->opId - v[i - 1]->opId;
                if (between <= 0) continue;
                perOp.push_back(
                    static_cast<double>(std::max<int64_t>(0, v[i]->startNs - v[i - 1]->endNs)) /
                    between);
            }
        }
        if (!perOp.empty()) c.sim.cpuIssueNs = medianOf(perOp);
    }

    const StepProgram& p;
    const std::vector<const MeasuredOp*> valid;
    const std::string& sourceName;
    CalibrationFit fit;
    ClusterSpec& c;
    const double hbm;
    double hbmEff = 0;
    // Collective intervals per (rank, step), for the overlap of each compute op.
    const OpIntervals comm;
};
}  // namespace

Expected<CalibrationFit> calibrate(const StepProgram& p, const ClusterSpec& base,
                                   const std::vector<MeasuredOp>& ops,
                                   const std::string& sourceName) {
    std::vector<const MeasuredOp*> valid;
    for (const auto& m : ops)
        if (m.opId >= 0 && static_cast<size_t>(m.opId) < p.ops.size() && m.endNs > m.startNs)
            valid.push_back(&m);
    if (valid.empty())
        return Error{sourceName +
                     ": no measured op joins the step program (op ids missing or out of range; "
                     "is this a `shardscope run --trace` of the same model, plan and batch?)"};

    return OpCalibrator(p, base, std::move(valid), sourceName).run();
}

}  // namespace shardscope
