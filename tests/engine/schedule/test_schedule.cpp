// SPDX-License-Identifier: Apache-2.0
// The step program and simulator on a synthetic model and cluster whose costs are exact,
// so FSDP2's overlap and memory behaviour can be asserted as formulas: PyTorch's
// test_fully_shard_overlap.py expects only the first all-gather exposed in forward, and
// only the first all-gather and the last reduce-scatter exposed in forward+backward;
// test_fully_shard_memory.py bounds the peaks by 3·block + non-block + sharded (forward),
// 3·block + non-block + 2·sharded (backward) and 4·sharded after the optimizer step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <tuple>

#include "engine/schedule/step_program.h"
#include "engine/search/variant.h"
#include "engine/sim/allocator_model.h"
#include "engine/sim/cost_model.h"
#include "engine/sim/simulator.h"
#include "plans/cluster/cluster.h"
#include "plans/model/model_json.h"
#include "plans/plan/resolve.h"
#include "tests/support/golden.h"

using namespace shardscope;

namespace {

constexpr int kLayers = 4;
constexpr int64_t kH = 1024;               // each block: one [kH, kH] fp32 weight = 4 MiB
constexpr double kFwdFlopsPerToken = 5e6;  // per block: 5 ms forward, 10 ms backward

// Root holds no parameters of its own; blocks are the units.
ModelGraph blocks(bool withActivations = false) {
    ModelGraph g;
    ModuleId layers = g.addModule(g.root(), "layers", "ModuleList", {"ModuleList"});
    for (int i = 0; i < kLayers; ++i) {
        ModuleId b = g.addModule(layers, std::to_string(i), "Block");
        g.addParam(b, "weight", {kH, kH}, DType::Float32);
        auto& c = g.cost(b);
        c.fwdFlops.perToken = kFwdFlopsPerToken;
        c.bwdFlops.perToken = 2 * kFwdFlopsPerToken;
        if (withActivations)
            c.savedBytes.perToken = 16 * kH;  // 16 MiB per block; its input is 4 MiB
        c.outputBytes.perToken = 4 * kH;
    }
    EXPECT_TRUE(g.finalize().ok());
    return g;
}

// 1 TFLOP/s at efficiency 1, free copies and issue, 1 GB/s links, latency-free ring.
ClusterSpec cluster(int64_t nodes = 1, int64_t perNode = 4) {
    ClusterSpec c;
    c.name = "synthetic";
    c.nodes = nodes;
    c.device.memoryBytes = int64_t{1} << 40;
    c.device.peakFlops[DType::Float32] = 1e12;
    c.device.hbmBandwidth = 1e18;
    c.node.devicesPerNode = perNode;
    c.node.intraBandwidth = 1e9;
    c.network.nicBandwidth = 1e9;
    c.host.linkBandwidth = 1e9;
    c.sim.computeEfficiency = {{1, 1.0}};
    c.sim.memoryEfficiency = 1;
    c.sim.overlapSlowdown = 0;
    c.sim.intraEfficiency = 1;
    c.sim.networkEfficiency = 1;
    c.sim.cpuIssueNs = 0;
    c.sim.protocols = {{"Simple", 0, 0, 0, 1.0}};
    return c;
}

Plan blockPlan(int64_t world = 4) {
    Plan p;
    p.meshShape = {world};
    p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
    p.wrap.classes = {"Block"};
    p.microBatchSize = 1;
    p.seqLen = 1000;
    return p;
}

struct SimRun {
    ResolvedPlan plan;
    StepProgram program;
    SimResult sim;
};

SimRun run(const ModelGraph& g, const Plan& p, const ClusterSpec& c) {
    SimRun r{resolvePlan(g, p, &c, "plan.json"), {}, {}};
    EXPECT_FALSE(r.plan.hasErrors())
        << (r.plan.problems.empty() ? "" : r.plan.problems[0].toString());
    StepOptions o{p.microBatchSize, p.seqLen, p.microBatches, c.node.devicesPerNode};
    r.program = buildStepProgram(r.plan, o);
    r.sim = simulate(r.program, c, r.plan.worldSize);
    return r;
}

int count(const StepProgram& p, OpKind k, Phase ph) {
    int n = 0;
    for (const auto& op : p.ops)
        n += op.kind == k && op.phase == ph;
    return n;
}

// Exact durations of the synthetic setup.
const double kBlockBytes = 4.0 * kH * kH;
const int64_t kAg =
    static_cast<int64_t>(kBlockBytes * 3 / 4 / 1e9 * 1e9);  // (n-1)/n · bytes / 1 GB/s, ns
const int64_t kFwd = static_cast<int64_t>(kFwdFlopsPerToken * 1000 / 1e12 * 1e9);
const int64_t kBwd = 2 * kFwd;

}  // namespace

TEST(StepProgram, Fsdp2ForwardExposesOnlyTheFirstAllGather) {
    ASSERT_GT(kFwd, kAg);  // compute hides communication
    const SimRun r = run(blocks(), blockPlan(), cluster());
    // Forward: 4 all-gathers, the root has no parameters to gather.
    EXPECT_EQ(count(r.program, OpKind::AllGather, Phase::Forward), kLayers);
    int64_t lastForwardEnd = 0, firstForwardStart = -1;
    for (size_t i = 0; i < r.program.ops.size(); ++i)
        if (r.program.ops[i].kind == OpKind::Forward) {
            lastForwardEnd = r.sim.end[i];
            if (firstForwardStart < 0) firstForwardStart = r.sim.start[i];
        }
    EXPECT_EQ(firstForwardStart, kAg);
    EXPECT_EQ(lastForwardEnd, kAg + kLayers * kFwd);  // t_AG + L·t_comp
}

TEST(StepProgram, ComputeBesideACollectiveLosesTheSmsItsCtasHold) {
    // With NCCL's model, a compute-bound op slows by share / (1 - share) over the time a
    // collective runs beside it, share = CTAs / SMs (a ring of 12 graph channels, 24 CTAs).
    // On 48 SMs that is 1 (twice as long); on 1,024, 24/1,000: the two stretches stand in
    // that ratio. The blocks' compute is 4 x (5 + 10) ms without any stretch.
    auto withSms = [](int sms) {
        ClusterSpec c = cluster();
        c.nccl = NcclSpec{};
        c.nccl->sms = sms;
        return run(blocks(), blockPlan(), c).sim.computeNs;
    };
    const double base = kLayers * (kFwd + 2.0 * kFwd);
    const double most = static_cast<double>(withSms(48)) - base;
    const double least = static_cast<double>(withSms(1024)) - base;
    ASSERT_GT(least, 0);
    const double share = 24.0 / 1024;
    EXPECT_NEAR(most / least, 1.0 / (share / (1 - share)), 0.02 * most / least);
}

TEST(StepProgram, Fsdp2StepExposesFirstAllGatherAndLastReduceScatter) {
    const SimRun r = run(blocks(), blockPlan(), cluster());
    const int64_t rs = kAg;  // same bytes and factor in fp32
    // Forward t_AG + L·fwd; the last layer's backward all-gather is issued as soon as the
    // CPU reaches backward and hides under the end of forward; L·bwd hides the rest; the last
    // reduce-scatter is exposed; the optimizer is free here.
    EXPECT_EQ(r.sim.stepNs, kAg + kLayers * kFwd + kLayers * kBwd + rs);
    EXPECT_EQ(r.sim.exposedCommNs, kAg + rs);
    EXPECT_EQ(count(r.program, OpKind::ReduceScatter, Phase::Backward), kLayers);
    // The layer fed by the model input reduces at the end of backward (root callback).
    EXPECT_EQ(r.program.ops.back().kind, OpKind::OptimizerStep);
}

TEST(StepProgram, ReshardFalseSkipsBackwardAllGathers) {
    Plan p = blockPlan();
    p.defaults.reshardAfterForward = ReshardSetting::ofBool(false);
    const SimRun r = run(blocks(), p, cluster());
    EXPECT_EQ(count(r.program, OpKind::AllGather, Phase::Backward), 0);
    EXPECT_EQ(r.sim.stepNs, kAg + kLayers * kFwd + kLayers * kBwd + kAg);
}

