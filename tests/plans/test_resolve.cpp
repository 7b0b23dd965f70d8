// SPDX-License-Identifier: Apache-2.0
// Plan resolution: per-rank sizes as FSDP2 and FSDP1 pad them, reshard semantics, meshes,
// prefetch lists, and every validation message.
#include <gtest/gtest.h>

#include <map>

#include "plans/model/model_json.h"
#include "plans/plan/export.h"
#include "plans/plan/plan_json.h"
#include "plans/plan/resolve.h"
#include "tests/support/golden.h"

using namespace shardscope;
using shardscope::test::samplePath;

namespace {

ModelGraph twoBlocks() {
    ModelGraph g;
    ModuleId layers = g.addModule(g.root(), "layers", "ModuleList", {"ModuleList"});
    for (int i = 0; i < 2; ++i) {
        ModuleId b = g.addModule(layers, std::to_string(i), "Block");
        ModuleId a = g.addModule(b, "a", "Linear");
        g.addParam(a, "weight", {10, 3}, DType::Float32);  // 30 elements
        ModuleId c = g.addModule(b, "c", "Linear");
        g.addParam(c, "weight", {7}, DType::Float32);
    }
    ModuleId head = g.addModule(g.root(), "head", "Linear");
    g.addParam(head, "weight", {5, 2}, DType::Float32);
    EXPECT_TRUE(g.finalize().ok());
    return g;
}

Plan blockPlan(std::vector<int64_t> mesh) {
    Plan p;
    p.meshShape = std::move(mesh);
    p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
    p.wrap.classes = {"Block"};
    return p;
}

std::vector<std::string> messages(const ResolvedPlan& r) {
    std::vector<std::string> out;
    for (const auto& p : r.problems)
        out.push_back(p.toString());
    return out;
}

ModelGraph llama8b() {
    return std::move(loadModelFile(samplePath("models/llama3-8b/config.json"))).value();
}

}  // namespace

TEST(Sizes, Fsdp2PadsDimZeroPerParameter) {
    const ModelGraph g = twoBlocks();
    const ResolvedPlan r = resolvePlan(g, blockPlan({4}), nullptr, "plan.json");
    ASSERT_FALSE(r.hasErrors()) << messages(r)[0];
    const auto& u = r.units[1];  // layers.0
    EXPECT_EQ(u.name, "layers.0");
    // [10,3]: c = ceil(10/4) = 3 rows of 3 → 9; [7]: c = 2 → 2. All-gather: 4·(9+2).
    EXPECT_EQ(u.numel, 37);
    EXPECT_EQ(u.shardedNumel, 11);
    EXPECT_EQ(u.shardedBytes, 44);
    EXPECT_EQ(u.unshardedBytes, 4 * 11 * 4);
    EXPECT_EQ(r.units[0].numel, 10);  // head stays with the root
}

TEST(Sizes, Fsdp1FlatParameterAlignsAndPads) {
    const ModelGraph g = twoBlocks();
    Plan p = blockPlan({4});
    p.api = PlanApi::Fsdp1;
    ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    // use_orig_params: 30 → pad to 32 (16 B = 4 fp32), + 7 = 39 → pad to 40 → shard 10.
    EXPECT_EQ(r.units[1].shardedNumel, 10);
    EXPECT_EQ(r.units[1].unshardedBytes, 160);
    p.fsdp1.useOrigParams = false;
    r = resolvePlan(g, p, nullptr, "plan.json");
    // 37 unaligned → ceil(37/4) = 10, the tail rank padded.
    EXPECT_EQ(r.units[1].shardedNumel, 10);
    p.meshShape = {8};
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(r.units[1].shardedNumel, 5);
}

