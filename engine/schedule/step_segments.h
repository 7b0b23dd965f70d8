// SPDX-License-Identifier: Apache-2.0
#pragma once
// The step program's compute segments (docs/architecture.md): the plan's module runs at one
// micro-batch, consecutive runs of a unit merged, with what each segment's forward, backward
// and recompute compute, move, save and hold under the unit's activation checkpointing, and
// their kernel mixes interned in the program. Internal to engine/schedule: the builder
// (step_builder.h) emits ops from them.
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/schedule/step_program.h"
#include "plans/plan/resolve.h"

namespace shardscope {

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

// The program's kernel mixes, interned: alike segments (decoder layers) share one index.
class MixTable {
public:
    explicit MixTable(std::vector<KernelMix>& mixes) : m_mixes(mixes) {}
    // Index of an equal mix of dtype `dt` in the program, or a new one; -1 for an empty mix.
    int32_t intern(const KernelMix& m, DType dt);
    // Mix `base` with `kernels` more memory-bound kernels moving `moved` bytes in all
    // (FSDP2's upcast accumulation), remembered: alike units ask for the same one every
    // micro-batch.
    int32_t withMemoryKernels(int32_t base, double moved, int64_t kernels, DType dt);
    KernelMix& at(int32_t id) { return m_mixes[static_cast<size_t>(id)]; }

private:
    struct Extended {
        int32_t base;
        double moved;
        int64_t kernels;
        int32_t mix;
    };
    std::vector<KernelMix>& m_mixes;
    std::vector<DType> m_dtypes;  // per mix
    std::vector<Extended> m_extended;
};

// A step's segments in module-run order, and each unit's among them.
struct SegmentTable {
    std::vector<Segment> segs;
    // Each unit's segments: list[start[u], start[u + 1]) (unitSegs(u)).
    std::vector<int32_t> unitSegStart, unitSegList;
    double modelFlopsPerRank = 0;  // forward and backward of every micro-batch

    std::span<const int32_t> unitSegs(int32_t u) const {
        return {unitSegList.data() + unitSegStart[static_cast<size_t>(u)],
                unitSegList.data() + unitSegStart[static_cast<size_t>(u) + 1]};
    }
};

// The ratio that takes the model's activation bytes to the unit's compute dtype:
// activations follow it, fp32 statistics and upcasts and int64 ids keep theirs
// (ScaledCost::fixedPerToken), so the model's activation dtype cancels out.
double activationScale(const ModelGraph& model, const ResolvedUnit& unit);

// The plan's segments at the options' micro-batch, their mixes interned in `mixes`.
SegmentTable buildSegments(const ResolvedPlan& plan, const StepOptions& options, MixTable& mixes);

}  // namespace shardscope