TEST(StepProgram, IntReshardGathersOverTheSmallerGroupInBackward) {
    Plan p = blockPlan(8);
    p.defaults.reshardAfterForward = ReshardSetting::ofInt(2);
    const SimRun r = run(blocks(), p, cluster(2, 4));
    for (const auto& op : r.program.ops)
        if (op.kind == OpKind::AllGather) {
            EXPECT_EQ(op.groupSize, op.phase == Phase::Forward ? 8 : 2) << opLabel(r.plan, op);
            EXPECT_EQ(op.groupNodes, op.phase == Phase::Forward ? 2 : 1) << opLabel(r.plan, op);
        }
    // The kept copy: ceil(1024/2) rows of 1024 fp32 per block, alive between forward and backward.
    EXPECT_EQ(r.plan.units[1].postForwardBytes, 512 * kH * 4);
}

TEST(StepProgram, HsdpAllReducesEveryUnitOnItsOwnStream) {
    Plan p = blockPlan();
    p.meshShape = {2, 2};
    const SimRun r = run(blocks(), p, cluster());
    int ar = 0;
    for (const auto& op : r.program.ops)
        if (op.kind == OpKind::AllReduce) {
            ++ar;
            EXPECT_EQ(op.stream, Stream::AllReduce);
            EXPECT_EQ(op.groupSize, 2);
            EXPECT_EQ(op.commBytes, kH * kH * 4 / 2);  // the sharded gradient
            ASSERT_EQ(op.waits.size(), 1u);
            EXPECT_EQ(r.program.ops[op.waits[0].index()].kind, OpKind::ReduceScatter);
        }
    EXPECT_EQ(ar, kLayers);
}

TEST(StepProgram, GradientAccumulationReducesOnlyOnTheLastMicroBatch) {
    Plan p = blockPlan();
    p.microBatches = 2;
    const SimRun r = run(blocks(), p, cluster());
    for (const auto& op : r.program.ops)
        if (op.kind == OpKind::ReduceScatter) {
            EXPECT_EQ(op.microBatch, 1);
        }
    EXPECT_EQ(count(r.program, OpKind::ReduceScatter, Phase::Backward), kLayers);
    EXPECT_EQ(count(r.program, OpKind::AllGather, Phase::Forward), 2 * kLayers);
    EXPECT_EQ(r.program.tokensPerRank, 2000);
}

// What accumulation holds, whatever the number of micro-batches (checked against
// FSDPMemTracker by tests/python/test_accumulation_memory_peer.py):
// - reduced every micro-batch: one sharded gradient per unit (each reduce-scatter's output
//   is added to the first and dropped), so peaks do not grow past the second micro-batch;
// - reduced on the last with bf16 parameters and an fp32 reduce: one fp32 unsharded copy per
//   unit (FSDP2's unsharded_accumulated_grad), twice the bf16 gradients' bytes.
TEST(StepProgram, GradientAccumulationHoldsOneGradientPerUnit) {
    auto peaks = [](int64_t microBatches, bool syncEvery) {
        Plan p = blockPlan();
        p.defaults.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
        p.microBatches = microBatches;
        p.syncEveryMicroBatch = syncEvery;
        const SimRun r = run(blocks(), p, cluster());
        return std::pair{r.sim.peakAllocated,
                         r.sim.atPeak[static_cast<size_t>(MemCategory::Gradients)]};
    };
    const auto every2 = peaks(2, true), every4 = peaks(4, true), every8 = peaks(8, true);
    EXPECT_EQ(every4, every2);
    EXPECT_EQ(every8, every2);
    const auto last2 = peaks(2, false), last8 = peaks(8, false);
    EXPECT_EQ(last8, last2);
    // More than every block's bf16 gradients (kH x kH, 2 bytes each, unsharded): the fp32
    // copies of those whose backward is done (3.75 blocks' worth at the peak).
    EXPECT_GT(last2.second, kLayers * kH * kH * 2);
}

// Reduced on the last with an fp32 reduce, each unit's post-backward also runs FSDP2's cast
// to the fp32 copy (first micro-batch) or its add (later ones): one memory-bound kernel per
// parameter on the compute stream.
TEST(StepProgram, GradientAccumulationPricesTheUpcastKernels) {
    auto kernels = [](bool syncEvery) {
        Plan p = blockPlan();
        p.defaults.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
        p.microBatches = 2;
        p.syncEveryMicroBatch = syncEvery;
        const SimRun r = run(blocks(), p, cluster());
        int64_t n = 0;
        for (const Op& op : r.program.ops)
            if (op.mix >= 0) n += r.program.mixes[static_cast<size_t>(op.mix)].kernels;
        return n;
    };
    EXPECT_EQ(kernels(false) - kernels(true), 2 * kLayers);  // a cast and an add per weight
}

TEST(StepProgram, Fsdp1BackwardPrefetchAndLimiter) {
    Plan p = blockPlan();
    p.api = PlanApi::Fsdp1;
    SimRun pre = run(blocks(), p, cluster());
    // limit_all_gathers: from the third forward all-gather on, the CPU blocks on a free.
    int blocked = 0;
    for (const auto& op : pre.program.ops)
        blocked += op.cpuBlocks;
    EXPECT_GT(blocked, 0);
    p.fsdp1.backwardPrefetch = "NONE";
    const SimRun none = run(blocks(), p, cluster());
    if (std::getenv("SHARDSCOPE_DEBUG")) {
        for (const SimRun* x : {static_cast<const SimRun*>(&pre), &none})
            for (size_t i = 0; i < x->program.ops.size(); ++i)
                std::printf("%s %zu %s %s %lld..%lld%s\n", x == &pre ? "PRE " : "NONE", i,
                            opKindName(x->program.ops[i].kind),
                            opLabel(x->plan, x->program.ops[i]).c_str(), (long long)x->sim.start[i],
                            (long long)x->sim.end[i],
                            x->program.ops[i].cpuBlocks ? " cpu-blocks" : "");
    }
    // Without prefetch each backward all-gather queues behind the previous unit's
    // reduce-scatter on the same communicator, after that unit's backward: both exposed.
    EXPECT_EQ(none.sim.stepNs - pre.sim.stepNs, (kLayers - 1) * 2 * kAg);
    EXPECT_GT(none.sim.exposedCommNs, pre.sim.exposedCommNs);
}

TEST(StepProgram, ActivationCheckpointingRecomputesForward) {
    Plan p = blockPlan();
    p.defaults.activationCheckpointing = AcMode::Full;
    const SimRun r = run(blocks(true), p, cluster());
    EXPECT_EQ(count(r.program, OpKind::Recompute, Phase::Backward), kLayers);
    const SimRun base = run(blocks(true), blockPlan(), cluster());
    EXPECT_EQ(r.sim.stepNs - base.sim.stepNs, kLayers * kFwd);
    EXPECT_LT(r.sim.peakAllocatedByPhase[0], base.sim.peakAllocatedByPhase[0]);
}

// A block of an attention and, after it, 4 experts: in a ModuleList they are a loop
// (ModuleRun::loopSaved), in a plain container they are not.
ModelGraph expertBlocks(bool list) {
    ModelGraph g;
    ModuleId layers = g.addModule(g.root(), "layers", "ModuleList", {"ModuleList"});
    for (int i = 0; i < 2; ++i) {
        ModuleId b = g.addModule(layers, std::to_string(i), "Block");
        ModuleId a = g.addModule(b, "attn", "Attention");
        g.addParam(a, "weight", {kH, kH}, DType::Float32);
        g.cost(a).fwdFlops.perToken = kFwdFlopsPerToken;
        g.cost(a).bwdFlops.perToken = 2 * kFwdFlopsPerToken;
        g.cost(a).savedBytes.perToken = 4 * kH;
        ModuleId e = list ? g.addModule(b, "experts", "ModuleList", {"ModuleList"})
                          : g.addModule(b, "experts", "Experts");
        for (int x = 0; x < 4; ++x) {
            ModuleId m = g.addModule(e, std::to_string(x), "Expert");
            g.addParam(m, "weight", {kH, kH}, DType::Float32);  // 4 MiB of gradient each
            g.cost(m).fwdFlops.perToken = kFwdFlopsPerToken;
            g.cost(m).bwdFlops.perToken = 2 * kFwdFlopsPerToken;
            g.cost(m).savedBytes.perToken = 8 * kH;  // 7.8 MiB per 1000 tokens each
        }
    }
    EXPECT_TRUE(g.finalize().ok());
    return g;
}

