// SPDX-License-Identifier: Apache-2.0
#include "engine/sim/cost_model.h"

#include "engine/sim/nccl_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace shardscope {

CollectiveCost collectiveTime(const ClusterSpec& c, OpKind kind, int64_t bytes, int32_t n,
                              int32_t nodes, int32_t perNode) {
    if (n <= 1 || bytes <= 0) return {};
    if (c.nccl) {
        const auto e = ncclCollective(c, *c.nccl, kind, bytes, n, std::max(1, nodes));
        if (!e) return {};
        const NcclOccupancy occ = ncclOccupancy(c, *c.nccl, *e, kind, bytes, n);
        return {static_cast<int64_t>(std::llround(e->us * 1000)), static_cast<int>(e->proto),
                static_cast<int>(e->algo), occ.smShare, occ.hbmShare};
    }
    const auto& s = c.sim;
    const double intra = c.node.intraBandwidth * s.intraEfficiency;
    const double busbw = nodes <= 1
                             ? intra
                             : std::min(intra, static_cast<double>(perNode) *
                                                   c.network.nicBandwidth * s.networkEfficiency);
    const double factor = (kind == OpKind::AllReduce ? 2.0 : 1.0) * static_cast<double>(n - 1) /
                          static_cast<double>(n);
    CollectiveCost best{std::numeric_limits<int64_t>::max(), 0};
    for (size_t i = 0; i < s.protocols.size(); ++i) {
        const auto& p = s.protocols[i];
        const double steps = static_cast<double>(n - 1);
        const double inter = static_cast<double>(nodes - 1);
        double lat = p.baseNs + (steps - inter) * p.intraStepNs + inter * p.interStepNs;
        if (kind == OpKind::AllReduce) lat *= 2;  // reduce-scatter then all-gather phases
        const double t = lat + factor * static_cast<double>(bytes) / (busbw * p.bwFactor) * 1e9;
        if (t < static_cast<double>(best.ns))
            best = {static_cast<int64_t>(std::llround(t)), static_cast<int>(i)};
    }
    return best;
}

namespace {
// The memory_efficiency_by_op curves the cost model looks up, as the map's key type (made
// once, not per lookup).
const std::string foreachCurve = kForeachOptimizerKey, moduleCurve = kModuleKernelsKey,
                  chunkCatCurve = kChunkCatKey, copyCurve = kCopyKernelsKey,
                  castCurve = kCastKernelsKey;

// One entry's device time: its count of kernels, each priced by its own size. `memoryOp`
// names the memory_efficiency_by_op curve its memory-bound kernels take where the cluster
// has one (the modules' kernels, the optimizer's foreach kernels); else the curve by bytes.
double entrySeconds(const ClusterSpec& c, const KernelEntry& e, DType dtype,
                    const std::string& memoryOp = moduleCurve) {
    const double n = e.count;
    switch (e.kind) {
        case KernelKind::Gemm: {
            // A float8 GEMM (torchao's _scaled_mm) runs at the device's fp8 peak; with no fp8
            // measurement its efficiency is the compute curve's, as a fraction of that peak.
            const DType gd = e.shape.float8 ? DType::Float8E4M3 : dtype;
            return n * e.perKernel /
                   (c.device.peakFor(gd) *
                    c.sim.gemmEfficiencyFor(e.perKernel, e.shape.m, e.shape.n, e.shape.k, gd));
        }
        case KernelKind::Attention:
            return n * e.perKernel /
                   (c.device.peakFor(dtype) * (e.masked
                                                   ? c.sim.maskedAttentionEfficiencyFor(e.perKernel)
                                                   : c.sim.attentionEfficiencyFor(e.perKernel)));
        case KernelKind::MemoryBound:
            return n * e.perKernel /
                   (c.device.hbmBandwidth * c.sim.memoryEfficiencyFor(e.perKernel, memoryOp));
    }
    return 0;
}
}  // namespace

MixParts mixParts(const ClusterSpec& c, const KernelMix& mix, DType dtype) {
    MixParts m;
    for (const KernelEntry& e : mix.entries) {
        const double t = entrySeconds(c, e, dtype);
        if (e.kind == KernelKind::MemoryBound) {
            m.memorySeconds += t;
        } else {
            m.computeSeconds += t;
            m.computeFlops += e.count * e.perKernel;
            m.computeKernels += e.count;
        }
    }
    return m;
}

const char* kernelKindName(KernelKind k) {
    switch (k) {
        case KernelKind::Gemm:
            return "gemm";
        case KernelKind::Attention:
            return "attention";
        case KernelKind::MemoryBound:
            return "memory_bound";
    }
    return "?";
}

KernelTotals kernelTotals(const ClusterSpec& c, const StepProgram& p) {
    KernelTotals t;
    for (const Op& op : p.ops) {
        if (op.mix < 0 || static_cast<size_t>(op.mix) >= p.mixes.size()) continue;
        const KernelMix& mix = p.mixes[static_cast<size_t>(op.mix)];
        for (const KernelEntry& e : mix.entries) {
            KernelClassTotal& k = t.byKind[static_cast<int>(e.kind)];
            k.count += e.count;
            k.work += e.count * e.perKernel;
            k.deviceSeconds +=
                entrySeconds(c, e, op.computeDtype,
                             op.kind == OpKind::OptimizerStep ? foreachCurve : moduleCurve);
        }
        t.launchSeconds += cpuLaunchNsFor(c.sim, op.kind) * 1e-9 * static_cast<double>(mix.kernels);
    }
    return t;
}

