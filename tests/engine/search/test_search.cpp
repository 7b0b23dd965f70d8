// SPDX-License-Identifier: Apache-2.0
// Plan search: the recommendation fits, beats every plan of its space that we build and
// simulate independently here, and is never worse than the common default.
#include <gtest/gtest.h>

#include <random>

#include "engine/schedule/step_program.h"
#include "engine/search/search.h"
#include "plans/core/json_reader.h"
#include "plans/model/hf_config.h"
#include "plans/model/model_json.h"
#include "plans/plan/resolve.h"
#include "tests/support/golden.h"

using namespace shardscope;
using shardscope::test::samplePath;

namespace {

ModelGraph tinyLlama() {
    return std::move(loadModelFile(samplePath("models/tiny-llama/config.json"))).value();
}

ClusterSpec smallCluster() {
    auto c = loadClusterFile(samplePath("clusters/h100-sxm-8x8.json"));
    EXPECT_TRUE(c.ok());
    ClusterSpec x = *c;
    x.nodes = 2;
    x.node.devicesPerNode = 4;
    x.device.memoryBytes = int64_t{300 << 20};  // tight enough that memory decides
    return x;
}

int64_t simulateStep(const ModelGraph& g, const Plan& p, const ClusterSpec& c, int64_t* reserved) {
    const ResolvedPlan r = resolvePlan(g, p, &c, "independent");
    EXPECT_FALSE(r.hasErrors()) << (r.problems.empty() ? "" : r.problems[0].toString());
    const StepProgram prog =
        buildStepProgram(r, {p.microBatchSize, p.seqLen, p.microBatches, c.node.devicesPerNode});
    SimOptions so;
    so.keepTimeline = false;
    const SimResult s = simulate(prog, c, r.worldSize, so);
    *reserved = s.peakReserved;
    return s.stepNs;
}

}  // namespace

TEST(Search, FindsBlocksOfEveryFamily) {
    for (const auto& [m, n, cls] : std::vector<std::tuple<std::string, size_t, std::string>>{
             {"llama3-8b", 32, "LlamaDecoderLayer"},
             {"gpt2", 12, "GPT2Block"},
             {"mixtral-8x7b", 32, "MixtralDecoderLayer"},
             // More experts per layer than layers: the layers are still the blocks.
             {"qwen3-30b-a3b", 48, "Qwen3MoeDecoderLayer"},
             {"qwen1.5-moe-a2.7b", 24, "Qwen2MoeDecoderLayer"},
             {"deepseek-v3", 61, "DeepseekV3DecoderLayer"}}) {
        const ModelGraph g =
            std::move(loadModelFile(samplePath("models/" + m + "/config.json"))).value();
        const auto blocks = findBlocks(g);
        ASSERT_EQ(blocks.size(), n) << m;
        EXPECT_EQ(g.module(blocks[0]).cls, cls);
    }
}