TEST(Memory, AnExpertLoopNeverHoldsAllItsRecomputedActivationsAndGradients) {
    // Full checkpointing: backward makes one expert's gradients while that expert's
    // recomputed activations are alive and the ones it has passed are freed, so at most all
    // the activations (4 x 7.8 MiB) and one expert's gradients (4 MiB) live at once, not all
    // the gradients (16 MiB) besides: 3/4 x min(31.25, 16) MiB less than the same experts
    // counted as one block of work.
    Plan p = blockPlan(1);
    p.defaults.activationCheckpointing = AcMode::Full;
    const SimRun loop = run(expertBlocks(true), p, cluster(1, 1));
    const SimRun flat = run(expertBlocks(false), p, cluster(1, 1));
    const double mib = 1 << 20;
    for (const ModuleRun& r : loop.plan.moduleRuns) {
        if (r.hasAttn) {
            EXPECT_EQ(r.loopMembers, 4);
        }
    }
    for (const ModuleRun& r : flat.plan.moduleRuns)
        EXPECT_EQ(r.loopMembers, 0);
    const int64_t less = flat.sim.peakAllocatedByPhase[1] - loop.sim.peakAllocatedByPhase[1];
    EXPECT_EQ(static_cast<double>(less), 0.75 * 16 * mib)
        << "backward peaks: " << flat.sim.peakAllocatedByPhase[1] / mib << " and "
        << loop.sim.peakAllocatedByPhase[1] / mib << " MiB";
}

TEST(Memory, PeaksWithinPyTorchsFsdp2MemoryTestBounds) {
    // fp32, Adam, block = one unit: test_fully_shard_memory.py's expectations.
    for (bool reshard : {true, false}) {
        Plan p = blockPlan();
        p.defaults.reshardAfterForward = ReshardSetting::ofBool(reshard);
        const SimRun r = run(blocks(), p, cluster());
        const int64_t block = static_cast<int64_t>(kBlockBytes);
        const int64_t sharded = kLayers * block / 4;
        const auto& pk = r.sim.peakAllocatedByPhase;
        // PyTorch's test feeds 4 tokens so activations are negligible and allows 16 MB
        // for them; here 1000 tokens make each block's output 4 MiB, and backward holds the
        // gradients of a block's output and input (2 outputs) besides the parameters.
        const int64_t activationGrads = 2 * static_cast<int64_t>(4 * kH * 1000);
        if (reshard) {
            EXPECT_LE(pk[0], 3 * block + 3 * sharded)
                << "forward: 3 blocks + sharded params + Adam states";
            EXPECT_LE(pk[1], 3 * block + 4 * sharded + activationGrads)
                << "backward: + sharded grads";
        } else {
            EXPECT_LE(pk[0], kLayers * block + block + 3 * sharded);
        }
        // After the step: parameters, gradients and two Adam states, 4·sharded; during it
        // (the optimizer phase's peak) foreach AdamW's sqrt of exp_avg_sq, one more.
        EXPECT_EQ(pk[2], 5 * sharded);
        std::printf(
            "reshard=%d: forward peak %.2f blocks, backward %.2f blocks (+ sharded state)\n",
            reshard, double(pk[0] - 3 * sharded) / block, double(pk[1] - 4 * sharded) / block);
    }
}

TEST(Allocator, RoundsPoolsAndReusesPerStream) {
    AllocatorModel a;
    const int64_t h1 = a.allocate(100, 0);  // small: 512 B from a 2 MiB segment
    EXPECT_EQ(a.reserved(), 2 << 20);
    EXPECT_EQ(a.allocated(), 512);
    const int64_t h2 = a.allocate(3 << 20, 0);  // 1-10 MiB: a 20 MiB segment
    EXPECT_EQ(a.reserved(), (2 << 20) + (20 << 20));
    a.free(h2);
    a.allocate(5 << 20, 1);  // another stream cannot reuse stream 0's cached block
    EXPECT_EQ(a.reserved(), (2 << 20) + 2 * (20 << 20));
    a.allocate(15 << 20, 0);  // reuses stream 0's free 20 MiB block
    EXPECT_EQ(a.reserved(), (2 << 20) + 2 * (20 << 20));
    a.allocate(33 << 20, 0);  // > 10 MiB: rounded to 2 MiB, own segment
    EXPECT_EQ(a.reserved(), (2 << 20) + 2 * (20 << 20) + (34 << 20));
    a.free(h1);
    AllocatorModel e(true);
    e.allocate(3 << 20, 0);
    EXPECT_EQ(e.reserved(), 4 << 20);  // expandable: 2 MiB pages
}

TEST(Allocator, ReachingTheCapacityReleasesUnusedSegmentsFirst) {
    // CUDACachingAllocator's malloc: when cudaMalloc fails it frees the cached segments
    // nothing uses (release_cached_blocks) and tries again; one stream's cache then serves
    // another's request instead of the device running out.
    AllocatorModel a;
    a.setCapacity(100 << 20);
    const int64_t x = a.allocate(40 << 20, 0), y = a.allocate(40 << 20, 0);
    const int64_t z = a.allocate(12 << 20, 0);  // > 10 MiB: a segment of its own
    a.free(x);
    a.free(z);
    EXPECT_EQ(a.reserved(), 92 << 20);
    a.allocate(50 << 20, 1);  // another stream: 92 + 50 > 100, so x's and z's go back
    EXPECT_EQ(a.reserved(), (40 << 20) + (50 << 20));
    EXPECT_EQ(a.allocated(), (40 << 20) + (50 << 20));
    // A segment still partly in use is kept: past the capacity is then a real OOM.
    a.free(y);
    const int64_t w = a.allocate(30 << 20, 0);  // y's segment, split (10 MiB stays cached)
    a.allocate(30 << 20, 1);
    EXPECT_EQ(a.reserved(), (40 << 20) + (50 << 20) + (30 << 20));
    a.free(w);
    // Without a capacity nothing is released.
    AllocatorModel u;
    const int64_t v = u.allocate(40 << 20, 0);
    u.free(v);
    u.allocate(50 << 20, 1);
    EXPECT_EQ(u.reserved(), 90 << 20);
}

TEST(Allocator, BestFitTakesTheSmallestFittingBlockThenTheOldest) {
    AllocatorModel a;
    // Three 12 MiB requests (> 10 MiB: own segments of exactly 12 MiB) and a 16 MiB one.
    const int64_t b0 = a.allocate(12 << 20, 0), b1 = a.allocate(12 << 20, 0);
    const int64_t b2 = a.allocate(16 << 20, 0);
    a.free(b2);
    a.free(b1);
    a.free(b0);
    const int64_t reserved = a.reserved();
    EXPECT_EQ(a.allocate(11 << 20, 0), b0);  // 12 MiB fits best; of the two, the older
    EXPECT_EQ(a.allocate(11 << 20, 0), b1);
    EXPECT_EQ(a.allocate(13 << 20, 0), b2);
    EXPECT_EQ(a.reserved(), reserved);
}

