// SPDX-License-Identifier: Apache-2.0
#include "engine/schedule/step_segments.h"

#include "engine/schedule/run_kernels.h"

#include <algorithm>
#include <array>
#include <string>

namespace shardscope {

double activationScale(const ModelGraph& model, const ResolvedUnit& unit) {
    return static_cast<double>(dtypeSize(unit.allGatherDtype)) /
           static_cast<double>(dtypeSize(model.activationDtype));
}

int32_t MixTable::intern(const KernelMix& m, DType dt) {
    if (m.entries.empty()) return -1;
    for (size_t i = 0; i < m_mixes.size(); ++i)
        if (m_dtypes[i] == dt && m_mixes[i] == m) return static_cast<int32_t>(i);
    m_mixes.push_back(m);
    m_dtypes.push_back(dt);
    return static_cast<int32_t>(m_mixes.size() - 1);
}

int32_t MixTable::withMemoryKernels(int32_t base, double moved, int64_t kernels, DType dt) {
    for (const Extended& e : m_extended)
        if (e.base == base && e.moved == moved && e.kernels == kernels) return e.mix;
    KernelMix m = m_mixes[static_cast<size_t>(base)];
    addKernels(m, KernelKind::MemoryBound, moved / static_cast<double>(kernels), kernels);
    const int32_t id = intern(m, dt);
    m_extended.push_back({base, moved, kernels, id});
    return id;
}

namespace {

class SegmentBuilder {
public:
    SegmentBuilder(const ResolvedPlan& plan, const StepOptions& options, MixTable& mixes,
                   SegmentTable& into)
        : m_plan(plan), m_model(*plan.model), m_opts(options), m_mixes(mixes), m_table(into) {}
    void build();

private:
    void addRun(const ModuleRun& run, const std::vector<ModuleRun>& runs);
    void checkpointRun(Segment& sg, const ModuleRun& run, const ResolvedUnit& unit, double fwd,
                       double saved, double scale, int64_t gradSize);
    void keepCheckpointInputs();
    void segmentKernels(Segment& sg, const std::vector<ModuleRun>& runs);

    const ResolvedPlan& m_plan;
    const ModelGraph& m_model;
    const StepOptions& m_opts;
    MixTable& m_mixes;
    SegmentTable& m_table;

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
};

// Compute segments: the plan's module runs (post-order, one unit each) at this
// micro-batch; consecutive runs of one unit merged.
void SegmentBuilder::build() {
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
    m_table.segs.reserve(runs->size());
    for (const ModuleRun& run : *runs)
        addRun(run, *runs);
    keepCheckpointInputs();
    for (auto& sg : m_table.segs) {
        m_table.modelFlopsPerRank += (sg.fwdFlops + sg.bwdFlops) * m_opts.microBatches;
        segmentKernels(sg, *runs);
    }
    // Gradients no segment accounts for (padding, modules without cost) come with the
    // unit's first backward segment.
    std::vector<int64_t> counted(m_plan.units.size(), 0);
    for (const auto& sg : m_table.segs)
        counted[sg.unit] += sg.gradBytes;
    std::vector<char> seen(m_plan.units.size(), 0);
    for (size_t i = m_table.segs.size(); i-- > 0;) {
        Segment& sg = m_table.segs[i];
        if (seen[sg.unit]) continue;
        seen[sg.unit] = 1;
        sg.gradBytes +=
            std::max<int64_t>(0, m_plan.units[sg.unit].unshardedBytes - counted[sg.unit]);
    }
    // Each unit's segments in order, as one list with an offset per unit.
    m_table.unitSegStart.assign(m_plan.units.size() + 1, 0);
    for (const auto& sg : m_table.segs)
        ++m_table.unitSegStart[static_cast<size_t>(sg.unit) + 1];
    for (size_t u = 0; u < m_plan.units.size(); ++u)
        m_table.unitSegStart[u + 1] += m_table.unitSegStart[u];
    m_table.unitSegList.resize(m_table.segs.size());
    std::vector<int32_t> next(m_table.unitSegStart.begin(), m_table.unitSegStart.end() - 1);
    for (size_t i = 0; i < m_table.segs.size(); ++i)
        m_table.unitSegList[static_cast<size_t>(next[m_table.segs[i].unit]++)] =
            static_cast<int32_t>(i);
}

// One module run into the segment of its unit (a new one when the unit changes).
void SegmentBuilder::addRun(const ModuleRun& run, const std::vector<ModuleRun>& runs) {
    const auto b = m_opts.microBatchSize;
    const auto s = m_opts.seqLen;
    const ModuleCost& c = run.cost;
    const int32_t u = run.unit;
    const auto& unit = m_plan.units[u];
    const double scale = activationScale(m_model, unit);
    const double fwd = c.fwdFlops.at(b, s), saved = c.savedBytes.at(b, s, scale);
    if (fwd == 0 && saved == 0 && c.fwdMemBytes.isZero()) return;
    if (m_table.segs.empty() || m_table.segs.back().unit != u) {
        m_table.segs.emplace_back();
        m_table.segs.back().unit = u;
    }
    Segment& sg = m_table.segs.back();
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
    sg.bwdTransient = std::max(sg.bwdTransient,
                               (c.lossCompiled ? 1.0 : 2.0) * run.peakOutputBytes.at(b, s, scale));
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
                run.largestGradOutput.at(b, s, scale) - run.largestGradSavedAfter.at(b, s, scale));
        sg.bwdGradExtra = std::max(sg.bwdGradExtra, moment - all);
    }
    checkpointRun(sg, run, unit, fwd, saved, scale, gradSize);
}

