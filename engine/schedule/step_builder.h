// SPDX-License-Identifier: Apache-2.0
#pragma once
// The step program's builder (docs/architecture.md): one training step emitted as FSDP runs
// it, from the plan's compute segments (step_segments.h). Its parts live by what they emit:
//   step_program.cpp     the step's order (forward and backward of each micro-batch, then
//                        the optimizer);
//   step_collectives.cpp unshard, reshard and reduce: the copy-ins, all-gathers, copy-outs,
//                        reduce-scatters and all-reduces of FSDP1, FSDP2 and HSDP;
//   step_passes.cpp      forward, recompute and backward of each segment, with the
//                        activations, gradients and working memory they hold;
//   step_optimizer.cpp   the persistent state and the optimizer step.
// Internal to engine/schedule.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

#include "engine/schedule/step_program.h"
#include "engine/schedule/step_segments.h"
#include "plans/plan/resolve.h"

namespace shardscope {

// A process group as the ranks lie on nodes.
struct RankGroup {
    int32_t size = 1, nodes = 1, perNode = 1;
};

class StepBuilder {
public:
    StepBuilder(const ResolvedPlan& plan, const StepOptions& options, StepProgram& into)
        : m_plan(plan), m_model(*plan.model), m_opts(options), m_prog(into), m_mixes(into.mixes) {}

    void build();

private:
    // step_collectives.cpp
    RankGroup placed(int64_t size, bool contiguous) const;
    void planGroups();
    void unshard(int32_t u, Phase phase, int32_t mb);
    void waitForUnshard(int32_t u, Phase phase, int32_t mb);
    void localCopyOut(int32_t u, Phase phase, int32_t mb);
    void unshardAndWait(int32_t u, Phase phase, int32_t mb);
    void reshardAt(int32_t u, OpId at, bool keepPostForwardCopy);
    void prefetchForward(int32_t u, int32_t mb);
    void reduceUnit(int32_t u, int32_t mb, bool sync);

    // step_passes.cpp
    std::pair<int64_t, double> flatGradientDivideFactors() const;
    bool upcastsGradients(const ResolvedUnit& unit) const;
    Op& computeOp(OpKind kind, Phase phase, const Segment& sg, int32_t mb, double flops,
                  double mem);
    void addMemoryKernels(Op& c, double moved, int64_t kernels);
    void forward(int32_t mb);
    std::vector<int32_t> postForwardOrder() const;
    int64_t recompute(size_t i, int32_t mb, bool upcast, BufferId& lateTemp);
    int64_t postBackwardKernels(Op& c, int32_t u, bool sync, bool upcast);
    void backward(int32_t mb, bool sync);

    // step_optimizer.cpp
    void persistent();
    int32_t optimizerMix(int64_t shardedBytes);
    std::vector<int64_t> optimizerTemporaries() const;
    void optimizer();

    bool fsdp1() const { return m_plan.plan.api == PlanApi::Fsdp1; }

    // Elements of a unit's all-gathered (padded) parameters: its unsharded gradients'
    // count, whatever dtype they are reduced or accumulated in.
    static int64_t unshardedElems(const ResolvedUnit& unit) {
        return unit.unshardedBytes / std::max<int64_t>(1, dtypeSize(unit.allGatherDtype));
    }

    // Tensors op `c` allocates and frees within itself, each its own block (the caching
    // allocator places separate tensors apart; one block of their sum would need a segment
    // neither freed block could serve later). Sizes of 0 or less are skipped.
    void temporaries(Op& c, std::initializer_list<int64_t> sizes, MemCategory cat, DType d) {
        for (const int64_t bytes : sizes) {
            if (bytes <= 0) continue;
            const BufferId t = buffer(bytes, cat, Stream::Compute, d);
            c.allocs.push_back(t);
            c.frees.push_back(t);
        }
    }

