// SPDX-License-Identifier: Apache-2.0
#include "gui/timeline/sim_timeline.h"

#include <algorithm>

namespace shardscope::gui {

TimelineData timelineFromSimulation(const ResolvedPlan& plan, const StepProgram& program,
                                    const SimResult& sim) {
    TimelineData d;
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
        rows[static_cast<size_t>(op.stream)].events.push_back(
            {sim.start[i], sim.end[i], k, static_cast<int32_t>(i), opLabel(plan, op)});
        d.endNs = std::max(d.endNs, sim.end[i]);
    }
    sortEventsByStart(rows);
    for (auto& r : rows)
        if (!r.events.empty()) d.rows.push_back(std::move(r));  // only streams that ran
    return d;
}

}  // namespace shardscope::gui
