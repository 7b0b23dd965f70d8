// SPDX-License-Identifier: Apache-2.0
#include "engine/schedule/step_program.h"

#include "engine/schedule/run_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <span>
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
namespace {

struct Segment {
    int32_t unit = 0;
    double fwdFlops = 0, bwdFlops = 0, fwdMem = 0, bwdMem = 0, saved = 0;
    double recomputeFlops = 0, recomputeSaved = 0;  // activation checkpointing
    bool recomputes = false;  // backward recomputes (even if an early stop leaves no FLOPs)
    int32_t kernels = 0;      // modules with matmul work
    int32_t firstRun = -1, runCount = 0;                        // its module runs
    int32_t fwdMixId = -1, bwdMixId = -1, recomputeMixId = -1;  // in StepProgram::mixes
    int64_t gradBytes = 0;  // unsharded gradients its backward produces first
    // Backward's working memory beyond the gradients: the gradient of the largest module
    // output and the gradient of that module's input, alive together.
    double bwdTransient = 0;
    double bwdGradExtra = 0;  // output gradient alive above the gradients (ModuleRun)
    // A tied weight's earlier use: its new gradient and the sum with the held one
    // (ModuleRun::tiedGradNumel), for the backward's duration.
    int64_t tiedGradTemp = 0;
    double fwdTransient = 0;  // forward working memory beyond what it saves (the loss's)
    // Attention-only checkpointing, and no checkpointing of a unit with attention: what
    // backward handles before it reaches the (recomputed) attention — the saved activations
    // and gradients of the modules after it in forward (a decoder layer's MLP). Without
    // checkpointing they are freed as those gradients appear, before the attention's are
    // made: the layer's activations and all its gradients are never alive at once
    // (FSDPMemTracker: a mixture-of-experts layer's backward).
    double savedLate = 0;
    int64_t gradLateBytes = 0;
    bool lateWithoutRecompute = false;
    // Of savedLate, what a loop of alike members there (ModuleRun::loopSaved, the experts)
    // frees before the part ends (all but the last member's activations), and the loop's
    // gradients made after its first member: each member's activations go as its
    // gradients appear.
    double lateLoopFreed = 0;
    int64_t lateLoopGrads = 0;
    // Full and op-level checkpointing: the part of what the recompute saves that comes after
    // the last attention (a decoder layer's MLP). Backward uses it first, makes those
    // modules' gradients (gradLateBytes, allocated with the recompute) and frees it before it
    // makes the attention's: the recomputed layer and all its gradients are never alive at
    // once (FSDPMemTracker peaks at the post-attention norm's backward).
    double recomputeLate = 0;
};

struct Group {
    int32_t size = 1, nodes = 1, perNode = 1;
};

class Builder {
public:
    Builder(const ResolvedPlan& plan, const StepOptions& options, StepProgram& into)
        : m_plan(plan), m_model(*plan.model), m_opts(options), m_prog(into) {}

    void build() {
        m_prog.ops.clear();
        m_prog.buffers.clear();
        m_prog.mixes.clear();
        std::fill(std::begin(m_prog.persistentBytes), std::end(m_prog.persistentBytes), 0);
        m_prog.modelFlopsPerRank = 0;
        m_prog.ops.reserve(
            static_cast<size_t>(16 * m_plan.units.size() * m_opts.microBatches + 16));
        m_prog.buffers.reserve(
            static_cast<size_t>(12 * m_plan.units.size() * m_opts.microBatches + 16));
        planGroups();
        buildSegments();
        persistent();
        for (int64_t mb = 0; mb < m_opts.microBatches; ++mb) {
            const bool sync = mb + 1 == m_opts.microBatches || m_plan.plan.syncEveryMicroBatch;
            forward(static_cast<int32_t>(mb));
            backward(static_cast<int32_t>(mb), sync);
        }
        optimizer();
        m_prog.tokensPerRank = m_opts.microBatchSize * m_opts.seqLen * m_opts.microBatches;
    }

private:
    const ResolvedPlan& m_plan;
    const ModelGraph& m_model;
    const StepOptions& m_opts;
    StepProgram& m_prog;
    std::vector<Segment> m_segs;
    Group m_shardGroup, m_replicateGroup;
    std::vector<Group> m_postForwardGroup;

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
    // Each unit's segments: unitSegList[unitSegStart[u], unitSegStart[u + 1]) (unitSegs(u)).
    std::vector<int32_t> m_unitSegStart, m_unitSegList;
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

    bool fsdp1() const { return m_plan.plan.api == PlanApi::Fsdp1; }

    // Elements of a unit's all-gathered (padded) parameters: its unsharded gradients'
    // count, whatever dtype they are reduced or accumulated in.
    static int64_t unshardedElems(const ResolvedUnit& unit) {
        return unit.unshardedBytes / std::max<int64_t>(1, dtypeSize(unit.allGatherDtype));
    }

    // FSDP1's (and fairscale's) gradient divide factors over the data-parallel ranks: the
    // pre-divide doubles while it divides the size and stays below the size over it
    // (DefaultState._get_gradient_predivide_factor: 2 for 2 or 4 ranks, 4 for 8 or 16, 8 for
    // 64), the post-divide is the rest (1.5 for 6 ranks).
    std::pair<int64_t, double> flatGradientDivideFactors() const {
        const int64_t dp = m_plan.noShard
                               ? m_replicateGroup.size
                               : m_shardGroup.size * (m_plan.hsdp ? m_replicateGroup.size : 1);
        int64_t pre = 1;
        while (dp % pre == 0 && dp / pre > pre)
            pre *= 2;
        return {pre, static_cast<double>(dp) / static_cast<double>(pre)};
    }