// torch.optim.AdamW's foreach kernels, as multi_tensor_apply launches them (ATen's
// MultiTensorApply.cuh): one kernel per 320 chunks of 65,536 elements; a full tensor list
// (at a tensor's last chunk) launches early; a tensor cut by a full block list goes on into
// the next kernel.
TEST(Sizes, ForeachKernelsFollowMultiTensorApply) {
    constexpr int64_t kChunk = 65536;
    EXPECT_EQ(foreachKernels({}, 110), 0);
    EXPECT_EQ(foreachKernels({1}, 110), 1);
    EXPECT_EQ(foreachKernels({320 * kChunk}, 110), 1);
    EXPECT_EQ(foreachKernels({320 * kChunk + 1}, 110), 2);
    // 48 one-chunk tensors fill a depth-3 list: a kernel each 48; 110 for depth 1.
    EXPECT_EQ(foreachKernels(std::vector<int64_t>(96, 100), 48), 2);
    EXPECT_EQ(foreachKernels(std::vector<int64_t>(96, 100), 110), 1);
    // A tensor that spills over a full block list starts the next kernel's list.
    EXPECT_EQ(foreachKernels({300 * kChunk, 100 * kChunk}, 110), 2);
    EXPECT_EQ(foreachKernels({300 * kChunk, 100 * kChunk, 250 * kChunk}, 110), 3);
}

TEST(Sizes, OptimizerForeachOfLlamaWithFourLayers) {
    // The H200 runs' model (tests/data/h200-llama8b-4layers) on one rank: its 39 parameter
    // tensors are 29,353 chunks, 92 kernels per _foreach_* op, as the trace shows (each of
    // AdamW's 8 ops launched 92).
    auto g = loadModelFile(samplePath("../tests/data/h200-llama8b-4layers/config.json"));
    ASSERT_TRUE(g.ok()) << g.error();
    Plan p = blockPlan({1});
    p.wrap.classes = {"LlamaDecoderLayer"};
    const ResolvedPlan r = resolvePlan(*g, p, nullptr, "plan.json");
    ASSERT_FALSE(r.hasErrors());
    EXPECT_EQ(r.optimizerForeach.tensors, 39);
    for (int i = 0; i < 4; ++i)
        EXPECT_EQ(r.optimizerForeach.kernels[i], 92) << i;
    // 64 ranks: 291 per-rank shards of Llama-3-8B (125 M elements, 1,999 chunks): at least
    // one kernel per 320 chunks and per full tensor list, at most their sum.
    const ModelGraph l8 = llama8b();
    p.meshShape = {64};
    const ResolvedPlan r64 = resolvePlan(l8, p, nullptr, "plan.json");
    EXPECT_EQ(r64.optimizerForeach.tensors, 291);
    int64_t chunks = 0;
    for (const auto& u : r64.units)
        for (ParamId pid : u.params) {
            const auto& info = l8.param(pid);
            const int64_t perRank = (info.shape[0] + 63) / 64 * (info.numel / info.shape[0]);
            chunks += (perRank + 65535) / 65536;
        }
    const int32_t limits[4] = {110, 96, 64, 48};
    for (int i = 0; i < 4; ++i) {
        const int64_t byBlocks = (chunks + 319) / 320, byTensors = 291 / limits[i];
        EXPECT_GE(r64.optimizerForeach.kernels[i], std::max(byBlocks, byTensors)) << i;
        EXPECT_LE(r64.optimizerForeach.kernels[i], byBlocks + byTensors) << i;
    }
}

TEST(Sizes, HsdpShardsOverTheInnerDimension) {
    const ModelGraph g = llama8b();
    Plan p = blockPlan({8, 8});
    p.wrap.classes = {"LlamaDecoderLayer"};
    const ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    ASSERT_FALSE(r.hasErrors());
    EXPECT_TRUE(r.hsdp);
    EXPECT_EQ(r.replicateSize, 8);
    EXPECT_EQ(r.shardSize, 8);
    // A Llama-3-8B layer is 218,112,000 fp32 elements; every dim 0 divides by 8.
    EXPECT_EQ(r.units[1].shardedBytes, 218112000LL * 4 / 8);
    EXPECT_EQ(r.units[1].unshardedBytes, 218112000LL * 4);
}

