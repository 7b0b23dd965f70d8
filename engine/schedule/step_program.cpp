// SPDX-License-Identifier: Apache-2.0
#include "engine/schedule/step_program.h"

#include "engine/schedule/step_builder.h"

#include <algorithm>
#include <sstream>

namespace shardscope {

const char* streamName(Stream s) {
    static const char* n[] = {"compute",    "ag_copy_in", "all_gather", "reduce_scatter",
                              "all_reduce", "h2d",        "d2h",        "host"};
    return n[static_cast<int>(s)];
}
const char* opKindName(OpKind k) {
    static const char* n[] = {"copy_in",    "all_gather", "copy_out",   "forward",
                              "backward",   "recompute",  "rs_copy_in", "reduce_scatter",
                              "all_reduce", "optimizer",  "h2d",        "d2h"};
    return n[static_cast<int>(k)];
}
std::optional<OpKind> opKindFromName(std::string_view name) {
    for (int k = 0; k <= static_cast<int>(OpKind::D2H); ++k)
        if (name == opKindName(static_cast<OpKind>(k))) return static_cast<OpKind>(k);
    return std::nullopt;
}
const char* phaseName(Phase p) {
    static const char* n[] = {"forward", "backward", "optimizer"};
    return n[static_cast<int>(p)];
}
const char* memCategoryName(MemCategory c) {
    static const char* n[] = {
        "sharded_params",         "unsharded_params", "all_gather_buffers", "gradients",
        "reduce_scatter_buffers", "activations",      "optimizer_state",    "temporaries"};
    return n[static_cast<int>(c)];
}
// One step: the persistent state, forward and backward of each micro-batch (gradients
// reduced in the last, or every one under syncEveryMicroBatch), then the optimizer.
void StepBuilder::build() {
    m_prog.ops.clear();
    m_prog.buffers.clear();
    m_prog.mixes.clear();
    std::fill(std::begin(m_prog.persistentBytes), std::end(m_prog.persistentBytes), 0);
    m_prog.ops.reserve(static_cast<size_t>(16 * m_plan.units.size() * m_opts.microBatches + 16));
    m_prog.buffers.reserve(
        static_cast<size_t>(12 * m_plan.units.size() * m_opts.microBatches + 16));
    planGroups();
    m_table = buildSegments(m_plan, m_opts, m_mixes);
    m_prog.modelFlopsPerRank = m_table.modelFlopsPerRank;
    m_gradSegBuf.assign(m_table.segs.size(), BufferId());
    m_gradLateBuf.assign(m_table.segs.size(), BufferId());
    persistent();
    for (int64_t mb = 0; mb < m_opts.microBatches; ++mb) {
        const bool sync = mb + 1 == m_opts.microBatches || m_plan.plan.syncEveryMicroBatch;
        forward(static_cast<int32_t>(mb));
        backward(static_cast<int32_t>(mb), sync);
    }
    optimizer();
    m_prog.tokensPerRank = m_opts.microBatchSize * m_opts.seqLen * m_opts.microBatches;
}

StepOptions stepOptionsFor(const Plan& plan, int64_t devicesPerNode) {
    return {plan.microBatchSize, plan.seqLen, plan.microBatches, devicesPerNode, false};
}

StepOptions stepOptionsFor(const Plan& plan, const ClusterSpec& cluster) {
    StepOptions o = stepOptionsFor(plan, cluster.node.devicesPerNode);
    o.hostIsDevice = cluster.device.isHost();
    return o;
}

StepProgram buildStepProgram(const ResolvedPlan& plan, const StepOptions& options) {
    StepProgram p;
    StepBuilder(plan, options, p).build();
    return p;
}

void buildStepProgram(const ResolvedPlan& plan, const StepOptions& options, StepProgram& into) {
    StepBuilder(plan, options, into).build();
}

std::string opLabel(const ResolvedPlan& plan, const Op& op) {
    static const char* text[] = {"copy-in",
                                 "all-gather",
                                 "copy-out",
                                 "forward",
                                 "backward",
                                 "recompute",
                                 "reduce-scatter copy-in",
                                 "reduce-scatter",
                                 "all-reduce",
                                 "optimizer step",
                                 "h2d",
                                 "d2h"};
    if (op.kind == OpKind::OptimizerStep)
        return op.stream == Stream::Host ? "optimizer step (host)" : "optimizer step";
    return plan.units[op.unit.index()].displayName() + " " + text[static_cast<int>(op.kind)];
}

std::string StepProgram::dump(const ResolvedPlan& plan) const {
    std::ostringstream out;
    for (size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        out << i << " " << phaseName(op.phase) << " mb" << op.microBatch << " "
            << streamName(op.stream) << " " << opKindName(op.kind) << " " << opLabel(plan, op);
        if (op.flops > 0) out << " flops=" << static_cast<int64_t>(op.flops);
        if (op.commBytes > 0)
            out << " bytes=" << op.commBytes << " group=" << op.groupSize << "/" << op.groupNodes;
        if (!op.waits.empty()) {
            out << " waits=";
            for (size_t k = 0; k < op.waits.size(); ++k)
                out << (k ? "," : "") << op.waits[k].value;
        }
        if (op.cpuBlocks) out << " cpu-blocks";
        if (op.interleaved) out << " interleaved";
        // In the order the memory model applies them: early frees, allocations, frees.
        auto freed = [&](size_t from, size_t to) {
            for (size_t k = from; k < to; ++k)
                out << " -" << memCategoryName(buffers[op.frees[k].index()].category) << ":"
                    << buffers[op.frees[k].index()].bytes;
        };
        const size_t early = earlyFrees(op);
        freed(0, early);
        for (BufferId b : op.allocs)
            out << " +" << memCategoryName(buffers[b.index()].category) << ":"
                << buffers[b.index()].bytes << ":" << dtypeName(buffers[b.index()].dtype);
        freed(early, op.frees.size());
        out << "\n";
    }
    return out.str();
}

}  // namespace shardscope