double optimizerMixSeconds(const ClusterSpec& c, const KernelMix& mix) {
    double t = 0;
    for (const KernelEntry& e : mix.entries)
        t += entrySeconds(c, e, DType::Float32, foreachCurve);
    return t;
}

double mixSeconds(const ClusterSpec& c, const KernelMix& mix, DType dtype) {
    const MixParts m = mixParts(c, mix, dtype);
    return m.computeSeconds + m.memorySeconds;
}

int64_t opDurationNs(const ClusterSpec& c, const Op& op, const StepProgram* program) {
    const double hbm = c.device.hbmBandwidth * c.sim.memoryEfficiency;
    // The device's own time between queued kernels, once per kernel (kernel_gap_ns).
    const double gap = c.sim.kernelGapNs * 1e-9;
    double t = 0;
    switch (op.kind) {
        case OpKind::Forward:
        case OpKind::Backward:
        case OpKind::Recompute: {
            if (program && op.mix >= 0 && static_cast<size_t>(op.mix) < program->mixes.size()) {
                const KernelMix& mix = program->mixes[static_cast<size_t>(op.mix)];
                t = mixSeconds(c, mix, op.computeDtype) + gap * static_cast<double>(mix.kernels);
                break;
            }
            if (op.flops > 0) {
                const double perKernel = op.flops / std::max(1, op.groupSize);
                t +=
                    op.flops / (c.device.peakFor(op.computeDtype) * c.sim.efficiencyFor(perKernel));
            }
            t += op.memBytes / hbm;
            break;
        }
        case OpKind::CopyIn:
        case OpKind::CopyOut:
            // One kernel each, priced by its size: by the copies' curve (kCopyKernelsKey)
            // where the cluster has one, else by the curve by bytes. (FSDP1's copy-out copies
            // nothing: no kernel.)
            if (op.memBytes > 0)
                t = op.memBytes /
                        (c.device.hbmBandwidth *
                         c.sim.memoryEfficiencyFor(static_cast<double>(op.memBytes), copyCurve)) +
                    gap;
            break;
        case OpKind::ReduceScatterCopyIn:
            // FSDP2's torch._chunk_cat (casting to the reduce dtype on the way): its own
            // curve where `calibrate --from-trace` fitted one (on an H200 it moved 1.8 TB/s
            // where copies of its size moved 3.7). FSDP1's copy-in here is the gradient's
            // cast (`flat_param.grad.to(reduce_dtype)`), a widening cast that runs
            // aten::copy_'s unrolled kernel (kCastKernelsKey: 0.39 of the bandwidth on an
            // H200, where copy_'s vectorized curve holds the faster narrowing casts); where
            // the cluster has no such curve (a CPU's), by _chunk_cat's. No cast, no kernel.
            if (op.memBytes > 0) {
                const std::string& curve =
                    op.flatGradCast && c.sim.memoryEfficiencyByOp.count(castCurve) > 0
                        ? castCurve
                        : chunkCatCurve;
                t = op.memBytes /
                        (c.device.hbmBandwidth *
                         c.sim.memoryEfficiencyFor(static_cast<double>(op.memBytes), curve)) +
                    gap;
            }
            break;
        case OpKind::OptimizerStep:
            // The foreach path's kernels, each by its size, where the step program lists
            // them (a GPU device). On a CPU cluster the host is the device: the offloaded
            // shards' step runs on the same cores and memory as any other, so it costs what
            // the device's does.
            if (program && op.mix >= 0 && static_cast<size_t>(op.mix) < program->mixes.size()) {
                const KernelMix& mix = program->mixes[static_cast<size_t>(op.mix)];
                t = optimizerMixSeconds(c, mix) + gap * static_cast<double>(mix.kernels);
            } else if (op.stream == Stream::Host && !c.device.isHost()) {
                t = op.memBytes / c.sim.hostOptimizerBytesPerS;
            } else {
                // Its own rate where `calibrate --trace` fitted one, else the copies'.
                t = op.memBytes / (c.sim.memoryEfficiencyByOp.count(foreachCurve) > 0
                                       ? c.device.hbmBandwidth *
                                             c.sim.memoryEfficiencyFor(op.memBytes, foreachCurve)
                                       : hbm);
            }
            break;
        case OpKind::H2D:
        case OpKind::D2H:
            t = op.memBytes / c.host.linkBandwidth;
            break;
        case OpKind::AllGather:
        case OpKind::ReduceScatter:
        case OpKind::AllReduce:
            // FSDP2's reduce over a group of one is a device copy of its input (memBytes).
            if (op.groupSize <= 1 && op.memBytes > 0) {
                t = op.memBytes / (c.device.hbmBandwidth *
                                   c.sim.memoryEfficiencyFor(static_cast<double>(op.memBytes)));
                break;
            }
            return collectiveTime(c, op.kind, op.commBytes, op.groupSize, op.groupNodes,
                                  op.ranksPerNode)
                .ns;
    }
    return static_cast<int64_t>(std::llround(t * 1e9));
}

}  // namespace shardscope