TEST(Reshard, NoneIsTrueExceptRootAndIntFollowsPyTorch) {
    const ModelGraph g = twoBlocks();
    Plan p = blockPlan({8});
    ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(r.units[0].reshard, Reshard::False);  // root left at None
    EXPECT_EQ(r.units[1].reshard, Reshard::True);

    p.defaults.reshardAfterForward = ReshardSetting::ofBool(true);  // explicit: root too
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(r.units[0].reshard, Reshard::True);

    p.defaults.reshardAfterForward = ReshardSetting::ofInt(4);
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(r.units[1].reshard, Reshard::Int);
    EXPECT_EQ(r.units[1].reshardK, 4);
    // ceil(d0/4) rows of each parameter: [10,3] → 3·3, [7] → 2; 11 fp32 elements.
    EXPECT_EQ(r.units[1].postForwardBytes, 11 * 4);
    p.defaults.reshardAfterForward = ReshardSetting::ofInt(1);
    EXPECT_EQ(resolvePlan(g, p, nullptr, "plan.json").units[1].reshard, Reshard::False);
    p.defaults.reshardAfterForward = ReshardSetting::ofInt(8);
    EXPECT_EQ(resolvePlan(g, p, nullptr, "plan.json").units[1].reshard, Reshard::True);
    p.defaults = {};
    p.units.push_back({"", {"layers.1"}, {}, {}, {}, "plan.json:/units/0"});
    p.units[0].settings.reshardAfterForward = ReshardSetting::ofInt(3);
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(messages(r),
              (std::vector<std::string>{
                  "plan.json:/units/0: error: reshard_after_forward=3 must divide the shard "
                  "size 8 (the post-forward group is mesh.view(-1, k))"}));
}

TEST(Validation, MeshAndClusterMustAgree) {
    const ModelGraph g = twoBlocks();
    ClusterSpec c;
    c.name = "16 GPUs";
    c.nodes = 2;
    c.node.devicesPerNode = 8;
    ResolvedPlan r = resolvePlan(g, blockPlan({2, 4}), &c, "plan.json");
    EXPECT_EQ(messages(r),
              (std::vector<std::string>{
                  "plan.json:/mesh/shape: error: world size 16 of cluster \"16 GPUs\" does not "
                  "equal the mesh product 2x4 = 8"}));
    r = resolvePlan(g, blockPlan({2, 2, 2}), nullptr, "plan.json");
    EXPECT_EQ(messages(r)[0],
              "plan.json:/mesh/shape: error: a mesh must be 1D (FSDP) or 2D (HSDP: [replicate, "
              "shard]), got 3 "
              "dimensions");
    r = resolvePlan(g, blockPlan({}), nullptr, "plan.json");
    EXPECT_NE(messages(r)[0].find("no device mesh"), std::string::npos);
    // No mesh: the cluster gives it; FSDP1 hybrid shards within a node.
    Plan h = blockPlan({});
    h.api = PlanApi::Fsdp1;
    h.fsdp1.shardingStrategy = "HYBRID_SHARD";
    r = resolvePlan(g, h, &c, "plan.json");
    EXPECT_FALSE(r.hasErrors());
    EXPECT_EQ(r.shardSize, 8);
    EXPECT_EQ(r.replicateSize, 2);
    h.fsdp1.shardingStrategy = "NO_SHARD";
    r = resolvePlan(g, h, &c, "plan.json");
    EXPECT_EQ(r.shardSize, 1);
    EXPECT_EQ(r.units[1].unshardedBytes, r.units[1].shardedBytes);
}

TEST(Validation, UnknownModulesSuggestTheNearest) {
    const ModelGraph g = llama8b();
    Plan p;
    p.meshShape = {8};
    p.units.push_back({"", {"model.layer.3"}, {}, {}, {}, "plan.json:/units/0"});
    const ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(messages(r),
              (std::vector<std::string>{"plan.json:/units/0/modules/0: error: unknown module "
                                        "\"model.layer.3\" (did you mean \"model.layers.3\"?)"}));
}