TEST(Search, BestFitsAndBeatsIndependentPlansAndTheDefault) {
    const ModelGraph g = tinyLlama();
    const ClusterSpec c = smallCluster();
    SearchOptions o;
    o.seqLen = 4096;
    o.globalBatch = 64;
    const SearchResult res = searchPlans(g, c, o);
    ASSERT_TRUE(res.best.has_value());
    EXPECT_EQ(res.evaluated, res.total);
    const Candidate& best = *res.best;
    EXPECT_TRUE(best.fits);
    EXPECT_LE(best.sim.peakReserved, res.memoryBudget);
    // The recommended plan is a complete plan: it resolves without problems and re-simulates
    // to the same figures.
    int64_t reserved = 0;
    EXPECT_EQ(simulateStep(g, best.plan, c, &reserved), best.sim.stepNs);
    EXPECT_EQ(reserved, best.sim.peakReserved);
    // Never worse than the common default when the default fits.
    if (res.baseline.fits) {
        EXPECT_LE(best.sim.stepNs, res.baseline.sim.stepNs);
    }
    // Exhaustive over a subspace, built independently of the search: every per-block 1D
    // plan (reshard x checkpointing x reduce dtype x forward and backward prefetch depth x
    // micro-batch x sync). None that fits may beat the recommendation.
    int fitting = 0, enumerated = 0;
    int64_t bestOfSubspace = INT64_MAX;
    for (int rs = 0; rs < 3; ++rs)
        for (int ac = 0; ac < 3; ++ac)
            for (DType reduce : {DType::Float32, DType::BFloat16})
                for (int fwd = 0; fwd <= 2; ++fwd)
                    for (int bwd = 0; bwd <= 2; ++bwd)
                        for (int64_t mbs : {1, 2, 4, 8})
                            for (bool sync : {false, true}) {
                                if (sync && mbs == 8) continue;
                                Plan p;
                                p.meshShape = {8};
                                p.seqLen = 4096;
                                p.defaults.mixedPrecision =
                                    MixedPrecisionSpec{DType::BFloat16, reduce, {}, true};
                                const ReshardSetting reshard =
                                    rs == 0   ? ReshardSetting::ofBool(true)
                                    : rs == 1 ? ReshardSetting::ofBool(false)
                                              : ReshardSetting::ofInt(4);
                                for (int l = 0; l < 4; ++l) {
                                    UnitSpec u;
                                    u.modules = {"model.layers." + std::to_string(l)};
                                    u.settings.reshardAfterForward = reshard;
                                    u.settings.activationCheckpointing = static_cast<AcMode>(ac);
                                    if (fwd > 0) {
                                        std::vector<std::string> f;
                                        for (int d = 1; d <= fwd && l + d < 4; ++d)
                                            f.push_back("model.layers." + std::to_string(l + d));
                                        u.forwardPrefetch = f;
                                    }
                                    if (bwd > 0) {
                                        std::vector<std::string> b;
                                        for (int d = 1; d <= bwd && l - d >= 0; ++d)
                                            b.push_back("model.layers." + std::to_string(l - d));
                                        u.backwardPrefetch = b;
                                    }
                                    p.units.push_back(u);
                                }
                                p.microBatchSize = mbs;
                                p.microBatches = 8 / mbs;
                                p.syncEveryMicroBatch = sync;
                                int64_t mem = 0;
                                const int64_t step = simulateStep(g, p, c, &mem);
                                ++enumerated;
                                if (mem <= res.memoryBudget) {
                                    ++fitting;
                                    bestOfSubspace = std::min(bestOfSubspace, step);
                                    EXPECT_GE(step, best.sim.stepNs)
                                        << "a plan of the space beats the recommendation";
                                }
                            }
    EXPECT_GT(fitting, 0);
    std::printf("subspace: %d plans enumerated, %d fit; best %.3f ms, recommendation %.3f ms\n",
                enumerated, fitting, bestOfSubspace * 1e-6, best.sim.stepNs * 1e-6);
    // The Pareto front is sorted by step time with strictly decreasing memory.
    for (size_t i = 1; i < res.pareto.size(); ++i) {
        EXPECT_GE(res.pareto[i].sim.stepNs, res.pareto[i - 1].sim.stepNs);
        EXPECT_LT(res.pareto[i].sim.peakReserved, res.pareto[i - 1].sim.peakReserved);
    }
}

TEST(Search, SaysByHowMuchTheClosestPlanMissesWhenNothingFits) {
    const ModelGraph g = tinyLlama();
    ClusterSpec c = smallCluster();
    c.device.memoryBytes = 1 << 20;  // 1 MiB: nothing fits, not even with offload
    SearchOptions o;
    o.seqLen = 512;
    const SearchResult res = searchPlans(g, c, o);
    EXPECT_FALSE(res.best.has_value());
    ASSERT_TRUE(res.closest.has_value());
    EXPECT_GT(res.closest->sim.peakReserved, res.memoryBudget);
}

TEST(Search, ExpandableSegmentsReserveWhatTheStepAllocatesInPages) {
    // With expandable segments each stream grows one segment in 2 MiB pages, so the
    // default's and the best plan's reserved bytes are their allocated high-water marks
    // rounded to pages (at most one page per stream above), never more than with the
    // default allocator.
    const ModelGraph g = tinyLlama();
    const ClusterSpec c = smallCluster();
    SearchOptions o;
    o.seqLen = 512;
    const SearchResult plain = searchPlans(g, c, o);
    o.expandableSegments = true;
    const SearchResult expandable = searchPlans(g, c, o);
    ASSERT_TRUE(plain.best && expandable.best);
    const int64_t streams = static_cast<int64_t>(Stream::Count);
    for (const SimResult* s : {&expandable.baseline.sim, &expandable.best->sim}) {
        EXPECT_GE(s->peakReserved, s->peakAllocated);
        EXPECT_LE(s->peakReserved, s->peakAllocated + streams * (int64_t{2} << 20));
    }
    EXPECT_LE(expandable.baseline.sim.peakReserved, plain.baseline.sim.peakReserved);
}