// The allocator model's rules written plainly (a linear scan for the best fit, no free
// lists), to check its sorted free lists and in-place key moves against.
struct ReferenceAllocator {
    struct Block {
        int64_t size, offset;
        int32_t segment, prev, next;
        bool free, small;
        int stream;
    };
    std::vector<Block> blocks;
    int64_t reserved = 0;
    int32_t segments = 0;
    int32_t allocate(int64_t bytes, int stream) {
        const int64_t size = AllocatorModel::roundSize(bytes);
        const bool small = size <= (1 << 20);
        int32_t best = -1;
        for (size_t i = 0; i < blocks.size(); ++i) {
            const Block& x = blocks[i];
            if (x.free && x.small == small && x.stream == stream && x.size >= size &&
                (best < 0 || x.size < blocks[static_cast<size_t>(best)].size))
                best = static_cast<int32_t>(i);
        }
        if (best < 0) {
            const int64_t seg = small ? 2 << 20
                                : size < (10 << 20)
                                    ? 20 << 20
                                    : (size + (2 << 20) - 1) / (2 << 20) * (2 << 20);
            reserved += seg;
            blocks.push_back({seg, 0, segments++, -1, -1, true, small, stream});
            best = static_cast<int32_t>(blocks.size() - 1);
        }
        const int64_t rest = blocks[static_cast<size_t>(best)].size - size;
        if (small ? rest >= 512 : rest > (1 << 20)) {
            Block r = blocks[static_cast<size_t>(best)];
            r.offset += size;
            r.size = rest;
            r.prev = best;
            blocks.push_back(r);
            const auto ri = static_cast<int32_t>(blocks.size() - 1);
            if (r.next >= 0) blocks[static_cast<size_t>(r.next)].prev = ri;
            blocks[static_cast<size_t>(best)].next = ri;
            blocks[static_cast<size_t>(best)].size = size;
        }
        blocks[static_cast<size_t>(best)].free = false;
        return best;
    }
    void free(int32_t b) {
        blocks[static_cast<size_t>(b)].free = true;
        for (int32_t nb :
             {blocks[static_cast<size_t>(b)].prev, blocks[static_cast<size_t>(b)].next}) {
            if (nb < 0 || !blocks[static_cast<size_t>(nb)].free) continue;
            auto& B = blocks[static_cast<size_t>(b)];
            auto& N = blocks[static_cast<size_t>(nb)];
            const int32_t lo = N.offset < B.offset ? nb : b, hi = lo == nb ? b : nb;
            auto& L = blocks[static_cast<size_t>(lo)];
            auto& H = blocks[static_cast<size_t>(hi)];
            L.size += H.size;
            L.next = H.next;
            if (H.next >= 0) blocks[static_cast<size_t>(H.next)].prev = lo;
            H.free = false;  // absorbed: no longer a block
            H.size = -1;
            b = lo;
        }
    }
};

TEST(Allocator, MatchesAPlainBestFitOnRandomTraffic) {
    std::mt19937 rng(7);
    for (int round = 0; round < 20; ++round) {
        AllocatorModel model;
        ReferenceAllocator ref;
        std::vector<std::pair<int64_t, int32_t>> live;  // model handle, reference handle
        for (int step = 0; step < 2000; ++step) {
            if (!live.empty() && rng() % 5 < 2) {
                const size_t k = rng() % live.size();
                model.free(live[k].first);
                ref.free(live[k].second);
                live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
            } else {
                // Sizes from the three pools, with repeats, as a step's buffers come.
                static const int64_t kSizes[] = {100,     4096,    300000,   1 << 20,
                                                 3 << 20, 5000000, 12 << 20, 50 << 20};
                // Half the rounds with hundreds of distinct sizes (pools of many groups).
                const int64_t bytes =
                    kSizes[rng() % 8] + static_cast<int64_t>(rng() % (round < 10 ? 3 : 300)) * 512;
                const int stream = static_cast<int>(rng() % 2);
                live.push_back({model.allocate(bytes, stream), ref.allocate(bytes, stream)});
                ASSERT_EQ(live.back().first, live.back().second) << "round " << round;
            }
            ASSERT_EQ(model.reserved(), ref.reserved) << "round " << round << " step " << step;
        }
    }
}

TEST(SmallVector, SpillsToTheHeapAndCopiesAndMoves) {
    SmallVector<int, 2> v;
    for (int i = 0; i < 5; ++i)
        v.push_back(i);
    ASSERT_EQ(v.size(), 5u);
    for (int i = 0; i < 5; ++i)
        EXPECT_EQ(v[static_cast<size_t>(i)], i);
    SmallVector<int, 2> copy = v;
    SmallVector<int, 2> moved = std::move(v);
    EXPECT_EQ(v.size(), 0u);  // NOLINT(bugprone-use-after-move): moved-from is empty
    ASSERT_EQ(copy.size(), 5u);
    ASSERT_EQ(moved.size(), 5u);
    EXPECT_EQ(copy.back(), 4);
    EXPECT_EQ(moved.back(), 4);
    SmallVector<int, 2> small{7};
    moved = small;
    ASSERT_EQ(moved.size(), 1u);
    EXPECT_EQ(moved[0], 7);
    copy.clear();
    EXPECT_TRUE(copy.empty());
    copy.push_back(9);
    EXPECT_EQ(copy.back(), 9);
    // One slot of 4-byte ids is narrower than the heap pointer the spilled vector keeps in it.
    SmallVector<int32_t, 1> one{1};
    one.push_back(2);
    one.push_back(3);
    SmallVector<int32_t, 1> taken = std::move(one);
    ASSERT_EQ(taken.size(), 3u);
    EXPECT_EQ(taken[0], 1);
    EXPECT_EQ(taken[2], 3);
    taken = SmallVector<int32_t, 1>{5};
    ASSERT_EQ(taken.size(), 1u);
    EXPECT_EQ(taken[0], 5);
}

TEST(StepProgram, ModuleRunsGiveTheSameProgramAsWalkingTheModules) {
    // resolvePlan caches the module runs; a plan assembled without them walks the model.
    ModelGraph g;
    ModuleId layers = g.addModule(g.root(), "layers", "ModuleList", {"ModuleList"});
    for (int i = 0; i < kLayers; ++i) {
        ModuleId b = g.addModule(layers, std::to_string(i), "Block");
        ModuleId attn = g.addModule(b, "attn", "SelfAttention");
        ModuleId mlp = g.addModule(b, "mlp", "Mlp");
        g.addParam(attn, "weight", {kH, kH}, DType::Float32);
        g.addParam(mlp, "weight", {kH, kH}, DType::Float32);
        g.cost(attn).fwdFlops = {kFwdFlopsPerToken, 3.0};
        g.cost(attn).savedBytes.perToken = 8 * kH;
        g.cost(mlp).fwdFlops.perToken = 2 * kFwdFlopsPerToken;
        g.cost(mlp).bwdFlops.perToken = 4 * kFwdFlopsPerToken;
        g.cost(mlp).savedBytes.perToken = 4 * kH;
        g.cost(b).fwdMemBytes.perToken = kH;  // the residual adds, after the children
    }
    Plan p = blockPlan(2);
    p.defaults.activationCheckpointing = AcMode::Attention;
    ResolvedPlan r = resolvePlan(g, p, nullptr);
    ASSERT_FALSE(r.moduleRuns.empty());
    const StepProgram cached = buildStepProgram(r, stepOptionsFor(p, 8));
    r.moduleRuns.clear();
    const StepProgram walked = buildStepProgram(r, stepOptionsFor(p, 8));
    ASSERT_EQ(cached.ops.size(), walked.ops.size());
    for (size_t i = 0; i < cached.ops.size(); ++i) {
        EXPECT_EQ(cached.ops[i].kind, walked.ops[i].kind) << i;
        EXPECT_EQ(cached.ops[i].flops, walked.ops[i].flops) << i;
        EXPECT_EQ(cached.ops[i].memBytes, walked.ops[i].memBytes) << i;
    }
    // Selective checkpointing recomputes the attention modules only.
    double recompute = 0;
    for (const Op& op : cached.ops)
        if (op.kind == OpKind::Recompute) recompute += op.flops;
    EXPECT_DOUBLE_EQ(recompute, kLayers * (kFwdFlopsPerToken * 1000 + 3.0 * 1000 * 1000));
    EXPECT_EQ(cached.modelFlopsPerRank, walked.modelFlopsPerRank);
}