TEST(Validation, OverlappingUnitsAndPrefetchTargets) {
    const ModelGraph g = twoBlocks();
    Plan p = blockPlan({2});
    p.units.push_back({"pair", {"layers.0.a", "layers.0.a"}, {}, {}, {}, "plan.json:/units/0"});
    p.units.push_back({"",
                       {"layers.1"},
                       {},
                       std::vector<std::string>{"layers.0.c", "nope", "layers.1"},
                       {},
                       "plan.json:/units/1"});
    p.units.push_back({"", {"head", "layers.1"}, {}, {}, {}, "plan.json:/units/2"});
    p.units.push_back({"", {"layers.0.a", "layers.0"}, {}, {}, {}, "plan.json:/units/3"});
    const ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(
        messages(r),
        (std::vector<std::string>{
            "plan.json:/units/0/modules/1: error: \"layers.0.a\" is listed twice in this unit",
            "plan.json:/units/2/modules: error: \"layers.1\" is already in unit layers.1",
            "plan.json:/units/3/modules/1: error: \"layers.0\" contains \"layers.0.a\", which this "
            "unit "
            "also lists; a unit's modules must not nest",
            "plan.json:/units/3/modules/0: error: \"layers.0.a\" is already a unit "
            "(plan.json:/units/0)",
            "plan.json:/units/1/forward_prefetch/0: error: prefetch target \"layers.0.c\" is not a "
            "unit (it "
            "is a module inside unit layers.0; make it a unit to prefetch it)",
            "plan.json:/units/1/forward_prefetch/1: error: prefetch target \"nope\" is not a unit",
            "plan.json:/units/1/forward_prefetch/2: error: a unit cannot prefetch itself"}));
}

TEST(Validation, ScalarParametersAndFsdp1OnlyFeatures) {
    ModelGraph g;
    ModuleId m = g.addModule(g.root(), "scale", "Scale");
    g.addParam(m, "alpha", {}, DType::Float32);
    ASSERT_TRUE(g.finalize().ok());
    Plan p;
    p.meshShape = {2};
    ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    ASSERT_EQ(r.errorCount(), 1u);
    EXPECT_EQ(r.problems[0].message,
              "parameter \"scale.alpha\" is a scalar; fully_shard cannot shard 0-dim parameters: "
              "list it in "
              "\"ignored_params\"");
    p.ignoredParams = {"scale.alpha"};
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_FALSE(r.hasErrors());
    EXPECT_EQ(r.units[0].numel, 0);

    const ModelGraph t = twoBlocks();
    Plan f = blockPlan({2});
    f.api = PlanApi::Fsdp1;
    f.units.push_back(
        {"", {"layers.0"}, {}, std::vector<std::string>{"layers.1"}, {}, "plan.json:/units/0"});
    f.units[0].settings.reshardAfterForward = ReshardSetting::ofInt(2);
    r = resolvePlan(t, f, nullptr, "plan.json");
    EXPECT_EQ(messages(r),
              (std::vector<std::string>{
                  "plan.json:/units/0: error: an int reshard_after_forward is an FSDP2 feature; "
                  "FSDP1 chooses resharding through sharding_strategy",
                  "plan.json:/units/0/forward_prefetch: error: explicit prefetch lists are an "
                  "FSDP2 feature; under FSDP1 use fsdp1.forward_prefetch and "
                  "fsdp1.backward_prefetch"}));
}

TEST(MixedPrecision, NormalisedAsMixedPrecisionPolicy) {
    const ModelGraph g = twoBlocks();
    Plan p = blockPlan({2});
    p.defaults.mixedPrecision = MixedPrecisionSpec{DType::Float32, DType::Float32, {}, true};
    ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_FALSE(r.units[1].mixedPrecision.paramDtype.has_value());  // equals the original
    EXPECT_FALSE(r.units[1].mixedPrecision.reduceDtype.has_value());
    p.defaults.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::BFloat16, {}, true};
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(r.units[1].allGatherDtype, DType::BFloat16);
    EXPECT_FALSE(r.units[1].mixedPrecision.reduceDtype.has_value());  // equals param_dtype
    EXPECT_EQ(r.units[1].reduceDtype, DType::BFloat16);
    // N = 2: [10,3] → 5 rows → 15; [7] → 4; all-gather 2·19 bf16 elements.
    EXPECT_EQ(r.units[1].unshardedBytes, 2 * 19 * 2);
}