    BufferId buffer(int64_t bytes, MemCategory c, Stream s, DType d) {
        m_prog.buffers.push_back({bytes, c, d, s});
        return BufferId(static_cast<int32_t>(m_prog.buffers.size() - 1));
    }
    OpId add(Op&& op) {
        m_prog.ops.push_back(std::move(op));
        return lastOp();
    }
    // A new op at the end of the program, filled in place: the frequent ops are written
    // where they stay (a temporary moved in is read back right after its fields were
    // written, which stalls). The reference holds until the next op is added: fill it first.
    Op& emit(OpKind kind, Phase phase, Stream stream, UnitId unit, int32_t mb) {
        // Op's constructor: the other fields take their defaults, with no zeroing of the
        // whole op first (value-initializing it, emplace_back(), would).
        return m_prog.ops.emplace_back(kind, phase, stream, unit, mb);
    }
    OpId lastOp() const { return OpId(static_cast<int32_t>(m_prog.ops.size() - 1)); }
    Op& op(OpId id) { return m_prog.ops[id.index()]; }

    const ResolvedPlan& m_plan;
    const ModelGraph& m_model;
    const StepOptions& m_opts;
    StepProgram& m_prog;
    MixTable m_mixes;
    SegmentTable m_table;
    RankGroup m_shardGroup, m_replicateGroup;
    std::vector<RankGroup> m_postForwardGroup;

    // Per-unit state across the step.
    std::vector<char> m_unsharded;         // unsharded parameters are resident
    std::vector<BufferId> m_unshardedBuf;  // their buffer
    // Over a group of one, each parameter's own storage (FSDP2 allocates them one by one):
    // unshardedBuf holds the first, these the others.
    std::vector<std::vector<BufferId>> m_unshardedRest;
    std::vector<BufferId> m_postForwardBuf;  // int reshard copy
    // Unsharded gradients per compute segment, allocated at the segment's first backward
    // (as autograd creates each parameter's .grad) and kept across no-sync micro-batches
    // until the unit's reduce-scatter frees them all.
    std::vector<BufferId> m_gradSegBuf;
    std::vector<BufferId> m_gradLateBuf;      // selective checkpointing: made before the recompute
    std::vector<BufferId> m_accumulatedGrad;  // per unit: the reduce-dtype copy (upcastsGradients)
    // Param-dtype gradients of a unit until its post-backward (upcastsGradients).
    std::vector<std::pair<int32_t, BufferId>> m_transientGrads;
    std::vector<OpId> m_lastFree;       // FSDP1 limiter: op that freed the unit's parameters
    std::vector<OpId> m_inflightFrees;  // FSDP1 limiter queue
    OpId m_prevReduce;
    BufferId m_prevRsIn;  // the last reduce-scatter's input, freed at the next copy-in
    OpId m_agStreamWait, m_stashedCopyOut;  // forward: the all-gather streams' copy-out dependency
    BufferId m_stashedAg;                   // forward: previous unit's all-gather buffer
    std::vector<OpId> m_pendingAg;          // all-gather issued, copy-out not yet
    std::vector<char> m_pendingLocal;       // world 1: unshard() called, its copy not yet made
    std::vector<BufferId> m_agBuf;          // flat all-gather output per unit in flight
    std::vector<OpId> m_reduceOps;  // all reduce-scatters/all-reduces of the last micro-batch
    std::vector<BufferId> m_shardedGrads;  // the units' sharded .grad, kept to the optimizer
    std::vector<char> m_gradReduced;       // the unit has reduced in this step (its .grad exists)
    std::vector<BufferId> m_accumulatedOutputs;  // HSDP: added to .grad, freed at backward's end
    std::vector<BufferId> m_savedBuf;            // per segment, this micro-batch
    // Selective checkpointing: the part backward frees before the recompute (savedLate).
    std::vector<BufferId> m_savedLateBuf;
    std::vector<BufferId> m_savedTemp;  // the recompute's saved activations, freed by backward
};

}  // namespace shardscope