TEST(CostModel, RingAllGatherAndProtocolChoice) {
    ClusterSpec c = cluster(2, 8);
    c.node.intraBandwidth = 400e9;
    c.network.nicBandwidth = 50e9;
    c.sim.protocols = {{"LL", 3600, 470, 2700, 0.25}, {"Simple", 8400, 3400, 9600, 1.0}};
    // Within a node, 1 GiB over 8 ranks: 7/8 · 2^30 B / 400 GB/s plus Simple's latency.
    const auto big = collectiveTime(c, OpKind::AllGather, int64_t{1} << 30, 8, 1, 8);
    EXPECT_EQ(big.protocol, 1);
    EXPECT_NEAR(static_cast<double>(big.ns), 8400 + 7 * 3400 + 7.0 / 8 * (1 << 30) / 400e9 * 1e9,
                2);
    // A small message picks LL for its latency.
    EXPECT_EQ(collectiveTime(c, OpKind::AllGather, 4096, 8, 1, 8).protocol, 0);
    // Across 2 nodes, 8 NICs per node carry the ring: min(400, 8·50) GB/s.
    const auto inter = collectiveTime(c, OpKind::ReduceScatter, int64_t{1} << 30, 16, 2, 8);
    EXPECT_NEAR(static_cast<double>(inter.ns),
                8400 + 14 * 3400 + 9600 + 15.0 / 16 * (1 << 30) / 400e9 * 1e9, 2);
    // All-reduce moves twice the data.
    const auto ar = collectiveTime(c, OpKind::AllReduce, int64_t{1} << 30, 2, 2, 1);
    EXPECT_NEAR(static_cast<double>(ar.ns), 2 * (8400 + 9600) + 1.0 * (1 << 30) / 50e9 * 1e9, 2);
}

TEST(PlanVariant, EqualsResolvingThePlanWithTheSameSettings) {
    const ModelGraph g = blocks(true);
    const ClusterSpec c = cluster(2, 4);
    const ResolvedPlan base = resolvePlan(g, blockPlan(8), &c, "plan.json");
    struct Case {
        PlanVariant v;
        UnitSettings s;
    };
    std::vector<Case> cases;
    for (auto rs : {ReshardSetting::ofBool(true), ReshardSetting::ofBool(false),
                    ReshardSetting::ofInt(2), ReshardSetting::ofInt(4)})
        for (AcMode ac : {AcMode::None, AcMode::Full}) {
            Case k;
            k.v.reshard = rs;
            k.v.ac = ac;
            k.v.paramDtype = DType::BFloat16;
            k.v.reduceDtype = DType::Float32;
            k.s.reshardAfterForward = rs;
            k.s.activationCheckpointing = ac;
            k.s.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
            cases.push_back(k);
        }
    for (const auto& k : cases) {
        ResolvedPlan fast = base;
        ASSERT_TRUE(applyVariant(fast, k.v));
        Plan p = blockPlan(8);
        p.defaults = k.s;
        p.defaults.reshardAfterForward.reset();  // the root keeps None
        p.defaults.activationCheckpointing.reset();
        for (int i = 0; i < kLayers; ++i) {
            UnitSpec u;
            u.modules = {"layers." + std::to_string(i)};
            u.settings.reshardAfterForward = k.s.reshardAfterForward;
            u.settings.activationCheckpointing = k.s.activationCheckpointing;
            p.units.push_back(u);
        }
        const ResolvedPlan slow = resolvePlan(g, p, &c, "plan.json");
        ASSERT_FALSE(slow.hasErrors());
        ASSERT_EQ(fast.units.size(), slow.units.size());
        for (size_t i = 0; i < fast.units.size(); ++i) {
            const auto &a = fast.units[i], &b = slow.units[i];
            EXPECT_EQ(a.reshard, b.reshard) << i;
            EXPECT_EQ(a.reshardK, b.reshardK) << i;
            EXPECT_EQ(a.postForwardBytes, b.postForwardBytes) << i;
            EXPECT_EQ(a.unshardedBytes, b.unshardedBytes) << i;
            EXPECT_EQ(a.allGatherDtype, b.allGatherDtype) << i;
            EXPECT_EQ(a.reduceDtype, b.reduceDtype) << i;
            EXPECT_EQ(a.activationCheckpointing, b.activationCheckpointing) << i;
        }
        StepOptions o{1, 1000, 1, 4};
        EXPECT_EQ(buildStepProgram(fast, o).dump(fast), buildStepProgram(slow, o).dump(slow));
    }
    PlanVariant bad;
    bad.reshard = ReshardSetting::ofInt(3);
    ResolvedPlan x = base;
    std::string why;
    EXPECT_FALSE(applyVariant(x, bad, &why));
    EXPECT_EQ(why, "reshard_after_forward=3 does not divide the shard size 8");
}

// The search rebuilds one program in place (its storage kept): each build must equal a
// fresh one whatever was built into it before, larger or smaller.
TEST(StepProgram, BuildingIntoAReusedProgramEqualsAFreshBuild) {
    const ModelGraph g = blocks(true);
    const ClusterSpec c = cluster(2, 4);
    ResolvedPlan r = resolvePlan(g, blockPlan(8), &c, "plan.json");
    StepProgram reused;
    int built = 0;
    for (int64_t mbs : {3, 1})
        for (auto rs : {ReshardSetting::ofBool(false), ReshardSetting::ofInt(2)})
            for (AcMode ac : {AcMode::Full, AcMode::None}) {
                PlanVariant v;
                v.reshard = rs;
                v.ac = ac;
                v.forwardPrefetchDepth = mbs == 3 ? 2 : 0;
                v.paramDtype = DType::BFloat16;
                v.reduceDtype = DType::Float32;
                ASSERT_TRUE(applyVariant(r, v));
                const StepOptions o{1, 1000, mbs, 4};
                const StepProgram fresh = buildStepProgram(r, o);
                buildStepProgram(r, o, reused);
                ++built;
                EXPECT_EQ(reused.dump(r), fresh.dump(r)) << built;
                ASSERT_EQ(reused.buffers.size(), fresh.buffers.size()) << built;
                for (size_t i = 0; i < fresh.buffers.size(); ++i)
                    EXPECT_EQ(reused.buffers[i].bytes, fresh.buffers[i].bytes) << built << " " << i;
                EXPECT_EQ(reused.mixes, fresh.mixes) << built;
                for (int k = 0; k < static_cast<int>(MemCategory::Count); ++k)
                    EXPECT_EQ(reused.persistentBytes[k], fresh.persistentBytes[k]) << built;
                EXPECT_EQ(reused.modelFlopsPerRank, fresh.modelFlopsPerRank) << built;
                EXPECT_EQ(reused.tokensPerRank, fresh.tokensPerRank) << built;
                const SimResult a = simulate(reused, c, r.worldSize),
                                b = simulate(fresh, c, r.worldSize);
                EXPECT_EQ(a.stepNs, b.stepNs) << built;
                EXPECT_EQ(a.peakReserved, b.peakReserved) << built;
            }
}

TEST(StepProgram, OffloadDropsTheDeviceGradientAfterItsCopyToTheHost) {
    // FSDP2's foreach_reduce with CPUOffloadPolicy: the reduced shard goes .to("cpu") and the
    // device copy is dropped right there ("we can free it here by not keeping a ref"); only
    // with the host as the device (a CPU cluster) does it stay until the optimizer.
    auto g = loadModelFile(test::samplePath("models/llama3-70b/config.json"));
    ASSERT_TRUE(g.ok());
    auto c = loadClusterFile(test::samplePath("clusters/h100-sxm-8x8.json"));
    ASSERT_TRUE(c.ok());
    ClusterSpec one = *c;
    one.nodes = 1;
    Plan p;
    p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
    p.wrap.classes = {"LlamaDecoderLayer"};
    p.defaults.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
    p.defaults.activationCheckpointing = AcSpec(AcMode::Full);
    p.microBatchSize = 1;
    p.seqLen = 8192;
    SimOptions so;
    so.keepTimeline = false;
    auto gradsAtPeak = [&](bool offload) {
        Plan q = p;
        if (offload) q.defaults.offload = OffloadSpec{true, true};
        const ResolvedPlan r = resolvePlan(*g, q, &one, "offload");
        EXPECT_FALSE(r.hasErrors());
        const SimResult s =
            simulate(buildStepProgram(r, stepOptionsFor(q, one)), one, r.worldSize, so);
        return s.atPeak[static_cast<size_t>(MemCategory::Gradients)];
    };
    const int64_t kept = gradsAtPeak(false), offloaded = gradsAtPeak(true);
    EXPECT_GT(kept, int64_t{30} << 30);      // 70B fp32 gradient shards of 8 ranks
    EXPECT_LT(offloaded, int64_t{4} << 30);  // about one unit's unsharded gradients
}