TEST(Order, ApplicationOrderIsBottomUpWithTheRootLast) {
    const ModelGraph g = twoBlocks();
    const ResolvedPlan r = resolvePlan(g, blockPlan({2}), nullptr, "plan.json");
    std::vector<std::string> names;
    for (UnitId u : r.applicationOrder())
        names.push_back(r.units[u.index()].displayName());
    EXPECT_EQ(names, (std::vector<std::string>{"layers.1", "layers.0", "<root>"}));
}

TEST(Export, Fsdp2ListsCallsChildrenFirstWithEffectiveKwargs) {
    const ModelGraph g = llama8b();
    auto p = loadPlanFile(samplePath("plans/llama-hsdp-prefetch.json"));
    ASSERT_TRUE(p.ok()) << p.error();
    const ResolvedPlan r = resolvePlan(g, *p, nullptr, "plan.json");
    ASSERT_FALSE(r.hasErrors());
    const auto j = exportPlan(r, ExportFormat::Fsdp2);
    EXPECT_EQ(j["mesh"]["shape"], nlohmann::json({8, 8}));
    EXPECT_EQ(j["fully_shard"].size(), 33u);
    EXPECT_EQ(j["fully_shard"][0]["modules"], nlohmann::json({"model.layers.31"}));
    EXPECT_EQ(j["fully_shard"].back()["modules"], nlohmann::json({""}));
    EXPECT_EQ(j["fully_shard"][0]["kwargs"]["reshard_after_forward"], 4);
    EXPECT_EQ(j["fully_shard"][0]["kwargs"]["mp_policy"]["param_dtype"], "torch.bfloat16");
    EXPECT_EQ(j["forward_prefetch"]["model.layers.0"],
              nlohmann::json({"model.layers.1", "model.layers.2"}));
    EXPECT_EQ(j["activation_checkpointing"]["model.layers.7"], "selective_op");
    const auto f1 = exportPlan(r, ExportFormat::Fsdp1);
    EXPECT_EQ(f1["kwargs"]["auto_wrap_policy"]["type"], "ModuleWrapPolicy");
    EXPECT_EQ(f1["kwargs"]["sharding_strategy"], "HYBRID_SHARD");
    // FSDP2 casts no buffers: FSDP1's buffer_dtype stays None, not the parameter dtype.
    EXPECT_TRUE(f1["kwargs"]["mixed_precision"]["buffer_dtype"].is_null());
    // What FSDP1 cannot express is named with its units, never silently changed.
    std::map<std::string, size_t> dropped;
    for (const auto& d : f1["dropped"])
        dropped[d["setting"].get<std::string>()] = d["units"].size();
    EXPECT_EQ(dropped["reshard_after_forward 4"], 33u);
    EXPECT_EQ(dropped["explicit prefetch lists"], 2u);
    EXPECT_EQ(dropped["activation_checkpointing selective_op"], 32u);
    const auto lightning = exportPlan(r, ExportFormat::LightningFsdp1);
    EXPECT_EQ(lightning["strategy"], "FSDPStrategy");
    EXPECT_EQ(lightning["dropped"], f1["dropped"]);
    // Lightning's FSDP2 strategy takes the plan as it is: nothing dropped.
    const auto mp = exportPlan(r, ExportFormat::Lightning);
    EXPECT_EQ(mp["strategy"], "ModelParallelStrategy");
    EXPECT_EQ(mp["kwargs"]["data_parallel_size"], 64);
    EXPECT_EQ(mp["kwargs"]["tensor_parallel_size"], 1);
    EXPECT_EQ(mp["fsdp2"], j);
    EXPECT_TRUE(mp["dropped"].empty());
    EXPECT_EQ(mp["trainer"]["precision"], "32-true");  // mp_policy casts, not autocast
}

TEST(Export, AnFsdp1PlanDropsNothingForFsdp1) {
    const ModelGraph g = llama8b();
    auto p = loadPlanFile(samplePath("plans/llama-fsdp1.json"));
    ASSERT_TRUE(p.ok()) << p.error();
    p->meshShape = {8};
    const ResolvedPlan r = resolvePlan(g, *p, nullptr, "plan.json");
    ASSERT_FALSE(r.hasErrors());
    EXPECT_TRUE(exportPlan(r, ExportFormat::Fsdp1)["dropped"].empty());
}