    // FSDP2 accumulating gradients without a reduce in every micro-batch, with a reduce
    // dtype other than the parameters': each backward's gradients come in the param dtype and
    // are added at the unit's post-backward to one copy in the reduce dtype, made the first
    // time (FSDPParam.to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed),
    // which the last micro-batch reduces. Otherwise autograd accumulates in place.
    bool upcastsGradients(const ResolvedUnit& unit) const {
        return !fsdp1() && !m_plan.flatParams && m_opts.microBatches > 1 &&
               !m_plan.plan.syncEveryMicroBatch && unit.reduceDtype != unit.allGatherDtype;
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

    Group placed(int64_t size, bool contiguous) const {
        Group gr;
        gr.size = static_cast<int32_t>(size);
        const int64_t dpn = std::max<int64_t>(1, m_opts.devicesPerNode);
        if (contiguous) {
            gr.perNode = static_cast<int32_t>(std::min(size, dpn));
        } else {  // stride = shard size: ranks of one shard index on a node
            const int64_t per =
                m_plan.shardSize >= dpn ? 1 : dpn / std::max<int64_t>(1, m_plan.shardSize);
            gr.perNode = static_cast<int32_t>(std::min(size, per));
        }
        gr.nodes = static_cast<int32_t>((size + gr.perNode - 1) / gr.perNode);
        return gr;
    }

    void planGroups() {
        m_shardGroup = placed(m_plan.shardSize, true);
        m_replicateGroup =
            placed(m_plan.noShard ? m_plan.worldSize : m_plan.replicateSize, m_plan.noShard);
        for (const auto& u : m_plan.units)
            m_postForwardGroup.push_back(u.reshard == Reshard::Int ? placed(u.reshardK, true)
                                                                   : m_shardGroup);
        const size_t n = m_plan.units.size();
        m_unsharded.assign(n, 0);
        m_pendingAg.assign(n, OpId());
        m_pendingLocal.assign(n, 0);
        m_agBuf.assign(n, BufferId());
        m_unshardedBuf.assign(n, BufferId());
        m_unshardedRest.assign(n, {});
        m_postForwardBuf.assign(n, BufferId());
        m_lastFree.assign(n, OpId());
        m_gradReduced.assign(n, 0);
        m_accumulatedGrad.assign(n, BufferId());
    }

    // The ratio that takes the model's activation bytes to the unit's compute dtype:
    // activations follow it, fp32 statistics and upcasts and int64 ids keep theirs
    // (ScaledCost::fixedPerToken), so the model's activation dtype cancels out.
    double activationScale(const ResolvedUnit& unit) const {
        return static_cast<double>(dtypeSize(unit.allGatherDtype)) /
               static_cast<double>(dtypeSize(m_model.activationDtype));
    }

    // Compute segments: the plan's module runs (post-order, one unit each) at this
    // micro-batch; consecutive runs of one unit merged.
    void buildSegments() {
        std::vector<ModuleRun> computed;
        const std::vector<ModuleRun>* runs = &m_plan.moduleRuns;
        // The runs count sliding-window masks at the plan's seq_len (moduleRunsOf): another
        // sequence on the other side of the window needs them counted again.
        const int64_t w = m_model.slidingWindow;
        const bool otherSide = w > 0 && (m_opts.seqLen >= w) != (m_plan.plan.seqLen >= w);
        if (runs->empty() || otherSide) {  // or a plan not made by resolvePlan
            computed = moduleRunsOf(m_model, m_plan, m_opts.seqLen);
            runs = &computed;
        }
        m_segs.reserve(runs->size());
        for (const ModuleRun& run : *runs)
            addRun(run, *runs);
        keepCheckpointInputs();
        for (auto& sg : m_segs) {
            m_prog.modelFlopsPerRank += (sg.fwdFlops + sg.bwdFlops) * m_opts.microBatches;
            segmentKernels(sg, *runs);
        }
        // Gradients no segment accounts for (padding, modules without cost) come with the
        // unit's first backward segment.
        std::vector<int64_t> counted(m_plan.units.size(), 0);
        for (const auto& sg : m_segs)
            counted[sg.unit] += sg.gradBytes;
        std::vector<char> seen(m_plan.units.size(), 0);
        for (size_t i = m_segs.size(); i-- > 0;) {
            Segment& sg = m_segs[i];
            if (seen[sg.unit]) continue;
            seen[sg.unit] = 1;
            sg.gradBytes +=
                std::max<int64_t>(0, m_plan.units[sg.unit].unshardedBytes - counted[sg.unit]);
        }
        m_gradSegBuf.assign(m_segs.size(), BufferId());
        m_gradLateBuf.assign(m_segs.size(), BufferId());
        // Each unit's segments in order, as one list with an offset per unit.
        m_unitSegStart.assign(m_plan.units.size() + 1, 0);
        for (const auto& sg : m_segs)
            ++m_unitSegStart[static_cast<size_t>(sg.unit) + 1];
        for (size_t u = 0; u < m_plan.units.size(); ++u)
            m_unitSegStart[u + 1] += m_unitSegStart[u];
        m_unitSegList.resize(m_segs.size());
        std::vector<int32_t> next(m_unitSegStart.begin(), m_unitSegStart.end() - 1);
        for (size_t i = 0; i < m_segs.size(); ++i)
            m_unitSegList[static_cast<size_t>(next[m_segs[i].unit]++)] = static_cast<int32_t>(i);
    }

    // One module run into the segment of its unit (a new one when the unit changes).
    void addRun(const ModuleRun& run, const std::vector<ModuleRun>& runs) {
        const auto b = m_opts.microBatchSize;
        const auto s = m_opts.seqLen;
        const ModuleCost& c = run.cost;
        const int32_t u = run.unit;
        const auto& unit = m_plan.units[u];
        const double scale = activationScale(unit);
        const double fwd = c.fwdFlops.at(b, s), saved = c.savedBytes.at(b, s, scale);
        if (fwd == 0 && saved == 0 && c.fwdMemBytes.isZero()) return;
        if (m_segs.empty() || m_segs.back().unit != u) {
            m_segs.emplace_back();
            m_segs.back().unit = u;
        }
        Segment& sg = m_segs.back();
        sg.fwdFlops += fwd;
        sg.bwdFlops += c.bwdFlops.at(b, s);
        sg.fwdMem += c.fwdMemBytes.at(b, s, scale);
        sg.bwdMem += c.bwdMemBytes.at(b, s, scale);
        sg.kernels += run.kernels;
        if (sg.runCount++ == 0) sg.firstRun = static_cast<int32_t>(&run - runs.data());
        const int64_t gradSize = dtypeSize(unit.allGatherDtype);  // also the compute dtype's
        sg.gradBytes += run.gradNumel * gradSize;
        sg.tiedGradTemp += 2 * run.tiedGradNumel * gradSize;
        // A module's output gradient beside its input gradient; with the loss compiled
        // the largest output is the logits, whose gradient the loss's one backward
        // kernel writes and lm_head's backward reads (no second tensor of their size).
        sg.bwdTransient = std::max(
            sg.bwdTransient, (c.lossCompiled ? 1.0 : 2.0) * run.peakOutputBytes.at(b, s, scale));
        if (c.lossVocab > 0) {
            // ModuleCost::lossVocab: the logits in the compute dtype and their fp32
            // upcast (one tensor when the compute dtype is fp32) beside the saved fp32
            // log-probabilities.
            // Compiled, the logits are what the loss keeps (saved bytes) and nothing
            // else of their size exists.
            const auto e = static_cast<double>(gradSize);
            const double tokens = static_cast<double>(b) * static_cast<double>(s);
            if (!c.lossCompiled)
                sg.fwdTransient =
                    std::max(sg.fwdTransient, tokens * c.lossVocab * (e < 4 ? e + 4.0 : e));
            // The bytes its kernels move (lossKernelsPerLogit), as the op's memory bytes.
            const LossKernels k = lossKernelsPerLogit(e, c.lossCompiled);
            for (double b : k.fwd)
                sg.fwdMem += tokens * c.lossVocab * b;
            for (double b : k.bwd)
                sg.bwdMem += tokens * c.lossVocab * b;
        }
        {
            // A weight gradient made while its output's gradient is alive (ModuleRun):
            // the part above the run's gradients.
            // What the modules after that one saved is freed by then
            // (ModuleRun::firstGradSavedAfter).
            const auto d = static_cast<double>(gradSize);
            const double all = static_cast<double>(run.gradNumel) * d;
            const double moment = std::max(
                all + run.firstGradOutput.at(b, s, scale) - run.firstGradSavedAfter.at(b, s, scale),
                static_cast<double>(run.largestOutGradNumel) * d +
                    run.largestGradOutput.at(b, s, scale) -
                    run.largestGradSavedAfter.at(b, s, scale));
            sg.bwdGradExtra = std::max(sg.bwdGradExtra, moment - all);
        }
        checkpointRun(sg, run, unit, fwd, saved, scale, gradSize);
    }

    // What the unit's activation checkpointing keeps of a run, recomputes and holds then.
    void checkpointRun(Segment& sg, const ModuleRun& run, const ResolvedUnit& unit, double fwd,
                       double saved, double scale, int64_t gradSize) {
        const auto b = m_opts.microBatchSize;
        const auto s = m_opts.seqLen;
        const ModuleCost& c = run.cost;
        // Full and op-level checkpointing: what the recompute saves after the last
        // attention, and its gradients (Segment::recomputeLate).
        // A loop of alike members there (ModuleRun::loopSaved, a mixture-of-experts
        // block's experts) makes one member's gradients while that member's recomputed
        // activations are alive and the ones it has passed are freed: at most all the
        // activations and one member's gradients, or all the gradients and one member's
        // activations, live at once. The rest of its gradients are made after the
        // recompute is gone.
        // A unit of several modules checkpoints each on its own (our exports, per-block
        // checkpoint_wrapper): backward recomputes one module, runs its backward and
        // frees what it remade before the next, so the recompute holds the largest
        // module's, not their sum.
        const bool perModule = unit.modules.size() > 1;
        const auto addRecomputed = [&](double& into, double v) {
            into = perModule ? std::max(into, v) : into + v;
        };
        const auto splitRecompute = [&] {
            if (!run.hasAttn) return;
            addRecomputed(sg.recomputeLate, run.savedAfterAttn.at(b, s, scale));
            int64_t overlap = 0;
            if (run.loopMembers >= 2) {
                const double n = run.loopMembers;
                const double acts = run.loopSaved.at(b, s, scale);
                const auto grads = static_cast<double>(run.loopGradNumel * gradSize);
                overlap = static_cast<int64_t>((n - 1.0) / n * std::min(acts, grads));
            }
            sg.gradLateBytes += run.gradNumelAfterAttn * gradSize - overlap;
        };
        switch (unit.activationCheckpointing) {
            case AcMode::Full:
                // A run with no FLOPs (an embedding lookup) still runs again: backward
                // unpacks what it saved (the ids) through the checkpoint.
                sg.recomputes = sg.recomputes || fwd > 0 || !c.fwdMemBytes.isZero();
                sg.recomputeFlops +=
                    fwd - recomputeSkippedFlops(run, b, s, nullptr, m_opts.recomputeEarlyStop);
                addRecomputed(sg.recomputeSaved, saved);
                splitRecompute();
                break;
            case AcMode::SelectiveOp: {
                // torch.utils.checkpoint with a selective policy: forward keeps the kept
                // ops' outputs (and, below, the unit's input); backward recomputes the
                // unit and holds all it saves while its backward runs, as full does.
                const auto& save = unit.acSave;
                auto has = [&](const char* op) {
                    return std::find(save.begin(), save.end(), op) != save.end();
                };
                double kept = 0;
                if (save.empty()) {
                    kept = run.sacPresetSaved.at(b, s, scale);
                } else {
                    if (has("mm")) kept += run.mmSaved.at(b, s, scale);
                    if (has("addmm")) kept += run.addmmSaved.at(b, s, scale);
                    if (has("sdpa")) kept += run.sdpaSaved.at(b, s, scale);
                }
                sg.saved += kept;
                sg.recomputes = sg.recomputes || fwd > 0 || !c.fwdMemBytes.isZero();
                const SacKept k = sacKept(run, save);
                sg.recomputeFlops +=
                    fwd - recomputeSkippedFlops(run, b, s, &k, m_opts.recomputeEarlyStop);
                addRecomputed(sg.recomputeSaved, saved);
                splitRecompute();
                break;
            }
            case AcMode::Attention: {
                const double attnFwd =
                    run.attnFwdFlops.at(b, s) -
                    (m_opts.recomputeEarlyStop ? gemmFlops(run.attnStopGemms, b, s) : 0.0);
                const double attnSaved = run.attnSavedBytes.at(b, s, scale);
                sg.recomputes = sg.recomputes || attnFwd > 0;
                sg.recomputeFlops += attnFwd;
                sg.recomputeSaved += attnSaved;
                sg.saved += saved - attnSaved;
                const int64_t grads = run.gradNumel * gradSize;
                if (run.hasAttn) {  // only what follows the last attention comes first
                    sg.savedLate = run.savedAfterAttn.at(b, s, scale);
                    sg.gradLateBytes = run.gradNumelAfterAttn * gradSize;
                } else {
                    sg.savedLate += saved;
                    sg.gradLateBytes += grads;
                }
                break;
            }
            case AcMode::None:
                sg.saved += saved;
                // Only a mixture-of-experts layer (a loop after its attention) is split: its
                // experts' activations go as their gradients appear. A dense layer's MLP
                // keeps its activations until about all of the layer's gradients exist.
                if (run.hasAttn && run.loopMembers >= 2) {
                    const double n = run.loopMembers;
                    sg.savedLate = run.savedAfterAttn.at(b, s, scale);
                    sg.gradLateBytes = run.gradNumelAfterAttn * gradSize;
                    sg.lateWithoutRecompute = true;
                    sg.lateLoopFreed = run.loopSaved.at(b, s, scale) * (n - 1) / n;
                    sg.lateLoopGrads = static_cast<int64_t>(
                        static_cast<double>(run.loopGradNumel * gradSize) * (n - 1) / n);
                } else if (run.hasAttn) {
                    sg.savedLate = 0;
                    sg.gradLateBytes = 0;
                    sg.lateWithoutRecompute = false;
                } else if (sg.lateWithoutRecompute) {
                    sg.savedLate += saved;
                    sg.gradLateBytes += run.gradNumel * gradSize;
                }
                break;
        }
    }

    // Full checkpointing keeps the unit's input: one hidden state per token. Its recompute
    // also makes the unit's output again, which the checkpoint's backward holds until it is
    // done.
    void keepCheckpointInputs() {
        const auto b = m_opts.microBatchSize;
        const auto s = m_opts.seqLen;
        for (auto& sg : m_segs) {
            const auto& unit = m_plan.units[sg.unit];
            if ((unit.activationCheckpointing == AcMode::Full ||
                 unit.activationCheckpointing == AcMode::SelectiveOp) &&
                !unit.isRoot) {
                // Each of a unit's modules is its own checkpoint (as our exports apply it,
                // and checkpoint_wrapper per block): each keeps its input. The first's is
                // its model's input size (ModuleCost::inputBytes: an embedding's int64
                // token ids), or else a hidden state of its output's size; past the first,
                // the output of the module before it (a unit of two decoder layers keeps
                // two hidden states, norm and lm_head two).
                const double scale = activationScale(unit);
                const ModuleCost& first = m_model.module(unit.modules[0]).cost;
                double hidden = first.inputBytes.isZero() ? first.outputBytes.at(b, s, scale)
                                                          : first.inputBytes.at(b, s, scale);
                // The recompute makes a module's output again, held until its backward is
                // done: one module's at a time.
                sg.recomputeSaved += hidden;
                for (size_t k = 1; k < unit.modules.size(); ++k)
                    hidden += m_model.module(unit.modules[k - 1]).cost.outputBytes.at(b, s, scale);
                sg.saved += hidden;
            }
        }
    }
    std::span<const int32_t> unitSegs(int32_t u) const {
        return {m_unitSegList.data() + m_unitSegStart[static_cast<size_t>(u)],
                m_unitSegList.data() + m_unitSegStart[static_cast<size_t>(u) + 1]};
    }

    void persistent() {
        int64_t sharded = 0, optim = 0;
        for (const auto& u : m_plan.units) {
            // Sharded state of an offloaded unit lives on the host, which is not the device
            // memory the peak counts unless the device is the host.
            if (u.offload.enabled && !m_opts.hostIsDevice) continue;
            sharded += u.shardedBytes;
            // AdamW's exp_avg and exp_avg_sq in the parameter dtype, for parameters that
            // have gradients (the state is made at the first step that sees one).
            optim += 2 * u.trainableShardedBytes;
        }
        for (ParamId pid : m_plan.ignoredParams)
            sharded += m_model.param(pid).bytes();
        m_prog.persistentBytes[static_cast<int>(MemCategory::ShardedParams)] = sharded;
        m_prog.persistentBytes[static_cast<int>(MemCategory::OptimizerState)] = optim;
    }

    std::string name(int32_t u) const { return m_plan.units[u].displayName(); }

    // unshard(): copy-in and all-gather of unit u, unless its parameters are resident or
    // already being gathered (FSDPParamGroup.unshard).
    void unshard(int32_t u, Phase phase, int32_t mb) {
        // A unit without parameters has no parameter group and never all-gathers.
        if (m_unsharded[u] || m_pendingAg[u].valid() || m_pendingLocal[u] || m_plan.noShard ||
            m_plan.units[u].params.empty())
            return;
        const auto& unit = m_plan.units[u];
        const bool fromPostForward = phase == Phase::Backward && unit.reshard == Reshard::Int;
        const Group gr = fromPostForward ? m_postForwardGroup[u] : m_shardGroup;
        // FSDP2 over a group of one gathers nothing: unshard() only records an event, and
        // wait_for_unshard() copies each parameter into its unsharded storage on the current
        // stream (FSDPParamGroup's world_size == 1 path). Prefetching it does nothing.
        if (gr.size == 1 && !m_plan.flatParams && !unit.offload.enabled) {
            m_pendingLocal[u] = 1;
            return;
        }
        OpId h2d;
        if (unit.offload.enabled) {
            Op h{OpKind::H2D, phase, Stream::H2D, UnitId(u), mb};
            h.memBytes = static_cast<double>(unit.shardedBytes);
            h2d = add(std::move(h));
        }
        Op& ci = emit(OpKind::CopyIn, phase, Stream::CopyIn, UnitId(u), mb);
        ci.memBytes =
            2.0 * static_cast<double>(fromPostForward ? unit.postForwardBytes : unit.shardedBytes);
        // FSDP1 under a lower param dtype: the cast of its flat shard into the low-precision
        // shard the all-gather sends (_use_low_precision_shard), which reads the shard and
        // writes it in the param dtype: 6 bytes an element from fp32 to bf16, not 8.
        if (fsdp1() && !unit.params.empty()) {
            const int64_t stored = dtypeSize(m_model.param(unit.params[0]).dtype);
            const int64_t ag = dtypeSize(unit.allGatherDtype);
            if (stored != ag)
                ci.memBytes =
                    static_cast<double>(unit.shardedNumel) * static_cast<double>(stored + ag);
        }
        // FSDP1's gathered flat buffer is the unsharded parameters themselves.
        m_agBuf[u] =
            buffer(unit.unshardedBytes,
                   m_plan.flatParams ? MemCategory::UnshardedParams : MemCategory::AllGatherBuffer,
                   Stream::CopyIn, unit.allGatherDtype);
        ci.allocs.push_back(m_agBuf[u]);
        if (h2d.valid()) ci.waits.push_back(h2d);
        // FSDP1 limit_all_gathers: at most two unsharded units in flight; the CPU blocks on
        // the oldest one's free event (_limiter_utils._FreeEventQueue, limit 2).
        if (fsdp1() && m_plan.plan.fsdp1.limitAllGathers && m_inflightFrees.size() >= 2) {
            ci.waits.push_back(m_inflightFrees.front());
            ci.cpuBlocks = true;
            m_inflightFrees.erase(m_inflightFrees.begin());
        }
        const OpId ciId = lastOp();
        Op& agOp = emit(OpKind::AllGather, phase, Stream::AllGather, UnitId(u), mb);
        agOp.commBytes = unit.unshardedBytes;
        agOp.groupSize = gr.size;
        agOp.groupNodes = gr.nodes;
        agOp.ranksPerNode = gr.perNode;
        agOp.processGroup = fromPostForward && gr.size != m_shardGroup.size ? 2 : 0;
        agOp.waits.push_back(ciId);
        // In forward the all-gather streams wait on the previous group's copy-out, recorded
        // when the current group waited for its unshard; it lets the previous flat buffer go.
        if (phase == Phase::Forward && m_agStreamWait.valid()) agOp.waits.push_back(m_agStreamWait);
        m_pendingAg[u] = lastOp();
    }

    // wait_for_unshard(): the copy-out on the compute stream, when the unit is about to run.
    void waitForUnshard(int32_t u, Phase phase, int32_t mb) {
        if (m_pendingLocal[u]) {
            localCopyOut(u, phase, mb);
            return;
        }
        if (!m_pendingAg[u].valid()) return;
        if (m_plan.flatParams) {
            // FSDP1 / fairscale: the all-gather wrote the padded flat parameter itself and
            // the parameters become views of it (FlatParamHandle._use_unsharded_views): no
            // copy. The compute stream waits for the all-gather here, and the gathered
            // buffer is the unsharded parameters until the reshard frees it.
            Op co{OpKind::CopyOut, phase, Stream::Compute, UnitId(u), mb};
            co.waits.push_back(m_pendingAg[u]);
            m_unshardedBuf[u] = m_agBuf[u];
            m_agBuf[u] = BufferId();
            add(std::move(co));
            m_pendingAg[u] = OpId();
            m_unsharded[u] = 1;
            return;
        }
        const auto& unit = m_plan.units[u];
        const bool fromPostForward = phase == Phase::Backward && unit.reshard == Reshard::Int;
        Op& co = emit(OpKind::CopyOut, phase, Stream::Compute, UnitId(u), mb);
        co.memBytes = 2.0 * static_cast<double>(unit.unshardedBytes);
        co.waits.push_back(m_pendingAg[u]);
        m_unshardedBuf[u] = buffer(unit.unshardedBytes, MemCategory::UnshardedParams,
                                   Stream::Compute, unit.allGatherDtype);
        co.allocs.push_back(m_unshardedBuf[u]);
        if (phase == Phase::Forward) {
            // Release the previous group's flat buffer; keep this one until the next group.
            if (m_stashedAg.valid()) co.frees.push_back(m_stashedAg);
            m_agStreamWait = m_stashedCopyOut;
            m_stashedAg = m_agBuf[u];
        } else {
            co.frees.push_back(m_agBuf[u]);
        }
        m_agBuf[u] = BufferId();
        if (fromPostForward && m_postForwardBuf[u].valid()) {
            co.frees.push_back(m_postForwardBuf[u]);
            m_postForwardBuf[u] = BufferId();
        }
        co.freesFirst = static_cast<uint8_t>(co.frees.size());
        const OpId id = lastOp();
        if (phase == Phase::Forward) m_stashedCopyOut = id;
        m_pendingAg[u] = OpId();
        m_unsharded[u] = 1;
    }

    // FSDP2's unshard over a group of one, on the compute stream: per parameter, the shard
    // cast to the parameter dtype (all_gather_inputs; a temporary, none without a cast) and
    // copied into the unsharded storage (tensor.copy_).
    void localCopyOut(int32_t u, Phase phase, int32_t mb) {
        const auto& unit = m_plan.units[u];
        Op co{OpKind::CopyOut, phase, Stream::Compute, UnitId(u), mb};
        const int64_t agSize = dtypeSize(unit.allGatherDtype);
        int64_t cast = 0;
        for (ParamId pid : unit.params) {
            const auto& pi = m_model.param(pid);
            if (pi.dtype != unit.allGatherDtype) cast += pi.bytes() + pi.numel * agSize;
        }
        co.memBytes = static_cast<double>(cast + 2 * unit.unshardedBytes);
        if (phase == Phase::Backward && unit.reshard == Reshard::Int &&
            m_postForwardBuf[u].valid()) {
            co.frees.push_back(m_postForwardBuf[u]);
            co.freesFirst = 1;
            m_postForwardBuf[u] = BufferId();
        }
        // Per parameter: its cast (a temporary, released when the next one is made), then
        // its storage (alloc_storage).
        co.interleaved = true;
        for (ParamId pid : unit.params) {
            const auto& pi = m_model.param(pid);
            if (pi.dtype != unit.allGatherDtype) {
                const BufferId t = buffer(pi.numel * agSize, MemCategory::UnshardedParams,
                                          Stream::Compute, unit.allGatherDtype);
                co.allocs.push_back(t);
                co.frees.push_back(t);
            }
            const BufferId b = buffer(pi.numel * agSize, MemCategory::UnshardedParams,
                                      Stream::Compute, unit.allGatherDtype);
            co.allocs.push_back(b);
            if (!m_unshardedBuf[u].valid())
                m_unshardedBuf[u] = b;
            else
                m_unshardedRest[u].push_back(b);
        }
        add(std::move(co));
        m_pendingLocal[u] = 0;
        m_unsharded[u] = 1;
    }

    void unshardAndWait(int32_t u, Phase phase, int32_t mb) {
        unshard(u, phase, mb);
        waitForUnshard(u, phase, mb);
    }

    // Frees unit u's unsharded parameters as part of op `at` (a CPU-side reshard).
    void reshardAt(int32_t u, OpId at, bool keepPostForwardCopy) {
        if (!m_unsharded[u] || m_plan.noShard) return;
        op(at).frees.push_back(m_unshardedBuf[u]);
        for (BufferId b : m_unshardedRest[u])
            op(at).frees.push_back(b);
        m_unshardedRest[u].clear();
        m_unshardedBuf[u] = BufferId();
        if (keepPostForwardCopy) {
            m_postForwardBuf[u] =
                buffer(m_plan.units[u].postForwardBytes, MemCategory::UnshardedParams,
                       Stream::Compute, m_plan.units[u].allGatherDtype);
            op(at).allocs.push_back(m_postForwardBuf[u]);
        }
        m_unsharded[u] = 0;
        m_lastFree[u] = at;
        if (fsdp1()) m_inflightFrees.push_back(at);
    }

    // A segment's forward, backward or recompute, emitted (filled in place by the caller).
    Op& computeOp(OpKind kind, Phase phase, const Segment& sg, int32_t mb, double flops,
                  double mem) {
        Op& c = emit(kind, phase, Stream::Compute, UnitId(sg.unit), mb);
        c.flops = flops;
        c.memBytes = mem;
        c.computeDtype = m_plan.units[sg.unit].allGatherDtype;
        c.groupSize = std::max(1, sg.kernels);  // kernels: for the size-dependent efficiency
        c.mix = kind == OpKind::Forward    ? sg.fwdMixId
                : kind == OpKind::Backward ? sg.bwdMixId
                                           : sg.recomputeMixId;
        return c;
    }

    // The kernel mixes of a segment's forward, backward and recompute. A one-run segment
    // whose run is alike one already priced (a decoder layer) reuses its mixes.
    struct MixKey {
        std::array<int32_t, 4> signature;  // the segment's runs' (a unit of up to four modules)
        AcMode ac;
        DType dtype;
        double scale;
        bool float8Gathered;
        int32_t ids[3];
        const std::vector<std::string>* save;  // AcMode::SelectiveOp's list (the unit's)
    };
    std::vector<MixKey> m_mixCache;
    void segmentKernels(Segment& sg, const std::vector<ModuleRun>& runs) {
        const auto& unit = m_plan.units[sg.unit];
        const AcMode ac = unit.activationCheckpointing;
        const DType dt = unit.allGatherDtype;
        const double scale = activationScale(unit);
        // Alike runs, alike mixes: a segment of up to four runs (a unit's modules, each its
        // own run) is looked up by their signatures.
        std::array<int32_t, 4> sig{-1, -1, -1, -1};
        bool cacheable = sg.runCount <= static_cast<int32_t>(sig.size());
        for (int32_t i = 0; cacheable && i < sg.runCount; ++i) {
            sig[static_cast<size_t>(i)] =
                runs[static_cast<size_t>(sg.firstRun + i)].kernelSignature;
            cacheable = sig[static_cast<size_t>(i)] >= 0;
        }
        if (cacheable)
            for (const MixKey& k : m_mixCache)
                if (k.signature == sig && k.ac == ac && k.dtype == dt && k.scale == scale &&
                    k.float8Gathered == unit.float8.fsdpFloat8AllGather &&
                    (ac != AcMode::SelectiveOp || *k.save == unit.acSave)) {
                    sg.fwdMixId = k.ids[0];
                    sg.bwdMixId = k.ids[1];
                    sg.recomputeMixId = k.ids[2];
                    return;
                }
        KernelMix fwd, bwd, rec;
        const bool all = ac == AcMode::Full || ac == AcMode::SelectiveOp;
        const RunMixes out{&fwd,
                           &bwd,
                           all ? &rec : nullptr,
                           ac == AcMode::Attention ? &rec : nullptr,
                           (all || ac == AcMode::Attention) && m_opts.recomputeEarlyStop,
                           ac == AcMode::SelectiveOp ? &unit.acSave : nullptr,
                           unit.float8.fsdpFloat8AllGather};
        for (int32_t i = 0; i < sg.runCount; ++i)
            runKernels(runs[static_cast<size_t>(sg.firstRun + i)], m_opts.microBatchSize,
                       m_opts.seqLen, scale, static_cast<double>(dtypeSize(dt)),
                       m_plan.model ? m_plan.model->slidingWindow : 0, out);
        sg.fwdMixId = internMix(fwd, dt);
        sg.bwdMixId = internMix(bwd, dt);
        sg.recomputeMixId = internMix(rec, dt);
        if (cacheable)
            m_mixCache.push_back({sig,
                                  ac,
                                  dt,
                                  scale,
                                  unit.float8.fsdpFloat8AllGather,
                                  {sg.fwdMixId, sg.bwdMixId, sg.recomputeMixId},
                                  &unit.acSave});
    }

    // A mix with `kernels` more memory-bound kernels moving `moved` bytes in all (FSDP2's
    // upcast accumulation), remembered: alike units ask for the same one every micro-batch.
    struct ExtendedMix {
        int32_t base;
        double moved;
        int64_t kernels;
        int32_t mix;
    };
    std::vector<ExtendedMix> m_extendedMixes;
    // Memory-bound kernels moving `moved` bytes in all, added to compute op `c`: to its
    // kernel list where it has one, else to its bytes.
    void addMemoryKernels(Op& c, double moved, int64_t kernels) {
        if (c.mix >= 0)
            c.mix = withMemoryKernels(c.mix, moved, kernels, c.computeDtype);
        else
            c.memBytes += moved;
    }

    int32_t withMemoryKernels(int32_t base, double moved, int64_t kernels, DType dt) {
        for (const ExtendedMix& e : m_extendedMixes)
            if (e.base == base && e.moved == moved && e.kernels == kernels) return e.mix;
        KernelMix m = m_prog.mixes[static_cast<size_t>(base)];
        addKernels(m, KernelKind::MemoryBound, moved / static_cast<double>(kernels), kernels);
        const int32_t id = internMix(m, dt);
        m_extendedMixes.push_back({base, moved, kernels, id});
        return id;
    }

    // Index of an equal mix in the program (decoder layers share theirs), or a new one.
    std::vector<DType> m_mixDtype;
    int32_t internMix(const KernelMix& m, DType dt) {
        if (m.entries.empty()) return -1;
        for (size_t i = 0; i < m_prog.mixes.size(); ++i)
            if (m_mixDtype[i] == dt && m_prog.mixes[i] == m) return static_cast<int32_t>(i);
        m_prog.mixes.push_back(m);
        m_mixDtype.push_back(dt);
        return static_cast<int32_t>(m_prog.mixes.size() - 1);
    }

    std::vector<BufferId> m_savedBuf;  // per segment, this micro-batch
    // Selective checkpointing: the part backward frees before the recompute (savedLate).
    std::vector<BufferId> m_savedLateBuf;

    void forward(int32_t mb) {
        m_agStreamWait = OpId();
        m_stashedCopyOut = OpId();
        m_stashedAg = BufferId();
        m_savedBuf.assign(m_segs.size(), BufferId());
        m_savedLateBuf.assign(m_segs.size(), BufferId());
        std::vector<int32_t> lastSeg(m_plan.units.size(), -1);
        for (size_t i = 0; i < m_segs.size(); ++i)
            lastSeg[m_segs[i].unit] = static_cast<int32_t>(i);
        std::vector<char> started(m_plan.units.size(), 0);
        // The root's pre-forward runs first, before any child unit.
        unshardAndWait(0, Phase::Forward, mb);
        prefetchForward(0, mb);
        started[0] = 1;
        OpId lastCompute;
        for (size_t i = 0; i < m_segs.size(); ++i) {
            const Segment& sg = m_segs[i];
            if (!started[sg.unit]) {
                started[sg.unit] = 1;
                unshardAndWait(sg.unit, Phase::Forward, mb);
                prefetchForward(sg.unit, mb);
            }
            Op& c = computeOp(OpKind::Forward, Phase::Forward, sg, mb, sg.fwdFlops, sg.fwdMem);
            const bool late = (sg.recomputes || sg.lateWithoutRecompute) && sg.savedLate > 0;
            m_savedBuf[i] = buffer(static_cast<int64_t>(sg.saved - (late ? sg.savedLate : 0.0)),
                                   MemCategory::Activations, Stream::Compute,
                                   m_plan.units[sg.unit].allGatherDtype);
            c.allocs.push_back(m_savedBuf[i]);
            if (sg.fwdTransient > 0) {
                // The loss's logits and their fp32 upcast: two tensors.
                const int64_t all = static_cast<int64_t>(sg.fwdTransient);
                const DType dt = m_plan.units[sg.unit].allGatherDtype;
                const int64_t e = dtypeSize(dt);
                const int64_t logits = e < 4 ? all / (e + 4) * e : all;
                temporaries(c, {logits, all - logits}, MemCategory::Temporaries, dt);
            }
            m_savedLateBuf[i] = BufferId();
            if (late) {
                m_savedLateBuf[i] =
                    buffer(static_cast<int64_t>(sg.savedLate), MemCategory::Activations,
                           Stream::Compute, m_plan.units[sg.unit].allGatherDtype);
                c.allocs.push_back(m_savedLateBuf[i]);
            }
            lastCompute = lastOp();
            if (lastSeg[sg.unit] == static_cast<int32_t>(i) && sg.unit != 0) {
                const auto& u = m_plan.units[sg.unit];
                if (u.reshard != Reshard::False)
                    reshardAt(sg.unit, lastCompute, u.reshard == Reshard::Int);
            }
        }
        // Root post-forward: frees the last stashed all-gather buffer; the root reshards only
        // if asked (None makes it False).
        if (lastCompute.valid()) {
            if (m_stashedAg.valid()) op(lastCompute).frees.push_back(m_stashedAg);
            m_stashedAg = BufferId();
            if (m_plan.units[0].reshard != Reshard::False)
                reshardAt(0, lastCompute, m_plan.units[0].reshard == Reshard::Int);
        }
    }

    void prefetchForward(int32_t u, int32_t mb) {
        const auto& unit = m_plan.units[u];
        if (unit.explicitForwardPrefetch) {
            for (UnitId t : unit.forwardPrefetch)
                unshard(t.value, Phase::Forward, mb);
        } else if (fsdp1() && m_plan.plan.fsdp1.forwardPrefetch &&
                   u + 1 < static_cast<int32_t>(m_plan.units.size())) {
            unshard(u + 1, Phase::Forward, mb);
        }
    }

    void reduceUnit(int32_t u, int32_t mb, bool sync) {
        const auto& unit = m_plan.units[u];
        if (!sync) return;  // gradients stay unsharded (requires_gradient_sync(False))
        // A unit without parameters to train has no parameter group (FSDP2's fully_shard on
        // a module whose parameters are all ignored or owned by other units, a parameterless
        // root) or none with a gradient: it reduces nothing, in FSDP and in HSDP.
        if (unit.params.empty() || unit.trainableShardedBytes == 0) return;
        SmallVector<BufferId, 4> grads;
        for (int32_t i : unitSegs(u))
            for (BufferId* gb : {&m_gradSegBuf[i], &m_gradLateBuf[i]})
                if (gb->valid()) {
                    grads.push_back(*gb);
                    *gb = BufferId();
                }
        if (m_accumulatedGrad[u].valid()) {
            grads.push_back(m_accumulatedGrad[u]);
            m_accumulatedGrad[u] = BufferId();
        }
        Op& ci = emit(OpKind::ReduceScatterCopyIn, Phase::Backward, Stream::Compute, UnitId(u), mb);
        const int64_t rsIn = unshardedElems(unit) * dtypeSize(unit.reduceDtype);
        // FSDP2 copies the gradients into the reduce-scatter input (torch._chunk_cat, casting
        // on the way). A FlatParameter's gradient is already flat: FSDP1 and fairscale only
        // cast it where the reduce dtype differs from the gradient's, and copy nothing where
        // it does not.
        ci.flatGradCast = m_plan.flatParams;
        if (!m_plan.flatParams || unit.reduceDtype != unit.allGatherDtype)
            ci.memBytes = static_cast<double>(unit.unshardedBytes + rsIn);
        if (m_prevReduce.valid())
            ci.waits.push_back(m_prevReduce);  // waits on the previous reduce-scatter
        const BufferId in =
            buffer(rsIn, MemCategory::ReduceScatterBuffer, Stream::Compute, unit.reduceDtype);
        ci.allocs.push_back(in);
        // FSDP2 drops the previous reduce-scatter's input at this post-backward, once that
        // reduce-scatter is done (this copy-in waits for it), not the moment it completes,
        // and before it makes this one's (FSDPParamGroup.post_backward sets
        // comm_ctx.reduce_scatter_state to None, then calls foreach_reduce): the two are
        // never live together. The gradients go after the copy.
        if (m_prevRsIn.valid()) {
            ci.frees.push_back(m_prevRsIn);
            ci.freesFirst = 1;
        }
        for (BufferId gb : grads)
            ci.frees.push_back(gb);
        const OpId ciId = lastOp();
        Op& rs = emit(m_plan.noShard ? OpKind::AllReduce : OpKind::ReduceScatter, Phase::Backward,
                      Stream::ReduceScatter, UnitId(u), mb);
        const Group gr = m_plan.noShard ? m_replicateGroup : m_shardGroup;
        rs.commBytes = rsIn;
        rs.groupSize = gr.size;
        rs.groupNodes = gr.nodes;
        rs.ranksPerNode = gr.perNode;
        rs.processGroup = m_plan.noShard ? 1 : 0;
        // FSDP2 over a group of one copies the input to the output on the reduce-scatter
        // stream instead (foreach_reduce's world_size == 1 branch).
        if (gr.size == 1 && !m_plan.noShard && !m_plan.flatParams)
            rs.memBytes = 2.0 * static_cast<double>(rsIn);
        rs.waits.push_back(ciId);
        const BufferId sharded =
            buffer(unit.shardedBytes, MemCategory::Gradients, Stream::ReduceScatter,
                   unit.params.empty() ? DType::Float32 : m_model.param(unit.params[0]).dtype);
        rs.allocs.push_back(sharded);
        m_prevRsIn = in;
        m_prevReduce = lastOp();
        m_reduceOps.push_back(m_prevReduce);
        // A unit reduced in an earlier micro-batch of this step already has its sharded
        // .grad: this reduce-scatter's output is added to it and dropped (FSDP2's
        // foreach_reduce `grad._local_tensor += new_sharded_grad`, FSDP1's
        // `_saved_grad_shard += sharded_grad`), so the step holds one sharded gradient
        // however many micro-batches reduce.
        const bool accumulate = m_gradReduced[u] != 0;
        m_gradReduced[u] = 1;
        const bool toHost = unit.offload.enabled && !m_opts.hostIsDevice;
        if (!accumulate && !toHost) m_shardedGrads.push_back(sharded);
        if (m_plan.hsdp && !m_plan.noShard) {
            Op ar{OpKind::AllReduce, Phase::Backward, Stream::AllReduce, UnitId(u), mb};
            ar.commBytes = unit.shardedNumel * dtypeSize(unit.reduceDtype);
            ar.groupSize = m_replicateGroup.size;
            ar.groupNodes = m_replicateGroup.nodes;
            ar.ranksPerNode = m_replicateGroup.perNode;
            ar.processGroup = 1;
            ar.waits.push_back(m_prevReduce);
            m_reduceOps.push_back(add(std::move(ar)));
        }
        if (unit.offload.enabled) {
            Op d{OpKind::D2H, Phase::Backward, Stream::D2H, UnitId(u), mb};
            d.memBytes = static_cast<double>(unit.shardedBytes);
            d.waits.push_back(m_reduceOps.back());
            // CPUOffloadPolicy: the reduced shard is copied to the host's gradient and the
            // device copy dropped (foreach_reduce's non_blocking .to(cpu)); it does not stay
            // on the device until the optimizer step (unless the device is the host).
            if (toHost) d.frees.push_back(sharded);
            m_reduceOps.push_back(add(std::move(d)));
        }
        if (accumulate && !toHost) {
            // HSDP keeps the output as the all-reduce's input until the end of backward
            // (FSDPParamGroup._all_reduce_state, cleared by finalize_backward); otherwise it
            // goes as foreach_reduce returns, right after the reduce-scatter is issued.
            if (m_plan.hsdp && !m_plan.noShard)
                m_accumulatedOutputs.push_back(sharded);
            else
                op(m_prevReduce).frees.push_back(sharded);
        }
    }

    // Post-forward order: units by the end of their forward. Only parameter groups record it
    // (FSDPParamGroup.post_forward): a unit without parameters is not in it, so the unit
    // before it prefetches the one after.
    std::vector<int32_t> postForwardOrder() const {
        std::vector<int32_t> order;
        std::vector<int32_t> lastSeg(m_plan.units.size(), -1);
        for (size_t i = 0; i < m_segs.size(); ++i)
            lastSeg[m_segs[i].unit] = static_cast<int32_t>(i);
        std::vector<std::pair<int32_t, int32_t>> byEnd;
        for (size_t u = 0; u < m_plan.units.size(); ++u)
            if (lastSeg[u] >= 0 && !m_plan.units[u].params.empty())
                byEnd.push_back({lastSeg[u], static_cast<int32_t>(u)});
        std::sort(byEnd.begin(), byEnd.end());
        for (const auto& [_, u] : byEnd)
            order.push_back(u);
        return order;
    }

    // A checkpointed segment's recompute before its backward: what it saves again, and the
    // gradients made before the rest (Segment::gradLateBytes). Returns those gradients'
    // bytes; `lateTemp` is what the recompute saves after the last attention.
    int64_t recompute(size_t i, int32_t mb, bool upcast, BufferId& lateTemp) {
        const Segment& sg = m_segs[i];
        const int32_t u = sg.unit;
        int64_t lateGrads = 0;
        Op& rc = computeOp(OpKind::Recompute, Phase::Backward, sg, mb, sg.recomputeFlops, 0);
        const BufferId tmp =
            buffer(static_cast<int64_t>(sg.recomputeSaved - sg.recomputeLate),
                   MemCategory::Activations, Stream::Compute, m_plan.units[sg.unit].allGatherDtype);
        rc.allocs.push_back(tmp);
        if (sg.recomputeLate > 0) {
            lateTemp = buffer(static_cast<int64_t>(sg.recomputeLate), MemCategory::Activations,
                              Stream::Compute, m_plan.units[sg.unit].allGatherDtype);
            rc.allocs.push_back(lateTemp);
        }
        // Selective: PyTorch reaches the checkpointed attention in the middle of the
        // layer's backward; what comes after it in forward has made its gradients
        // and freed its activations by then.
        if (!m_gradLateBuf[i].valid() && sg.gradLateBytes > 0) {
            const BufferId lb = buffer(sg.gradLateBytes, MemCategory::Gradients, Stream::Compute,
                                       m_plan.units[sg.unit].allGatherDtype);
            rc.allocs.push_back(lb);
            lateGrads = sg.gradLateBytes;
            if (upcast)
                m_transientGrads.push_back({u, lb});
            else
                m_gradLateBuf[i] = lb;
        }
        if (m_savedLateBuf[i].valid()) rc.frees.push_back(m_savedLateBuf[i]);
        m_savedTemp.push_back(tmp);
        return lateGrads;
    }

    // The post-backward's own kernels, with the unit's last backward ones: the accumulating
    // copy in the reduce dtype, FSDP1's flat gradient and its divisions. Returns the
    // gradient bytes it allocates.
    int64_t postBackwardKernels(Op& c, int32_t u, bool sync, bool upcast) {
        int64_t newGrads = 0;
        // Accumulating in the reduce dtype: the unit's post-backward makes the copy that
        // every later micro-batch adds to (FSDPParam.to_accumulated_grad_if_needed, then
        // accumulate_unsharded_grad_if_needed): a cast (read the param dtype, write the
        // reduce dtype) the first time, an add (read both, write) after, one kernel per
        // parameter on the compute stream.
        if (upcast && !m_plan.units[u].params.empty()) {
            const auto& unit = m_plan.units[u];
            const int64_t agSize = dtypeSize(unit.allGatherDtype);
            const int64_t elems = unshardedElems(unit);
            const int64_t redSize = dtypeSize(unit.reduceDtype);
            const bool first = !m_accumulatedGrad[u].valid();
            if (first) {
                m_accumulatedGrad[u] = buffer(elems * redSize, MemCategory::Gradients,
                                              Stream::Compute, unit.reduceDtype);
                c.allocs.push_back(m_accumulatedGrad[u]);
                newGrads += elems * redSize;
            }
            const double moved =
                static_cast<double>(elems) *
                static_cast<double>(first ? agSize + redSize : 2 * redSize + agSize);
            addMemoryKernels(c, moved, static_cast<int64_t>(unit.params.size()));
        }
        // A FlatParameter's (FSDP1, fairscale) parameters are views of it (split, then
        // view), so autograd makes the flat gradient at the end of the unit's backward:
        // SplitWithSizesBackward's cat, one kernel reading every parameter's gradient and
        // writing the flat one (a device-to-device copy for a unit of one parameter). On
        // an H200 a Llama-8B layer's took 0.21-0.25 ms, a quarter of its post-backward's
        // copies. Where it reduces, the post-backward then divides the gradient in place
        // before and after the reduction (a sum), by factors of the data-parallel size
        // (FSDP1's _div_if_needed, fairscale's the same): each a read and a write in the
        // reduce dtype, the first of the unsharded gradient, the second of the reduced
        // shard (of the whole gradient under NO_SHARD). They run on the post-backward
        // stream; counted here, with the unit's last backward kernels.
        if (m_plan.flatParams && !m_plan.units[u].params.empty()) {
            const auto& unit = m_plan.units[u];
            const auto elems = static_cast<double>(unshardedElems(unit));
            addMemoryKernels(c, 2.0 * elems * static_cast<double>(dtypeSize(unit.allGatherDtype)),
                             1);
            const auto [pre, post] = flatGradientDivideFactors();
            const double reduced = elems * static_cast<double>(dtypeSize(unit.reduceDtype));
            if (sync && pre > 1) addMemoryKernels(c, 2.0 * reduced, 1);
            if (sync && post > 1)
                addMemoryKernels(
                    c, 2.0 * reduced / static_cast<double>(m_plan.noShard ? 1 : m_shardGroup.size),
                    1);
        }
        return newGrads;
    }

    void backward(int32_t mb, bool sync) {
        // Post-forward order: units by the end of their forward. Only parameter groups
        // record it (FSDPParamGroup.post_forward): a unit without parameters is not in it,
        // so the unit before it prefetches the one after.
        const std::vector<int32_t> order = postForwardOrder();
        std::vector<int32_t> posInOrder(m_plan.units.size(), -1);
        for (size_t i = 0; i < order.size(); ++i)
            posInOrder[order[i]] = static_cast<int32_t>(i);
        std::vector<int32_t> firstSeg(m_plan.units.size(), -1);
        for (size_t i = m_segs.size(); i-- > 0;)
            firstSeg[m_segs[i].unit] = static_cast<int32_t>(i);
        // Units fed by the model input (token ids need no gradient) and the root reduce
        // in the root's final callback at the end of backward.
        std::vector<int32_t> deferred;
        const int32_t inputUnit = m_segs.empty() ? 0 : m_segs.front().unit;
        std::vector<char> begun(m_plan.units.size(), 0);
        const auto bp = m_plan.plan.fsdp1.backwardPrefetch;
        for (size_t i = m_segs.size(); i-- > 0;) {
            const Segment& sg = m_segs[i];
            const int32_t u = sg.unit;
            const bool upcast = upcastsGradients(m_plan.units[u]);
            if (!begun[u]) {
                begun[u] = 1;
                unshardAndWait(u, Phase::Backward, mb);
                const bool pre = !fsdp1() || bp == "BACKWARD_PRE";
                if (m_plan.units[u].explicitBackwardPrefetch) {
                    for (UnitId t : m_plan.units[u].backwardPrefetch)
                        unshard(t.value, Phase::Backward, mb);
                } else if (pre && posInOrder[u] > 0 && !m_plan.units[u].params.empty()) {
                    // Implicit prefetch is the parameter group's (FSDPParamGroup.pre_backward;
                    // FSDP1 prefetches from a handle): a unit without parameters, such as a
                    // root whose modules all have units of their own, prefetches nothing, so
                    // the loss's backward runs with no parameters gathered.
                    unshard(order[posInOrder[u] - 1], Phase::Backward, mb);
                }
            }
            BufferId lateTemp;
            const int64_t lateGrads = sg.recomputes ? recompute(i, mb, upcast, lateTemp) : 0;
            Op& c = computeOp(OpKind::Backward, Phase::Backward, sg, mb, sg.bwdFlops, sg.bwdMem);
            if (lateTemp.valid()) {  // Segment::recomputeLate: gone before the rest is made
                c.frees.push_back(lateTemp);
                c.freesFirst = 1;
                lateTemp = BufferId();
            }
            int64_t newGrads = 0;
            const int64_t restGrads = sg.gradBytes - (sg.recomputes ? sg.gradLateBytes : 0);
            if (!m_gradSegBuf[i].valid() && restGrads > 0) {
                const BufferId gb = buffer(restGrads, MemCategory::Gradients, Stream::Compute,
                                           m_plan.units[u].allGatherDtype);
                c.allocs.push_back(gb);
                newGrads = restGrads;
                if (upcast)
                    m_transientGrads.push_back({u, gb});
                else
                    m_gradSegBuf[i] = gb;
            }
            // Segment::savedLate without a recompute: backward frees it as the gradients
            // after the attention appear, before the attention's are made. Held as working
            // memory for the op is what of it outlives the gradients made after it.
            int64_t lateHeld = 0;
            if (!sg.recomputes && m_savedLateBuf[i].valid()) {
                c.frees.push_back(m_savedLateBuf[i]);
                c.freesFirst = static_cast<uint8_t>(c.frees.size());
                m_savedLateBuf[i] = BufferId();
                // At the part's start (its first gradients made), at its end (its loop's
                // activations but the last member's freed), and from the attention on
                // (none of it), above the gradients and the rest of the saved activations.
                const int64_t attnGrads = newGrads > 0 ? newGrads - sg.gradLateBytes : 0;
                const auto late = static_cast<int64_t>(sg.savedLate);
                const int64_t loopGrads = newGrads > 0 ? sg.lateLoopGrads : 0;
                lateHeld =
                    std::max<int64_t>({0, late - attnGrads - loopGrads,
                                       late - static_cast<int64_t>(sg.lateLoopFreed) - attnGrads});
            }
            newGrads += lateGrads;
            const bool postBackward = firstSeg[u] == static_cast<int32_t>(i);
            if (postBackward) newGrads += postBackwardKernels(c, u, sync, upcast);
            // The activation gradients' working memory, for the op's duration. Gradients
            // allocated by the same backward mostly appear after it has shrunk, so only the
            // part above them counts (all of it in a later micro-batch, which allocates none).
            if (const auto tmp = std::max(static_cast<int64_t>(sg.bwdTransient) - newGrads,
                                          static_cast<int64_t>(sg.bwdGradExtra)) +
                                 sg.tiedGradTemp + lateHeld;
                tmp > 0)  // two tensors: the gradients of the op's output and of its input
                temporaries(c, {tmp / 2, tmp - tmp / 2}, MemCategory::Temporaries,
                            m_plan.units[u].allGatherDtype);
            c.frees.push_back(m_savedBuf[i]);
            for (BufferId t : m_savedTemp)
                c.frees.push_back(t);
            m_savedTemp.clear();
            const OpId cid = lastOp();
            // BACKWARD_POST: FSDP1 prefetches the previous unit in post-forward order only
            // if that unit's backward has not begun (_get_handle_to_prefetch checks
            // _needs_pre_backward_unshard); the root, last in that order but first to start
            // backward, finishes after the unit before it has.
            if (fsdp1() && bp == "BACKWARD_POST" && posInOrder[u] > 0 &&
                firstSeg[u] == static_cast<int32_t>(i) && !begun[order[posInOrder[u] - 1]])
                unshard(order[posInOrder[u] - 1], Phase::Backward, mb);
            if (postBackward) {
                // Post-backward of unit u. Gradients of the param dtype are added to the
                // reduce-dtype copy and dropped (accumulate_unsharded_grad_if_needed).
                std::erase_if(m_transientGrads, [&](const std::pair<int32_t, BufferId>& t) {
                    if (t.first != u) return false;
                    op(cid).frees.push_back(t.second);
                    return true;
                });
                // A unit kept unsharded after backward reshards after the last micro-batch's
                // (samples/apply_plan.py's prepare_micro_batch: set_reshard_after_backward(
                // last)), so the step ends sharded, as the next one's all-gathers assume.
                if (m_plan.units[u].reshardAfterBackward || mb + 1 == m_opts.microBatches)
                    reshardAt(u, cid, false);
                if (u == 0 || u == inputUnit)
                    deferred.push_back(u);
                else
                    reduceUnit(u, mb, sync);
            }
        }
        for (int32_t u : deferred)
            reduceUnit(u, mb, sync);
        // The root's final callback waits for the last reduce-scatter and drops its input
        // (FSDP2's finalize_backward): it goes when that reduce-scatter ends.
        if (m_prevRsIn.valid() && m_prevReduce.valid())
            op(m_prevReduce).frees.push_back(m_prevRsIn);
        m_prevRsIn = BufferId();
        for (BufferId b : m_accumulatedOutputs)
            op(m_reduceOps.back()).frees.push_back(b);
        m_accumulatedOutputs.clear();
    }
    std::vector<BufferId> m_savedTemp;

    // The bytes torch.optim.AdamW moves per byte of parameters, foreach or single-tensor
    // alike: weight decay p *= (1 - lr wd) 2, exp_avg.lerp_(g) 3, exp_avg_sq *= beta2 2,
    // exp_avg_sq.addcmul_(g, g) 3, sqrt 2, / bias correction 2, + eps 2, p.addcdiv_ 4. Each
    // foreach kernel of an H200 run moved its count at the same rate (3.7 TB/s), 41 ms a
    // step for 1.92 G parameters: seven passes (a fused kernel's) predicted a third of it.
    static constexpr double kAdamWPasses = 20.0;

    // The foreach path's kernels: kAdamWForeach (resolve.h), each op's kernels by its
    // tensor-list limit, moving its share of its bytes per byte of parameters (kAdamWPasses
    // in all). Each op runs as ceil(chunks / 320) kernels or more, so a kernel moves hundreds
    // of MB on a large shard and is priced by its size (memory_efficiency_by_bytes, or the
    // foreach curve a calibration fitted): on the H200 they moved 3.6-4.0 TB/s, where the
    // aggregate memory efficiency says 2.8.

    // The device optimizer's kernels when it takes the foreach path on a GPU; -1 otherwise
    // (the single-tensor path, a CPU device: priced by its bytes as one op).
    int32_t optimizerMix(int64_t shardedBytes) {
        if (m_opts.hostIsDevice || shardedBytes <= 0) return -1;
        bool offloaded = false;
        for (const auto& u : m_plan.units)
            offloaded = offloaded || u.offload.enabled;
        if (offloaded || (m_plan.flatParams && m_plan.plan.api != PlanApi::Fsdp1)) return -1;
        ForeachShape f = m_plan.optimizerForeach;
        if (f.tensors == 0) {  // a plan not made by resolvePlan: one fp32 tensor per unit
            std::vector<int64_t> numels;
            for (const auto& u : m_plan.units)
                if (u.trainableShardedBytes > 0) numels.push_back(u.trainableShardedBytes / 4);
            f.bytes = shardedBytes;
            for (int i = 0; i < 4; ++i)
                f.kernels[i] = foreachKernels(numels, kForeachTensorLimits[i]);
        }
        KernelMix m;
        for (const AdamWForeachOp& op : kAdamWForeach) {
            const int32_t n = f.kernels[op.limit];
            if (n > 0)
                addKernels(m, KernelKind::MemoryBound,
                           op.perByte * static_cast<double>(f.bytes) / n, n);
        }
        return internMix(m, DType::Float32);
    }

    // torch.optim.AdamW's temporaries with its defaults, on the device. It takes the foreach
    // path when every parameter is a Tensor, nn.Parameter or DTensor on a CUDA device
    // (_default_to_fused_or_foreach): exp_avg_sq's square roots for all parameters at once
    // (_multi_tensor_adam's exp_avg_sq_sqrt), one block per unit here. FSDP1's FlatParameter
    // is a plain nn.Parameter object (FlatParameter.__new__; the class only answers
    // isinstance), so FSDP1 takes it too, with or without use_orig_params: two H200 runs
    // peaked at the step exactly as FSDP2 does. Otherwise, on a CPU, with fairscale's
    // FlatParameter (a true subclass, which _default_to_fused_or_foreach refuses) or with a
    // parameter offloaded to the host, the single-tensor path: one parameter at a time,
    // exp_avg_sq.sqrt() and its quotient by the bias correction live together.
    std::vector<int64_t> optimizerTemporaries() const {
        bool offloaded = false;
        int64_t largest = 0;
        std::vector<int64_t> perUnit;
        for (const auto& u : m_plan.units) {
            if (u.offload.enabled) {
                offloaded = true;
                if (!m_opts.hostIsDevice) continue;  // its step runs in host memory
            }
            if (u.trainableShardedBytes > 0) perUnit.push_back(u.trainableShardedBytes);
            largest = std::max(largest, u.largestShardBytes);
        }
        const bool flatToOptimizer = m_plan.flatParams && m_plan.plan.api != PlanApi::Fsdp1;
        if (!m_opts.hostIsDevice && !offloaded && !flatToOptimizer) return perUnit;  // foreach
        if (largest == 0) return {};
        return {largest, largest};
    }

    void optimizer() {
        int64_t sharded = 0;
        double hostBytes = 0;
        for (const auto& u : m_plan.units) {
            if (u.offload.enabled)
                hostBytes += static_cast<double>(u.shardedBytes);
            else
                sharded += u.shardedBytes;
        }
        Op st{OpKind::OptimizerStep, Phase::Optimizer, Stream::Compute, UnitId(0),
              static_cast<int32_t>(m_opts.microBatches - 1)};
        st.memBytes = kAdamWPasses * static_cast<double>(sharded);
        st.mix = optimizerMix(sharded);
        for (const int64_t tmp : optimizerTemporaries())
            temporaries(st, {tmp}, MemCategory::OptimizerState, DType::Float32);
        for (OpId w : m_reduceOps)
            st.waits.push_back(w);
        for (BufferId b : m_shardedGrads)
            st.frees.push_back(b);  // zero_grad(set_to_none=True)
        // torchao's precompute_float8_dynamic_scale_for_fsdp after the step: the amax of every
        // float8 weight's shard (one foreach norm reading the fp32 shards) and one all-reduce
        // of the amaxes (4 bytes a weight) over the shard group.
        double amaxBytes = 0;
        int64_t weights = 0;
        for (const auto& u : m_plan.units)
            if (u.float8.precomputeScales && !u.float8Linears.empty()) {
                amaxBytes += 4.0 * static_cast<double>(u.float8WeightNumel) /
                             static_cast<double>(std::max(1, m_shardGroup.size));
                weights += static_cast<int64_t>(u.float8Linears.size());
            }
        if (weights > 0 && st.mix >= 0) {
            KernelMix& m = m_prog.mixes[static_cast<size_t>(st.mix)];
            addKernels(m, KernelKind::MemoryBound, amaxBytes, 1);
        }
        const OpId step = add(std::move(st));
        if (weights > 0 && m_shardGroup.size > 1) {
            Op ar{OpKind::AllReduce, Phase::Optimizer, Stream::AllReduce, UnitId(0),
                  static_cast<int32_t>(m_opts.microBatches - 1)};
            ar.commBytes = 4 * weights;
            ar.groupSize = m_shardGroup.size;
            ar.groupNodes = m_shardGroup.nodes;
            ar.ranksPerNode = m_shardGroup.perNode;
            ar.processGroup = 0;
            ar.waits.push_back(step);
            add(std::move(ar));
        }
        if (hostBytes > 0) {
            Op h{OpKind::OptimizerStep, Phase::Optimizer, Stream::Host, UnitId(0),
                 static_cast<int32_t>(m_opts.microBatches - 1)};
            h.memBytes = kAdamWPasses * hostBytes;
            for (OpId w : m_reduceOps)
                h.waits.push_back(w);
            add(std::move(h));
        }
    }
};

}  // namespace

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
    Builder(plan, options, p).build();
    return p;
}

void buildStepProgram(const ResolvedPlan& plan, const StepOptions& options, StepProgram& into) {
    Builder(plan, options, into).build();
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