// Llama-3-8B, one unit per decoder layer, 1 x 8192 on the H100 sample cluster: built once
// (the plan points into its model, so the step lives where it was made).
struct Llama8bStep {
    ModelGraph g;
    ClusterSpec c;
    Plan p;
    ResolvedPlan r;
    StepProgram prog;
};
const Llama8bStep& llama8bPerBlock() {
    static const std::unique_ptr<Llama8bStep> step = [] {
        auto s = std::make_unique<Llama8bStep>();
        s->g = std::move(loadModelFile(test::samplePath("models/llama3-8b/config.json"))).value();
        s->c = std::move(loadClusterFile(test::samplePath("clusters/h100-sxm-8x8.json"))).value();
        s->p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
        s->p.wrap.classes = {"LlamaDecoderLayer"};
        s->p.microBatchSize = 1;
        s->p.seqLen = 8192;
        s->r = resolvePlan(s->g, s->p, &s->c, "kernels");
        s->prog = buildStepProgram(s->r, stepOptionsFor(s->p, s->c));
        return s;
    }();
    return *step;
}

TEST(KernelModel, DecoderLayersShareOneMixPricedKernelByKernel) {
    // Llama-3-8B, one unit per decoder layer: every layer's forward is the same kernels
    // (7 GEMMs, one SDPA, the norms' and rotary's memory-bound kernels), stored once.
    const Llama8bStep& step = llama8bPerBlock();
    ASSERT_FALSE(step.r.hasErrors());
    const ClusterSpec* c = &step.c;
    const ResolvedPlan& r = step.r;
    const StepProgram& prog = step.prog;
    std::vector<int32_t> layerFwdMixes;
    for (const Op& op : prog.ops)
        if (op.kind == OpKind::Forward &&
            r.units[op.unit.index()].name.find("layers.") != std::string::npos)
            layerFwdMixes.push_back(op.mix);
    ASSERT_EQ(layerFwdMixes.size(), 32u);
    for (int32_t m : layerFwdMixes)
        EXPECT_EQ(m, layerFwdMixes.front());
    const KernelMix& mix = prog.mixes[static_cast<size_t>(layerFwdMixes.front())];
    int64_t gemms = 0, attention = 0;
    double gemmFlops = 0;
    for (const KernelEntry& e : mix.entries) {
        if (e.kind == KernelKind::Gemm) {
            gemms += e.count;
            gemmFlops += e.count * e.perKernel;
        }
        if (e.kind == KernelKind::Attention) attention += e.count;
    }
    EXPECT_EQ(gemms, 7);
    EXPECT_EQ(attention, 1);
    // 2 * tokens * (q, k, v, o, gate, up, down) weights: 4096^2*2 + 1024*4096*2 + 3*4096*14336.
    const double weights = 2.0 * 4096 * 4096 + 2.0 * 1024 * 4096 + 3.0 * 4096 * 14336;
    EXPECT_DOUBLE_EQ(gemmFlops, 2.0 * 8192 * weights);
    // Priced kernel by kernel: the GEMMs at their own sizes' efficiency, so the mix costs
    // the sum of its entries.
    double expect = 0;
    for (const KernelEntry& e : mix.entries) {
        KernelMix one;
        one.entries = {e};
        one.kernels = e.count;
        expect += mixSeconds(*c, one, DType::Float32);
    }
    EXPECT_NEAR(mixSeconds(*c, mix, DType::Float32), expect, 1e-12);
}

TEST(KernelModel, GemmsCarryTheirShapesAndAMeasuredShapeIsPricedByIt) {
    // Llama-3-8B at 1 x 8192: a decoder layer's forward runs q, k, v, o, gate, up and down
    // at M = 8192 tokens; its backward the input and weight gradients of each, as PyTorch's
    // mm backward shapes them (tests/python/test_kernel_model.py checks the whole list
    // against PyTorch's). A cluster that lists a shape prices those GEMMs by it, and only
    // those.
    const Llama8bStep& step = llama8bPerBlock();
    ASSERT_FALSE(step.r.hasErrors());
    const ClusterSpec* c = &step.c;
    const ResolvedPlan& r = step.r;
    const StepProgram& prog = step.prog;
    const Op* fwd = nullptr;
    const Op* bwd = nullptr;
    for (const Op& op : prog.ops)
        if (r.units[op.unit.index()].name == "model.layers.3") {
            if (op.kind == OpKind::Forward) fwd = &op;
            if (op.kind == OpKind::Backward) bwd = &op;
        }
    ASSERT_TRUE(fwd && bwd);
    auto shapes = [&](const Op& op) {
        std::map<std::tuple<int64_t, int64_t, int64_t>, int32_t> m;
        for (const KernelEntry& e : prog.mixes[static_cast<size_t>(op.mix)].entries)
            if (e.kind == KernelKind::Gemm) m[{e.shape.m, e.shape.n, e.shape.k}] += e.count;
        return m;
    };
    using S = std::map<std::tuple<int64_t, int64_t, int64_t>, int32_t>;
    EXPECT_EQ(shapes(*fwd), (S{{{8192, 4096, 4096}, 2},
                               {{8192, 1024, 4096}, 2},
                               {{8192, 14336, 4096}, 2},
                               {{8192, 4096, 14336}, 1}}));
    EXPECT_EQ(shapes(*bwd), (S{{{8192, 4096, 4096}, 2},
                               {{4096, 4096, 8192}, 2},
                               {{8192, 4096, 1024}, 2},
                               {{1024, 4096, 8192}, 2},
                               {{8192, 4096, 14336}, 2},
                               {{14336, 4096, 8192}, 2},
                               {{8192, 14336, 4096}, 1},
                               {{4096, 14336, 8192}, 1}}));
    // down_proj's forward shape measured at a tenth of the curve's rate: the forward mix
    // costs that one GEMM's difference more, nothing else changes.
    const KernelMix& mix = prog.mixes[static_cast<size_t>(fwd->mix)];
    const double before = mixSeconds(*c, mix, DType::BFloat16);
    const double flops = 2.0 * 8192 * 4096 * 14336;
    ClusterSpec slow = *c;
    const double eff = c->sim.efficiencyFor(flops) / 10;
    slow.sim.gemmEfficiencyByShape = {{8192, 4096, 14336, DType::BFloat16, eff}};
    const double peak = c->device.peakFor(DType::BFloat16);
    EXPECT_NEAR(mixSeconds(slow, mix, DType::BFloat16) - before,
                flops / (peak * eff) - flops / (peak * c->sim.efficiencyFor(flops)), 1e-12);
    // Listed for another dtype: unused.
    slow.sim.gemmEfficiencyByShape[0].dtype = DType::Float32;
    EXPECT_EQ(mixSeconds(slow, mix, DType::BFloat16), before);
}

TEST(KernelModel, SlidingWindowAttentionPastTheWindowRunsMasked) {
    // Mistral-7B (window 4,096): at 8,192 tokens every layer's SDPA goes through the window
    // mask, which SDPA's kernels cannot skip half of as a causal one does (on an H200 the
    // masked layers' attention took 3.2x the causal time of the same FLOPs); at 4,095 none
    // does. Masked entries are priced by masked_attention_efficiency, half the attention
    // curve when the cluster has none.
    auto g = loadModelFile(test::samplePath("models/mistral-7b-v0.1/config.json"));
    ASSERT_TRUE(g.ok()) << g.error();
    auto c = loadClusterFile(test::samplePath("clusters/h100-sxm-8x8.json"));
    ASSERT_TRUE(c.ok());
    Plan p;
    p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
    p.wrap.classes = {"MistralDecoderLayer"};
    p.microBatchSize = 1;
    auto attention = [&](int64_t seq, ClusterSpec cl) {
        p.seqLen = seq;
        const ResolvedPlan r = resolvePlan(*g, p, &cl, "window");
        EXPECT_FALSE(r.hasErrors());
        const StepProgram prog = buildStepProgram(r, stepOptionsFor(p, cl));
        int64_t masked = 0, plain = 0;
        for (const KernelMix& m : prog.mixes)
            for (const KernelEntry& e : m.entries)
                if (e.kind == KernelKind::Attention) (e.masked ? masked : plain) += e.count;
        const auto& kt = kernelTotals(cl, prog).byKind[static_cast<int>(KernelKind::Attention)];
        return std::tuple{masked, plain, kt.deviceSeconds};
    };
    const auto [m1, p1, t1] = attention(8192, *c);
    EXPECT_GT(m1, 0);
    EXPECT_EQ(p1, 0);
    const auto [m2, p2, t2] = attention(4095, *c);
    EXPECT_EQ(m2, 0);
    EXPECT_GT(p2, 0);
    ClusterSpec withCurve = *c;
    withCurve.sim.maskedAttentionEfficiency = {{1e9, 0.2}};
    const auto [m3, p3, t3] = attention(8192, withCurve);
    EXPECT_EQ(m3, m1);
    // The same kernels at 0.2 of the peak instead of half the attention curve's value.
    const double half = 0.5 * c->sim.attentionEfficiencyFor(1e12);
    EXPECT_NEAR(t3 / t1, half / 0.2, 0.15 * half / 0.2);
}