TEST(Checkpointing, DefaultsSkipTheRootEveryKCountsUnitsAndSelectiveWarns) {
    const ModelGraph g = llama8b();
    Plan p = blockPlan({8});
    p.wrap.classes = {"LlamaDecoderLayer"};
    p.defaults.activationCheckpointing = AcSpec(AcMode::Full);
    p.defaults.activationCheckpointing->every = 2;
    ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    ASSERT_FALSE(r.hasErrors());
    // torchtitan's ac_freq: blocks counted from 1, the k-th, 2k-th, ... checkpointed.
    std::vector<std::string> checkpointed;
    for (const auto& u : r.units)
        if (u.activationCheckpointing == AcMode::Full) checkpointed.push_back(u.name);
    ASSERT_EQ(checkpointed.size(), 16u);
    EXPECT_EQ(checkpointed[0], "model.layers.1");
    EXPECT_EQ(checkpointed[15], "model.layers.31");
    EXPECT_EQ(r.units[0].activationCheckpointing, AcMode::None);  // the root never by default

    p.defaults.activationCheckpointing = AcSpec(AcMode::SelectiveOp);
    p.units.push_back(UnitSpec{"", {""}, {}, {}, {}, ""});
    p.units.back().settings.activationCheckpointing = AcSpec(AcMode::Full);  // asked for the root
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(r.units[0].activationCheckpointing, AcMode::Full);
    EXPECT_EQ(r.units[1].activationCheckpointing, AcMode::SelectiveOp);

    Plan legacy = blockPlan({8});
    legacy.wrap.classes = {"LlamaDecoderLayer"};
    legacy.defaults.activationCheckpointing = AcSpec(AcMode::Attention);
    legacy.defaults.activationCheckpointing->legacySelective = true;
    r = resolvePlan(g, legacy, nullptr, "plan.json");
    const auto ms = messages(r);
    ASSERT_EQ(ms.size(), 1u);
    EXPECT_NE(
        ms[0].find("plan.json:/defaults/activation_checkpointing: warning: \"selective\" is read "
                   "as \"attention\""),
        std::string::npos)
        << ms[0];
}

TEST(ModuleRuns, AnExpertLoopAfterTheAttentionIsFoundAndADenseMlpIsNoLoop) {
    // Mixtral's 8 experts (ModuleList of alike MixtralBlockSparseTop2MLP) follow the
    // attention in each decoder layer: their saved bytes and gradients are the loop's
    // (ModuleRun::loopSaved). The layers' own ModuleList holds the attention: no loop.
    const ModelGraph g =
        std::move(loadModelFile(samplePath("models/mixtral-8x7b/config.json"))).value();
    Plan p = blockPlan({8});
    p.wrap.classes = {"MixtralDecoderLayer"};
    const ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    ASSERT_FALSE(r.hasErrors());
    const ModuleId experts = *g.findModule("model.layers.0.block_sparse_moe.experts");
    ScaledCost saved;
    int64_t expertNumel = 0;
    for (size_t m = experts.index() + 1;
         m < static_cast<size_t>(g.modules()[experts.index()].subtreeEnd); ++m) {
        saved += g.modules()[m].cost.savedBytes;
        for (ParamId q : g.modules()[m].params)
            expertNumel += g.params()[q.index()].numel;
    }
    EXPECT_EQ(expertNumel, int64_t{8} * 3 * 4096 * 14336);
    int layers = 0;
    for (const ModuleRun& run : r.moduleRuns) {
        if (!run.hasAttn) {
            EXPECT_EQ(run.loopMembers, 0);
            continue;
        }
        ++layers;
        EXPECT_EQ(run.loopMembers, 8);
        EXPECT_EQ(run.loopGradNumel, expertNumel);
        EXPECT_DOUBLE_EQ(run.loopSaved.at(2, 8192), saved.at(2, 8192));
    }
    EXPECT_EQ(layers, 32);

    const ModelGraph dense = llama8b();
    Plan lp = blockPlan({8});
    lp.wrap.classes = {"LlamaDecoderLayer"};
    const ResolvedPlan lr = resolvePlan(dense, lp, nullptr, "plan.json");
    for (const ModuleRun& run : lr.moduleRuns)
        EXPECT_EQ(run.loopMembers, 0);
}