TEST(Search, CancelReturnsTheBestSoFar) {
    const ModelGraph g = tinyLlama();
    const ClusterSpec c = smallCluster();
    std::atomic<bool> cancel{false};
    SearchOptions o;
    o.seqLen = 512;
    o.cancel = &cancel;
    o.progress = [&](size_t done, size_t) {
        if (done >= 128) cancel = true;
    };
    const SearchResult res = searchPlans(g, c, o);
    EXPECT_TRUE(res.cancelled);
    EXPECT_LT(res.evaluated, res.total);
    EXPECT_TRUE(res.best.has_value() || res.closest.has_value());
}

TEST(Search, AccumulatesAsFarAsTheGlobalBatchNeeds) {
    // Issue 18's case: Llama-3-8B on 8 H100s, seq 8192, global batch 4096 (512 sequences a
    // rank). With accumulation capped at 16 steps (micro-batch >= 32 sequences) nothing fit
    // ("needs 659 GiB"); micro-batch 1 or 2 with full checkpointing does.
    const ModelGraph g =
        std::move(loadModelFile(samplePath("models/llama3-8b/config.json"))).value();
    auto c = loadClusterFile(samplePath("clusters/h100-sxm-8x8.json"));
    ASSERT_TRUE(c.ok());
    ClusterSpec one = *c;
    one.nodes = 1;
    SearchOptions o;
    o.seqLen = 8192;
    o.globalBatch = 4096;
    const SearchResult res = searchPlans(g, one, o);
    ASSERT_TRUE(res.best.has_value());
    EXPECT_LE(res.best->sim.peakReserved, res.memoryBudget);
    EXPECT_LE(res.best->plan.microBatchSize, 4);
    EXPECT_EQ(res.best->plan.microBatchSize * res.best->plan.microBatches, 512);
    // The search extrapolates long accumulations from a few micro-batches; the recommended
    // plan's own simulation (all of them) agrees with that to 0.1%.
    Plan p = res.best->plan;
    p.microBatches = 16;
    int64_t reserved4 = 0, reserved3 = 0;
    const int64_t t4 = simulateStep(g, p, one, &reserved4);
    p.microBatches = 15;
    const int64_t t3 = simulateStep(g, p, one, &reserved3);
    const double extrapolated =
        static_cast<double>(t4) +
        static_cast<double>(res.best->plan.microBatches - 16) * static_cast<double>(t4 - t3);
    EXPECT_NEAR(extrapolated, static_cast<double>(res.best->sim.stepNs),
                1e-3 * static_cast<double>(res.best->sim.stepNs));
    EXPECT_EQ(std::max(reserved4, reserved3), res.best->sim.peakReserved);
}