TEST(KernelModel, FullCheckpointingsRecomputeStopsBeforeTheLastSavingGemm) {
    // torch.utils.checkpoint (non-reentrant) stops the recompute once it has remade every
    // saved tensor; a GEMM saves its inputs before it runs, so a Llama layer's down_proj
    // and a checkpointed lm_head never run again (an H200 trace shows those mm calls
    // without a kernel). A layer whose last saving op is not a GEMM (Gemma-2's
    // post-feed-forward norm, Mixtral's expert weighting) recomputes all its GEMMs; so does
    // our engine's reentrant checkpoint (recomputeEarlyStop false).
    auto c = loadClusterFile(test::samplePath("clusters/h100-sxm-8x8.json"));
    ASSERT_TRUE(c.ok());
    auto gemms = [&](const char* model, const char* layerClass, bool earlyStop,
                     bool headUnit = true) {
        auto g = loadModelFile(test::samplePath(model));
        EXPECT_TRUE(g.ok()) << g.error();
        Plan p;
        p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
        p.wrap.classes = {layerClass};
        p.microBatchSize = 1;
        p.seqLen = 2048;
        p.defaults.activationCheckpointing = AcMode::Full;
        UnitSpec head;
        head.modules = {"lm_head"};
        if (headUnit) p.units.push_back(head);
        const ResolvedPlan r = resolvePlan(*g, p, &*c, "early stop");
        EXPECT_FALSE(r.hasErrors()) << model;
        StepOptions o = stepOptionsFor(p, *c);
        o.recomputeEarlyStop = earlyStop;
        const StepProgram prog = buildStepProgram(r, o);
        struct Count {
            int64_t fwd = 0, rec = 0, ops = 0, recomputeOps = 0;
            double fwdFlops = 0, recFlops = 0;
        } n;
        n.ops = static_cast<int64_t>(prog.ops.size());
        for (const Op& op : prog.ops) {
            if (op.kind != OpKind::Forward && op.kind != OpKind::Recompute) continue;
            if (op.mix >= 0)
                for (const KernelEntry& e : prog.mixes[static_cast<size_t>(op.mix)].entries)
                    if (e.kind == KernelKind::Gemm)
                        (op.kind == OpKind::Forward ? n.fwd : n.rec) += e.count;
            if (op.kind == OpKind::Recompute) {
                n.recFlops += op.flops;
                ++n.recomputeOps;
            }
            if (op.kind == OpKind::Forward && !r.units[op.unit.index()].isRoot)
                n.fwdFlops += op.flops;
        }
        return n;
    };
    // Llama-3-8B: 32 layers of 7 GEMMs, lm_head its own unit; the root is not checkpointed.
    const auto llama = gemms("models/llama3-8b/config.json", "LlamaDecoderLayer", true);
    const auto full = gemms("models/llama3-8b/config.json", "LlamaDecoderLayer", false);
    EXPECT_EQ(full.rec, 32 * 7 + 1);
    EXPECT_EQ(llama.rec, 32 * 6);
    // The same ops either way: the lm_head unit still recomputes (nothing on the device),
    // its buffers as before; only the recompute's kernels and FLOPs differ.
    EXPECT_EQ(llama.ops, full.ops);
    EXPECT_EQ(llama.recomputeOps, full.recomputeOps);
    EXPECT_EQ(llama.recomputeOps, 33);
    EXPECT_DOUBLE_EQ(full.recFlops, full.fwdFlops);
    const double tokens = 2048, down = 2.0 * tokens * 14336 * 4096,
                 head = 2.0 * tokens * 4096 * 128256;
    EXPECT_NEAR(llama.recFlops, full.recFlops - 32 * down - head, 1e-9 * full.recFlops);
    // Mixtral: the experts' outputs are weighted (saved) after their last GEMM; only the
    // lm_head stops early.
    const auto mixtral = gemms("models/mixtral-8x7b/config.json", "MixtralDecoderLayer", true);
    const auto mixtralFull = gemms("models/mixtral-8x7b/config.json", "MixtralDecoderLayer", false);
    EXPECT_EQ(mixtral.rec, mixtralFull.rec - 1);
    // Gemma-2 ends each layer in a norm, which saves (its lm_head is tied to the
    // embedding, in the root unit).
    const auto gemma = gemms("models/gemma2-9b/config.json", "Gemma2DecoderLayer", true, false);
    const auto gemmaFull =
        gemms("models/gemma2-9b/config.json", "Gemma2DecoderLayer", false, false);
    EXPECT_GT(gemma.rec, 0);
    EXPECT_EQ(gemma.rec, gemmaFull.rec);
}

namespace {

// The tiny Llama, a unit per decoder layer, on one node of H100s: its program and cluster.
struct TinyLlamaOnH100s {
    ClusterSpec cluster;
    int64_t worldSize = 0;
    StepProgram program;
};
TinyLlamaOnH100s tinyLlamaOnH100s() {
    TinyLlamaOnH100s t;
    auto g = loadModelFile(test::samplePath("models/tiny-llama/config.json"));
    EXPECT_TRUE(g.ok());
    auto c = loadClusterFile(test::samplePath("clusters/h100-sxm-8x8.json"));
    EXPECT_TRUE(c.ok());
    if (!g.ok() || !c.ok()) return t;
    t.cluster = *c;
    t.cluster.nodes = 1;
    Plan p;
    p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
    p.wrap.classes = {"LlamaDecoderLayer"};
    p.microBatchSize = 2;
    p.seqLen = 128;
    const ResolvedPlan r = resolvePlan(*g, p, &t.cluster, "tiny");
    EXPECT_FALSE(r.hasErrors());
    t.worldSize = r.worldSize;
    t.program = buildStepProgram(r, stepOptionsFor(p, t.cluster));
    return t;
}

}  // namespace

TEST(KernelModel, LaunchCostMakesASmallModelCpuBound) {
    // The tiny Llama on a fast GPU: its kernels take microseconds, so at 20 us per launch
    // the step is the CPU's, not the device's.
    const auto [one, worldSize, prog] = tinyLlamaOnH100s();
    ASSERT_FALSE(prog.ops.empty());
    const SimResult fast = simulate(prog, one, worldSize);
    ClusterSpec launching = one;
    launching.sim.cpuLaunchNs = 20000;
    const SimResult slow = simulate(prog, launching, worldSize);
    const KernelTotals k = kernelTotals(launching, prog);
    EXPECT_GT(k.count(), 400);
    EXPECT_NEAR(k.launchSeconds, 20e-6 * static_cast<double>(k.count()), 1e-9);
    // The step now takes at least as long as launching every kernel.
    EXPECT_GE(static_cast<double>(slow.stepNs) * 1e-9, k.launchSeconds);
    EXPECT_GT(slow.stepNs, 2 * fast.stepNs);
}