TEST(ModuleRuns, SlidingWindowMasksAreSavedFromTheWindowOnInTheLayersThatUseIt) {
    // From seq_len == window on, transformers gives each sliding-window layer's SDPA a
    // (b, 1, s, s) mask, which SDPA converts to the query's dtype and keeps for backward:
    // b·s² elements per such layer (FSDPMemTracker, Gemma-3-1B at 2 x 2048: +0.01% with
    // them). Which layers: transformers' config.layer_types rules (python_hf_modules checks
    // them against transformers itself).
    struct Case {
        const char* sample;
        const char* block;
        int64_t window;
        int slidingLayers;
    };
    for (const Case& c : {Case{"phi3-mini-4k", "Phi3DecoderLayer", 2047, 32},
                          Case{"mistral-7b-v0.1", "MistralDecoderLayer", 4096, 32},
                          Case{"gemma2-9b", "Gemma2DecoderLayer", 4096, 21},
                          Case{"gemma3-1b", "Gemma3DecoderLayer", 512, 22}}) {
        SCOPED_TRACE(c.sample);
        const ModelGraph g =
            std::move(loadModelFile(samplePath(std::string("models/") + c.sample + "/config.json")))
                .value();
        EXPECT_EQ(g.slidingWindow, c.window);
        int masked = 0;
        for (const ModuleNode& m : g.modules())
            if (!m.cost.windowSavedBytes.isZero()) {
                ++masked;
                EXPECT_NE(m.cls.find("Attention"), std::string::npos) << m.fqn;
                EXPECT_EQ(m.cost.windowSavedBytes.perTokenSeq, 4.0);  // fp32 activations
            }
        EXPECT_EQ(masked, c.slidingLayers);
        Plan p = blockPlan({8});
        p.wrap.classes = {c.block};
        p.microBatchSize = 2;
        auto savedSeqTerm = [&](int64_t seq) {
            p.seqLen = seq;
            const ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
            EXPECT_FALSE(r.hasErrors());
            double perTokenSeq = 0;
            for (const ModuleRun& run : r.moduleRuns)
                perTokenSeq += run.cost.savedBytes.perTokenSeq;
            // Without the masks nothing saved grows with s² (flash/efficient SDPA).
            return perTokenSeq;
        };
        EXPECT_EQ(savedSeqTerm(c.window - 1), 0.0);
        EXPECT_EQ(savedSeqTerm(c.window), 4.0 * c.slidingLayers);
        EXPECT_EQ(savedSeqTerm(8192), 4.0 * c.slidingLayers);
    }
    // No window (null, or Qwen's use_sliding_window false): no masks at any length.
    for (const char* sample : {"phi4", "qwen3-8b", "llama3.1-8b"}) {
        const ModelGraph g =
            std::move(loadModelFile(samplePath(std::string("models/") + sample + "/config.json")))
                .value();
        EXPECT_EQ(g.slidingWindow, 0) << sample;
        for (const ModuleNode& m : g.modules())
            EXPECT_TRUE(m.cost.windowSavedBytes.isZero()) << sample << " " << m.fqn;
    }
}