// Issue 18's property: over random model / cluster / batch triples, recommend never says
// "nothing fits" while a plan of its space fits. The brute force here builds, independently
// of the search, the plans that need the least memory in that space (each block a unit,
// reshard True, full checkpointing, micro-batch 1, bf16 params / fp32 reduce, with and
// without CPU offload) and simulates every micro-batch of them: when one fits, the search
// must have found a plan, and one at least as fast.
TEST(Search, NeverSaysNothingFitsWhenTheLeanestPlansOfItsSpaceFit) {
    std::mt19937 rng(20261125);
    auto pick = [&](std::initializer_list<int64_t> v) {
        std::uniform_int_distribution<size_t> d(0, v.size() - 1);
        return *(v.begin() + static_cast<long>(d(rng)));
    };
    auto base = loadClusterFile(samplePath("clusters/h100-sxm-8x8.json"));
    ASSERT_TRUE(base.ok());
    int nothingFits = 0, leanFits = 0, cases = 0;
    for (int t = 0; t < 24; ++t) {
        const int64_t hidden = pick({256, 512, 1024}), layers = pick({2, 4, 8});
        const int64_t heads = hidden / 64;
        nlohmann::json cfg = {{"model_type", "llama"},
                              {"vocab_size", pick({1000, 32000})},
                              {"hidden_size", hidden},
                              {"intermediate_size", hidden * 11 / 4},
                              {"num_hidden_layers", layers},
                              {"num_attention_heads", heads},
                              {"num_key_value_heads", heads / 2},
                              {"max_position_embeddings", 8192}};
        auto g = modelFromHfConfig(cfg, "random.json");
        ASSERT_TRUE(g.ok()) << g.error();
        ClusterSpec c = *base;
        c.nodes = pick({1, 2});
        c.device.memoryBytes = pick({64, 128, 256, 512, 1024, 4096}) << 20;
        SearchOptions o;
        o.seqLen = pick({512, 2048, 8192});
        o.globalBatch = c.worldSize() * pick({1, 2, 4});
        o.threads = 1;
        const SearchResult res = searchPlans(*g, c, o);
        ++cases;
        const int64_t perRank = res.globalBatch / c.worldSize();
        ASSERT_GE(perRank, 1);
        // The search tries offload only when nothing fits without it: compare with the
        // plan without offload when it fits, else with the offloaded one.
        int64_t leanest = INT64_MAX, leanestStep = INT64_MAX;
        for (bool offload : {false, true}) {
            if (offload && leanest <= res.memoryBudget) break;
            Plan p;
            p.meshShape = {c.worldSize()};
            p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
            p.wrap.classes = {"LlamaDecoderLayer"};
            p.defaults.reshardAfterForward = ReshardSetting::ofBool(true);
            p.defaults.activationCheckpointing = AcSpec(AcMode::Full);
            p.defaults.mixedPrecision =
                MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
            if (offload) p.defaults.offload = OffloadSpec{true, true};
            p.seqLen = o.seqLen;
            p.seqLenDefaulted = false;
            p.microBatchSize = 1;
            p.microBatches = perRank;
            int64_t reserved = 0;
            const int64_t step = simulateStep(*g, p, c, &reserved);
            if (reserved < leanest) {
                leanest = reserved;
                leanestStep = step;
            }
        }
        const bool fits = leanest <= res.memoryBudget;
        leanFits += fits;
        nothingFits += !res.best.has_value();
        SCOPED_TRACE("case " + std::to_string(t) + ": hidden " + std::to_string(hidden) +
                     ", layers " + std::to_string(layers) + ", " + std::to_string(c.worldSize()) +
                     " GPUs of " + std::to_string(c.device.memoryBytes >> 20) + " MiB, seq " +
                     std::to_string(o.seqLen) + ", global batch " +
                     std::to_string(res.globalBatch));
        if (fits) {
            ASSERT_TRUE(res.best.has_value())
                << "recommend found nothing, but the leanest plan needs " << (leanest >> 20)
                << " MiB of the " << (res.memoryBudget >> 20) << " MiB budget";
            EXPECT_LE(res.best->sim.peakReserved, res.memoryBudget);
            // The search extrapolates steps past 16 micro-batches: allow its 1 %.
            EXPECT_LE(static_cast<double>(res.best->sim.stepNs),
                      1.01 * static_cast<double>(leanestStep));
        }
    }
    std::printf("%d random cases: the leanest plan fits in %d, recommend found nothing in %d\n",
                cases, leanFits, nothingFits);
    // The cases must exercise both sides.
    EXPECT_GT(leanFits, 0);
    EXPECT_GT(cases - leanFits, 0);
}