TEST(KernelModel, EachThreadLaunchesAtItsOwnRate) {
    // The units' forward kernels are launched by the thread that calls the model, their
    // backward and recompute by autograd's: each at its own rate where the cluster has one,
    // the optimizer's (and any other) at cpu_launch_ns.
    const auto [one, worldSize, prog] = tinyLlamaOnH100s();
    ASSERT_FALSE(prog.ops.empty());
    std::map<OpKind, double> kernels;
    for (const Op& op : prog.ops)
        if (op.mix >= 0) kernels[op.kind] += static_cast<double>(prog.mixes[op.mix].kernels);
    ASSERT_GT(kernels[OpKind::Forward], 0);
    ASSERT_GT(kernels[OpKind::Backward], 0);
    ASSERT_GT(kernels[OpKind::OptimizerStep], 0);
    ClusterSpec rates = one;
    rates.sim.cpuLaunchNs = 5000;
    rates.sim.cpuLaunchForwardNs = 60000;
    rates.sim.cpuLaunchBackwardNs = 30000;
    const KernelTotals k = kernelTotals(rates, prog);
    EXPECT_NEAR(k.launchSeconds,
                1e-9 * (60000 * kernels[OpKind::Forward] + 30000 * kernels[OpKind::Backward] +
                        5000 * kernels[OpKind::OptimizerStep]),
                1e-9);
    // The forward cannot end before its kernels are launched at 60 us each; with the
    // backward's rate unset, backward launches at cpu_launch_ns.
    const SimResult s = simulate(prog, rates, worldSize);
    int64_t forwardEnd = 0;
    for (size_t i = 0; i < prog.ops.size(); ++i)
        if (prog.ops[i].kind == OpKind::Forward) forwardEnd = std::max(forwardEnd, s.end[i]);
    EXPECT_GE(static_cast<double>(forwardEnd), 60000 * kernels[OpKind::Forward]);
    ClusterSpec forwardOnly = rates;
    forwardOnly.sim.cpuLaunchBackwardNs = 0;
    EXPECT_NEAR(kernelTotals(forwardOnly, prog).launchSeconds,
                1e-9 * (60000 * kernels[OpKind::Forward] +
                        5000 * (kernels[OpKind::Backward] + kernels[OpKind::OptimizerStep])),
                1e-9);
}

TEST(StepProgram, ChunkCatsBlockTableHoldsTheHostOverFewRanks) {
    // FSDP2's reduce-scatter copy-in (torch._chunk_cat on CUDA) lists a block for every 2 KiB
    // of one chunk of its output on the host before it launches its kernel; a chunk is the
    // input over the reduce-scatter group. With the host otherwise free and that table the
    // slowest thing in the step, the k-th copy-in starts at k times its table: a block's
    // 4 MiB fp32 gradient is 2,048 blocks over one rank, 512 over four.
    constexpr double kNsPerBlock = 1e6;
    auto copyInStarts = [&](const Plan& p, ClusterSpec c, double nsPerBlock) {
        c.sim.chunkCatHostNsPerBlock = nsPerBlock;
        const SimRun r = run(blocks(), p, c);
        std::vector<int64_t> starts;
        for (size_t i = 0; i < r.program.ops.size(); ++i)
            if (r.program.ops[i].kind == OpKind::ReduceScatterCopyIn)
                starts.push_back(r.sim.start[i]);
        return starts;
    };
    for (const int64_t world : {int64_t{1}, int64_t{4}}) {
        SCOPED_TRACE(world);
        const auto starts = copyInStarts(blockPlan(world), cluster(1, world), kNsPerBlock);
        ASSERT_EQ(starts.size(), static_cast<size_t>(kLayers));
        const int64_t table =
            static_cast<int64_t>(kNsPerBlock) * (static_cast<int64_t>(kBlockBytes) / world / 2048);
        for (size_t k = 0; k < starts.size(); ++k)
            EXPECT_EQ(starts[k], static_cast<int64_t>(k + 1) * table);
    }
    // FSDP1 casts its flat gradient instead, and a CPU device's _chunk_cat builds no table:
    // neither waits for one.
    Plan fsdp1 = blockPlan(4);
    fsdp1.api = PlanApi::Fsdp1;
    ClusterSpec cpu = cluster();
    cpu.device.kind = "cpu";
    for (const auto& [plan, c] : {std::pair{fsdp1, cluster()}, std::pair{blockPlan(4), cpu}})
        EXPECT_EQ(copyInStarts(plan, c, kNsPerBlock), copyInStarts(plan, c, 0));
}

TEST(StepProgram, RotaryEmbeddingsRunWhereTransformersRunsThem) {
    // transformers' LlamaModel.forward: embed_tokens, then rotary_emb (registered after the
    // layers and the norm, but run before them), the layers, the norm; then lm_head and the
    // loss in LlamaForCausalLM. With embed_tokens and (norm, lm_head) as units, the root's
    // forward compute (the position embeddings) comes between the embedding and the first
    // layer, and the loss after lm_head: two root segments, none between norm and lm_head.
    auto g = loadModelFile(test::samplePath("models/tiny-llama/config.json"));
    ASSERT_TRUE(g.ok());
    Plan p;
    p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
    p.wrap.classes = {"LlamaDecoderLayer"};
    for (std::vector<std::string> mods : {std::vector<std::string>{"model.embed_tokens"},
                                          std::vector<std::string>{"model.norm", "lm_head"}}) {
        UnitSpec u;
        u.modules = std::move(mods);
        p.units.push_back(u);
    }
    p.microBatchSize = 1;
    p.seqLen = 64;
    p.meshShape = {2};
    const ResolvedPlan r = resolvePlan(*g, p, nullptr, "rotary");
    ASSERT_FALSE(r.hasErrors());
    const StepProgram prog = buildStepProgram(r, stepOptionsFor(p, 2));
    std::vector<std::string> forward;
    for (const Op& op : prog.ops)
        if (op.kind == OpKind::Forward) forward.push_back(r.units[op.unit.index()].displayName());
    const std::vector<std::string> expected = {
        "model.embed_tokens", "<root>",         "model.layers.0", "model.layers.1",
        "model.layers.2",     "model.layers.3", "model.norm",     "<root>"};
    EXPECT_EQ(forward, expected);
}

TEST(KernelModel, Float8LayersRunTheirGemmsAtTheFp8Peak) {
    // torchao converts every nn.Linear of the decoder layers (dims multiples of 16), not
    // lm_head: their GEMMs are priced at the fp8 peak, here twice the bf16 one at the same
    // efficiency, so they take half as long; lm_head's do not move. torchao's amax and cast
    // kernels join the memory-bound ones.
    auto g = loadModelFile(shardscope::test::samplePath("models/tiny-llama/config.json"));
    ASSERT_TRUE(g.ok()) << g.error();
    ClusterSpec c = cluster(1, 4);
    c.device.kind = "gpu";
    c.device.peakFlops[DType::BFloat16] = 1e15;
    c.device.peakFlops[DType::Float8E4M3] = 2e15;
    Plan p = blockPlan();
    p.wrap.classes = {"LlamaDecoderLayer"};
    p.defaults.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
    p.seqLen = 64;
    auto gemms = [&](bool f8) {
        Plan q = p;
        if (f8) q.defaults.float8 = Float8Spec{true, "tensorwise", true, true};
        const ResolvedPlan r = resolvePlan(*g, q, &c, "plan.json");
        EXPECT_FALSE(r.hasErrors());
        const StepProgram prog = buildStepProgram(r, stepOptionsFor(q, c));
        const KernelTotals t = kernelTotals(c, prog);
        int64_t float8 = 0, plain = 0;
        for (const KernelMix& m : prog.mixes)
            for (const KernelEntry& e : m.entries)
                if (e.kind == KernelKind::Gemm) (e.shape.float8 ? float8 : plain) += e.count;
        return std::tuple{t.byKind[static_cast<int>(KernelKind::Gemm)].deviceSeconds,
                          t.byKind[static_cast<int>(KernelKind::MemoryBound)].count, float8, plain};
    };
    const auto [bf16Seconds, bf16Mem, none, all] = gemms(false);
    const auto [f8Seconds, f8Mem, converted, rest] = gemms(true);
    EXPECT_EQ(none, 0);
    EXPECT_EQ(converted + rest, all);
    EXPECT_GT(converted, 0);
    EXPECT_GT(rest, 0);  // lm_head's three GEMMs
    EXPECT_LT(f8Seconds, bf16Seconds);
    EXPECT_GT(f8Seconds, 0.5 * bf16Seconds);
    EXPECT_GT(f8Mem, bf16Mem);
}