// Ernie-4.5's router gates compute in fp32 whatever the model's dtype: under a bf16
// param_dtype each must be an fp32 unit of its own (real FSDP2 fails in the gate's forward
// otherwise), which FSDP1 cannot express; one message names the first and counts the rest.
// Their fp32 copy of the block's input is saved only where the block computes below fp32.
TEST(Validation, ModulesThatKeepFp32NeedFp32Units) {
    const ModelGraph g =
        std::move(loadModelFile(samplePath("models/ernie-4.5-21b-a3b/config.json"))).value();
    Plan p = blockPlan({8});
    p.wrap.classes = {"Ernie4_5_MoeDecoderLayer"};
    p.defaults.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
    ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(messages(r), (std::vector<std::string>{
                               "plan.json:/units: error: module \"model.layers.1.mlp.gate\" (and "
                               "26 more such modules) computes in fp32 whatever the model's "
                               "dtype (transformers keeps it fp32 and runs it on an fp32 input "
                               "with autocast off), so its weight must reach it in fp32; unit "
                               "model.layers.1 gathers it in bfloat16, and real FSDP2 fails in "
                               "its forward (\"expected m1 and m2 to have the same dtype\"). "
                               "Make each such module a unit of its own in fp32, e.g. "
                               "{\"modules\": [\"model.layers.1.mlp.gate\"], \"mixed_precision\": "
                               "{\"param_dtype\": \"float32\", \"reduce_dtype\": \"float32\"}}, "
                               "listed with the other units (the plans `shardscope recommend` "
                               "writes have them)"}));
    for (int i = 1; i < 28; ++i) {
        UnitSpec u;
        u.modules = {"model.layers." + std::to_string(i) + ".mlp.gate"};
        u.settings.mixedPrecision = MixedPrecisionSpec{DType::Float32, DType::Float32, {}, true};
        p.units.push_back(u);
    }
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_TRUE(messages(r).empty()) << messages(r)[0];
    const auto gateUnit = std::find_if(r.units.begin(), r.units.end(), [](const auto& u) {
        return u.name == "model.layers.1.mlp.gate";
    });
    ASSERT_NE(gateUnit, r.units.end());
    EXPECT_TRUE(gateUnit->keepsFp32);
    EXPECT_EQ(gateUnit->allGatherDtype, DType::Float32);
    // The block's fp32 copy of its input: 4 B a hidden element per token, under bf16 only.
    auto savedOf = [&](const ResolvedPlan& x) {
        double s = 0;
        for (const ModuleRun& run : x.moduleRuns)
            s += run.cost.savedBytes.at(1, 1024);
        return s;
    };
    const double bf16 = savedOf(r);
    Plan fp32 = p;
    fp32.defaults.mixedPrecision.reset();
    const double full = savedOf(resolvePlan(g, fp32, nullptr, "plan.json"));
    double copies = 0;
    for (const ModuleNode& m : g.modules())
        copies += m.cost.belowFp32SavedBytes.fixedPerToken;
    EXPECT_EQ(copies, 27 * 4 * 2560);
    EXPECT_DOUBLE_EQ(bf16 - full, copies * 1024);
    // Exported as FSDP2 they stay fp32 units; FSDP1 and Lightning would drop them.
    EXPECT_FALSE(exportRefusal(r, ExportFormat::Fsdp2).has_value());
    for (const ExportFormat f :
         {ExportFormat::Fsdp1, ExportFormat::Lightning, ExportFormat::LightningFsdp1}) {
        const auto why = exportRefusal(r, f);
        ASSERT_TRUE(why.has_value());
        EXPECT_EQ(why->rfind("module \"model.layers.1.mlp.gate\" computes in fp32", 0), 0u) << *why;
    }
    EXPECT_FALSE(
        exportRefusal(resolvePlan(g, fp32, nullptr, "plan.json"), ExportFormat::Fsdp1).has_value());
    // FSDP1 applies one MixedPrecision to every unit.
    p.api = PlanApi::Fsdp1;
    r = resolvePlan(g, p, nullptr, "plan.json");
    ASSERT_TRUE(r.hasErrors());
    EXPECT_NE(messages(r).back().find("plan.json:/api: error: module \"model.layers.1.mlp.gate\""),
              std::string::npos)
        << messages(r).back();
    // Parameters of two dtypes that train in one FSDP2 unit: refused as PyTorch does.
    HfLoadOptions o;
    o.paramDtype = DType::BFloat16;
    const ModelGraph mixed =
        std::move(loadModelFile(samplePath("models/ernie-4.5-21b-a3b/config.json"), o)).value();
    Plan none = blockPlan({8});
    none.wrap.classes = {"Ernie4_5_MoeDecoderLayer"};
    r = resolvePlan(mixed, none, nullptr, "plan.json");
    ASSERT_TRUE(r.hasErrors());
    EXPECT_EQ(messages(r)[0],
              "plan.json:/wrap: error: unit model.layers.1 mixes the dtypes of its trainable "
              "parameters, which FSDP2 refuses (\"FSDP expects uniform original parameter "
              "dtype\"): give the parameters of another dtype units of their own");
}