// What the unit's activation checkpointing keeps of a run, recomputes and holds then.
void SegmentBuilder::checkpointRun(Segment& sg, const ModuleRun& run, const ResolvedUnit& unit,
                                   double fwd, double saved, double scale, int64_t gradSize) {
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
void SegmentBuilder::keepCheckpointInputs() {
    const auto b = m_opts.microBatchSize;
    const auto s = m_opts.seqLen;
    for (auto& sg : m_table.segs) {
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
            const double scale = activationScale(m_model, unit);
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

void SegmentBuilder::segmentKernels(Segment& sg, const std::vector<ModuleRun>& runs) {
    const auto& unit = m_plan.units[sg.unit];
    const AcMode ac = unit.activationCheckpointing;
    const DType dt = unit.allGatherDtype;
    const double scale = activationScale(m_model, unit);
    // Alike runs, alike mixes: a segment of up to four runs (a unit's modules, each its
    // own run) is looked up by their signatures.
    std::array<int32_t, 4> sig{-1, -1, -1, -1};
    bool cacheable = sg.runCount <= static_cast<int32_t>(sig.size());
    for (int32_t i = 0; cacheable && i < sg.runCount; ++i) {
        sig[static_cast<size_t>(i)] = runs[static_cast<size_t>(sg.firstRun + i)].kernelSignature;
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
        runKernels(runs[static_cast<size_t>(sg.firstRun + i)], m_opts.microBatchSize, m_opts.seqLen,
                   scale, static_cast<double>(dtypeSize(dt)),
                   m_plan.model ? m_plan.model->slidingWindow : 0, out);
    sg.fwdMixId = m_mixes.intern(fwd, dt);
    sg.bwdMixId = m_mixes.intern(bwd, dt);
    sg.recomputeMixId = m_mixes.intern(rec, dt);
    if (cacheable)
        m_mixCache.push_back({sig,
                              ac,
                              dt,
                              scale,
                              unit.float8.fsdpFloat8AllGather,
                              {sg.fwdMixId, sg.bwdMixId, sg.recomputeMixId},
                              &unit.acSave});
}

}  // namespace

SegmentTable buildSegments(const ResolvedPlan& plan, const StepOptions& options, MixTable& mixes) {
    SegmentTable table;
    SegmentBuilder(plan, options, mixes, table).build();
    return table;
}

}  // namespace shardscope