// A model with modules that compute in fp32 (Ernie-4.5's router gates, cut to four layers):
// every candidate has them as fp32 units of their own (the plans validate and real FSDP2
// runs them), never checkpointed on their own nor in a prefetch chain; FSDP1-compatible
// plans, whose one MixedPrecision cannot leave them in fp32, train in fp32.
TEST(Search, ModulesThatKeepFp32BecomeFp32UnitsOrFsdp1KeepsFp32Parameters) {
    auto j = readJsonFile(samplePath("models/ernie-4.5-21b-a3b/config.json"));
    ASSERT_TRUE(j.ok());
    (*j)["num_hidden_layers"] = 4;
    (*j)["moe_layer_end_index"] = 3;
    auto g = modelFromHfConfig(*j, "ernie.json");
    ASSERT_TRUE(g.ok()) << g.error();
    auto c = loadClusterFile(samplePath("clusters/h100-sxm-8x8.json"));
    ASSERT_TRUE(c.ok());
    SearchOptions o;
    o.seqLen = 1024;
    o.globalBatch = 128;
    const SearchResult res = searchPlans(*g, *c, o);
    ASSERT_TRUE(res.best.has_value());
    for (const Candidate* cand : {&*res.best, &res.baseline}) {
        const ResolvedPlan r = resolvePlan(*g, cand->plan, &*c, "recommended");
        EXPECT_FALSE(r.hasErrors()) << r.problems[0].toString();
        int gates = 0;
        for (const UnitSpec& u : cand->plan.units) {
            const bool gate = u.modules[0].ends_with(".mlp.gate");
            gates += gate;
            if (gate) {
                EXPECT_EQ(u.settings.mixedPrecision->paramDtype, DType::Float32);
                EXPECT_EQ(u.settings.activationCheckpointing, AcSpec(AcMode::None));
                EXPECT_FALSE(u.forwardPrefetch.has_value() && !u.forwardPrefetch->empty());
            }
            for (const auto* list : {&u.forwardPrefetch, &u.backwardPrefetch}) {
                if (!list->has_value()) continue;
                for (const std::string& t : **list)
                    EXPECT_FALSE(t.ends_with(".mlp.gate")) << u.modules[0];
            }
        }
        EXPECT_EQ(gates, 3);
    }
    EXPECT_NE(res.best->summary.find("3 fp32 modules as fp32 units"), std::string::npos)
        << res.best->summary;
    o.fsdp1Compatible = true;
    const SearchResult fsdp1 = searchPlans(*g, *c, o);
    ASSERT_TRUE(fsdp1.best.has_value());
    EXPECT_EQ(fsdp1.best->plan.defaults.mixedPrecision->paramDtype, DType::Float32);
    EXPECT_NE(fsdp1.best->summary.find("fp32 params/fp32 reduce"), std::string::npos);
    Plan asFsdp1 = fsdp1.best->plan;
    asFsdp1.api = PlanApi::Fsdp1;
    const ResolvedPlan r1 = resolvePlan(*g, asFsdp1, &*c, "recommended");
    EXPECT_FALSE(r1.hasErrors()) << r1.problems[0].toString();
}

// What a module keeps only below fp32 (ERNIE's fp32 copy of the router's input) follows a
// variant's param_dtype: the variant's module runs save what resolving the plan in that dtype
// saves.
TEST(Search, AVariantsParamDtypeMovesTheBelowFp32SavedBytes) {
    auto g = loadModelFile(samplePath("models/ernie-4.5-21b-a3b/config.json"));
    ASSERT_TRUE(g.ok()) << g.error();
    Plan p;
    p.meshShape = {8};
    p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
    p.wrap.classes = {"Ernie4_5_MoeDecoderLayer"};
    for (const ModuleId m : g->keepFp32Modules()) {
        UnitSpec u;
        u.modules = {g->module(m).fqn};
        u.settings.mixedPrecision = MixedPrecisionSpec{DType::Float32, DType::Float32, {}, true};
        p.units.push_back(u);
    }
    auto saved = [](const ResolvedPlan& r) {
        double s = 0;
        for (const ModuleRun& run : r.moduleRuns)
            s += run.cost.savedBytes.at(1, 1024);
        return s;
    };
    ResolvedPlan varied = resolvePlan(*g, p, nullptr, "plan.json");
    ASSERT_FALSE(varied.hasErrors());
    const double fp32 = saved(varied);
    PlanVariant v;
    v.paramDtype = DType::BFloat16;
    v.reduceDtype = DType::Float32;
    ASSERT_TRUE(applyVariant(varied, v));
    p.defaults.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
    const ResolvedPlan bf16 = resolvePlan(*g, p, nullptr, "plan.json");
    ASSERT_FALSE(bf16.hasErrors());
    EXPECT_DOUBLE_EQ(saved(varied), saved(bf16));
    EXPECT_DOUBLE_EQ(saved(bf16) - fp32, 27 * 4.0 * 2560 * 1024);
}
