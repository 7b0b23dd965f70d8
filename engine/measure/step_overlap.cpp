// SPDX-License-Identifier: Apache-2.0
#include "engine/measure/step_overlap.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "plans/core/intervals.h"
#include "profiler/analysis/peer_wait.h"

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
    // Waiting for peers: the collectives of the group of every rank (a smaller group, HSDP's,
    // on any rank rules out those whose size is not given).
    const int32_t ranks = t.ranks;
    if (ranks >= 2) {
        std::vector<const TraceOp*> coll;  // the ops behind out.collectives, in order
        for (const auto& [key, evs] : byRankStep)
            for (const TraceOp* e : evs)
                if (e->kind && isCollective(*e->kind)) coll.push_back(e);
        bool subgroups = false;
        for (const TraceOp* e : coll)
            subgroups = subgroups || (e->groupSize > 0 && e->groupSize != ranks);
        std::vector<std::vector<PeerSpan>> spans(static_cast<size_t>(ranks));
        std::vector<std::vector<size_t>> of(static_cast<size_t>(ranks));
        for (size_t i = 0; i < coll.size(); ++i) {
            const TraceOp* e = coll[i];
            if (e->groupSize > 0 ? e->groupSize != ranks : subgroups) continue;
            if (e->rank < 0 || e->rank >= ranks) continue;
            spans[static_cast<size_t>(e->rank)].push_back({out.collectives[i].kind + "|" + e->unit +
                                                               "|" + e->phase + "|" +
                                                               std::to_string(e->step),
                                                           e->startNs, e->endNs});
            of[static_cast<size_t>(e->rank)].push_back(i);
        }
        const PeerWaits w = peerWaits(spans);
        out.peerWaitMatched = w.matched;
        for (size_t r = 0; r < spans.size(); ++r)
            for (size_t k = 0; k < of[r].size(); ++k)
                if (w.waitNs[r][k] >= 0) {
                    out.collectives[of[r][k]].peerWaitNs = w.waitNs[r][k];
                    out.peerWaitNs += static_cast<double>(w.waitNs[r][k]);
                }
    }
    for (auto& [_, r] : acc)
        out.rows.push_back(std::move(r));
    std::stable_sort(out.rows.begin(), out.rows.end(),
                     [](const auto& x, const auto& y) { return x.exposedNs > y.exposedNs; });
    return out;
}

}  // namespace shardscope
