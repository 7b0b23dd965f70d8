// SPDX-License-Identifier: Apache-2.0
#include "gui/timeline/sim_timeline.h"

#include <algorithm>
#include <cstdio>

#include "plans/core/strings.h"
#include "profiler/analysis/summary.h"

namespace shardscope::gui {

namespace {

std::string ms(int64_t ns) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3f ms", static_cast<double>(ns) * 1e-6);
    return b;
}

}  // namespace

std::string describeCollective(const char* kind, int64_t bytes, int32_t groupSize, int64_t ns) {
    std::string s = std::string(kind) + " of " + formatBytes(bytes);
    if (groupSize > 1) s += " over " + std::to_string(groupSize) + " ranks";
    const double factor = busBandwidthFactor(collectiveKindOf(kind), groupSize);
    if (ns > 0 && bytes > 0 && groupSize > 1 && factor >= 0) {
        const double alg = static_cast<double>(bytes) / static_cast<double>(ns);  // GB/s
        char b[96];
        std::snprintf(b, sizeof b, "\nachieved: %.1f GB/s algorithm, %.1f GB/s bus", alg,
                      factor * alg);
        s += b;
    }
    return s;
}

TimelineData timelineFromSimulation(const ResolvedPlan& plan, const StepProgram& program,
                                    const SimResult& sim) {
    TimelineData d;
    for (const auto& u : plan.units)
        d.units.push_back(u.name);
    std::vector<TimelineRow> rows(static_cast<size_t>(Stream::Count));
    for (size_t s = 0; s < rows.size(); ++s)
        rows[s].name = streamName(static_cast<Stream>(s));
    for (size_t i = 0; i < program.ops.size(); ++i) {
        const Op& op = program.ops[i];
        if (sim.end[i] <= sim.start[i]) continue;
        EventKind k = EventKind::Copy;
        switch (op.kind) {
            case OpKind::Forward:
            case OpKind::Backward:
            case OpKind::Recompute:
            case OpKind::OptimizerStep:
                k = EventKind::Compute;
                break;
            case OpKind::AllGather:
                k = EventKind::AllGather;
                break;
            case OpKind::ReduceScatter:
                k = EventKind::ReduceScatter;
                break;
            case OpKind::AllReduce:
                k = EventKind::AllReduce;
                break;
            default:
                k = EventKind::Copy;
        }
        rows[static_cast<size_t>(op.stream)].events.push_back({sim.start[i], sim.end[i], k,
                                                               static_cast<int32_t>(i),
                                                               opLabel(plan, op), op.unit.value});
        d.endNs = std::max(d.endNs, sim.end[i]);
    }
    sortEventsByStart(rows);
    for (auto& r : rows)
        if (!r.events.empty()) d.rows.push_back(std::move(r));  // only streams that ran
    markExposedCommunication(d);
    // The details text, from copies of what it needs (the program and result are the
    // caller's and go away).
    struct Info {
        std::string label, unit, phase, stream, kind;
        int32_t microBatch = 0;
        int64_t start = 0, end = 0, commBytes = 0;
        int32_t groupSize = 0;
        double flops = 0, memBytes = 0;
        std::vector<int32_t> waits;
        std::vector<std::pair<int64_t, std::string>> allocs, frees;
    };
    auto infos = std::make_shared<std::vector<Info>>();
    infos->reserve(program.ops.size());
    for (size_t i = 0; i < program.ops.size(); ++i) {
        const Op& op = program.ops[i];
        Info in;
        in.label = opLabel(plan, op);
        in.unit = plan.units[op.unit.index()].displayName();
        in.phase = phaseName(op.phase);
        in.stream = streamName(op.stream);
        in.kind = opKindName(op.kind);
        in.microBatch = op.microBatch;
        in.start = sim.start[i];
        in.end = sim.end[i];
        in.commBytes = op.commBytes;
        in.groupSize = op.groupSize;
        in.flops = op.flops;
        in.memBytes = op.memBytes;
        for (OpId w : op.waits)
            in.waits.push_back(w.value);
        if (!in.waits.empty()) d.waits[static_cast<int32_t>(i)] = in.waits;
        for (BufferId b : op.allocs)
            in.allocs.push_back({program.buffers[b.index()].bytes,
                                 memCategoryName(program.buffers[b.index()].category)});
        for (BufferId b : op.frees)
            in.frees.push_back({program.buffers[b.index()].bytes,
                                memCategoryName(program.buffers[b.index()].category)});
        infos->push_back(std::move(in));
    }
    d.describe = [infos](int32_t op) -> std::string {
        if (op < 0 || static_cast<size_t>(op) >= infos->size()) return {};
        const Info& in = (*infos)[static_cast<size_t>(op)];
        std::string s = in.label + "\nop " + std::to_string(op) + " · unit " + in.unit + " · " +
                        in.phase + " · micro-batch " + std::to_string(in.microBatch) + "\nstream " +
                        in.stream + "\nstart " + ms(in.start) + ", duration " +
                        ms(in.end - in.start);
        if (in.commBytes > 0)
            s += "\n" +
                 describeCollective(in.kind.c_str(), in.commBytes, in.groupSize, in.end - in.start);
        if (in.flops > 0) {
            char b[64];
            std::snprintf(
                b, sizeof b, "\n%.3g FLOPs: %.1f TFLOP/s", in.flops,
                in.end > in.start ? in.flops / static_cast<double>(in.end - in.start) * 1e-3 : 0.0);
            s += b;
        }
        for (const auto& [bytes, cat] : in.allocs)
            s += "\nallocates " + formatBytes(bytes) + " (" + cat + ")";
        for (const auto& [bytes, cat] : in.frees)
            s += "\nfrees " + formatBytes(bytes) + " (" + cat + ")";
        if (!in.waits.empty()) {
            s += "\nwaited on:";
            for (int32_t w : in.waits) {
                const Info& wi = (*infos)[static_cast<size_t>(w)];
                s += "\n  op " + std::to_string(w) + " " + wi.label + " (ends " + ms(wi.end) + ")";
            }
        }
        return s;
    };
    return d;
}

}  // namespace shardscope::gui
