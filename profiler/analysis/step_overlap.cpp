// SPDX-License-Identifier: Apache-2.0
#include "profiler/analysis/step_overlap.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "plans/core/intervals.h"

namespace shardscope {

StepOverlap stepOverlap(const TraceFile& t) {
    StepOverlap out;
    std::map<std::pair<int32_t, int32_t>, std::vector<const TraceOp*>> byRankStep;
    for (const TraceOp& op : t.ops)
        byRankStep[{op.rank, op.step}].push_back(&op);
    std::map<std::tuple<std::string, std::string, std::string>, StepOverlap::Row> acc;
    for (const auto& [key, evs] : byRankStep) {
        std::vector<Interval> compute;
        for (const TraceOp* e : evs)
            if (e->kind && isComputeOp(*e->kind)) compute.push_back({e->startNs, e->endNs});
        const auto computeU = mergeIntervals(std::move(compute));
        for (const TraceOp* e : evs) {
            if (!e->kind || !isCollective(*e->kind)) continue;
            const std::vector<Interval> one{{e->startNs, e->endNs}};
            const int64_t hidden = intersectionLength(one, computeU);
            const std::string unit = e->unit.empty() ? "<root>" : e->unit;
            auto& x = acc[{unit, e->phase, opKindName(*e->kind)}];
            x.unit = unit;
            x.phase = e->phase;
            x.kind = opKindName(*e->kind);
            x.commNs += static_cast<double>(e->endNs - e->startNs);
            x.exposedNs += static_cast<double>(e->endNs - e->startNs - hidden);
            ++x.count;
            out.collectives.push_back({unit, e->phase, x.kind, e->rank, e->step, e->startNs,
                                       e->endNs, e->endNs - e->startNs - hidden});
        }
    }
    out.rankSteps = static_cast<int64_t>(byRankStep.size());
    for (auto& [_, r] : acc)
        out.rows.push_back(std::move(r));
    std::stable_sort(out.rows.begin(), out.rows.end(),
                     [](const auto& x, const auto& y) { return x.exposedNs > y.exposedNs; });
    return out;
}

}  // namespace shardscope
