// SPDX-License-Identifier: Apache-2.0
// Wrap policies on hand-checked trees. Expected units are worked out by hand from
// torch/distributed/fsdp/wrap.py (_recursive_wrap, size_based_auto_wrap_policy,
// _module_wrap_policy, _or_policy + _wrap_module_cls_individually for BatchNorm).
#include <gtest/gtest.h>

#include "plans/plan/resolve.h"
#include "plans/plan/wrap_policy.h"

using namespace shardscope;

namespace {

// Linear-like module with `n` parameters as one [n] weight.
ModuleId leaf(ModelGraph& g, ModuleId parent, const char* name, int64_t n,
              const char* cls = "Linear", bool requiresGrad = true) {
    ModuleId m = g.addModule(parent, name, cls);
    if (n > 0) g.addParam(m, "weight", {n}, DType::Float32, requiresGrad);
    return m;
}

std::vector<std::string> wrappedNames(const ModelGraph& g, const WrapPolicySpec& p,
                                      bool bn = false) {
    WrapOptions o;
    o.policy = p;
    o.wrapBatchNormIndividually = bn;
    auto r = applyWrapPolicy(g, o);
    EXPECT_TRUE(r.ok());
    std::vector<std::string> out;
    for (ModuleId m : r->wrapped)
        out.push_back(g.module(m).fqn);
    return out;
}

WrapPolicySpec sizePolicy(int64_t minNumParams) {
    WrapPolicySpec p;
    p.kind = WrapPolicySpec::Kind::Size;
    p.minNumParams = minNumParams;
    return p;
}

WrapPolicySpec classPolicy(std::vector<std::string> classes) {
    WrapPolicySpec p;
    p.kind = WrapPolicySpec::Kind::ModuleClass;
    p.classes = std::move(classes);
    return p;
}

std::vector<std::string> unitNames(const ResolvedPlan& r) {
    std::vector<std::string> out;
    for (const auto& u : r.units)
        out.push_back(u.displayName());
    return out;
}

}  // namespace

TEST(SizePolicy, PostOrderRemainderAndModuleListNeverWrapped) {
    ModelGraph g;
    leaf(g, g.root(), "a", 100);
    ModuleId b = g.addModule(g.root(), "b", "Sequential");
    leaf(g, b, "c", 60);
    leaf(g, b, "d", 50);
    ModuleId e = g.addModule(g.root(), "e", "ModuleList", {"ModuleList"});
    leaf(g, e, "f", 120);
    ASSERT_TRUE(g.finalize().ok());
    // a: 100 >= 100 wraps; c, d are small, so b wraps with remainder 110; f wraps; e has
    // remainder 0 and is a ModuleList anyway; the root is the caller's.
    EXPECT_EQ(wrappedNames(g, sizePolicy(100)), (std::vector<std::string>{"a", "b", "e.f"}));
    // At 111 only f (120) is large enough on its own; b (110) is not.
    EXPECT_EQ(wrappedNames(g, sizePolicy(111)), (std::vector<std::string>{"e.f"}));
    EXPECT_EQ(wrappedNames(g, sizePolicy(1000)), (std::vector<std::string>{}));
}

TEST(SizePolicy, ForceLeafModulesAreNeitherRecursedNorWrapped) {
    ModelGraph g;
    ModuleId blk = g.addModule(g.root(), "blk", "Block");
    ModuleId mha = g.addModule(blk, "attn", "MultiheadAttention");
    g.addParam(mha, "in_proj_weight", {300}, DType::Float32);
    leaf(g, mha, "out_proj", 150, "NonDynamicallyQuantizableLinear");
    leaf(g, blk, "mlp", 50);
    ASSERT_TRUE(g.finalize().ok());
    // attn (450) is large but a force leaf: recurse=False returns it unwrapped with 0, so
    // its numel stays in blk's remainder and blk wraps (500).
    EXPECT_EQ(wrappedNames(g, sizePolicy(100)), (std::vector<std::string>{"blk"}));
    // The BatchNorm rule's _or_policy always recurses, so out_proj (150) wraps, then attn
    // with its remainder 300, and blk's remainder (50) is too small.
    EXPECT_EQ(wrappedNames(g, sizePolicy(100), true),
              (std::vector<std::string>{"blk.attn.out_proj", "blk.attn"}));
}

TEST(ModuleClassPolicy, NestedModuleListsAndContainerUnitsRejected) {
    ModelGraph g;
    ModuleId outer = g.addModule(g.root(), "layers", "ModuleList", {"ModuleList"});
    for (int i = 0; i < 2; ++i) {
        ModuleId inner = g.addModule(outer, std::to_string(i), "ModuleList", {"ModuleList"});
        for (int k = 0; k < 2; ++k)
            leaf(g, g.addModule(inner, std::to_string(k), "Block"), "lin", 10);
    }
    ASSERT_TRUE(g.finalize().ok());
    EXPECT_EQ(wrappedNames(g, classPolicy({"Block"})),
              (std::vector<std::string>{"layers.0.0", "layers.0.1", "layers.1.0", "layers.1.1"}));

    Plan p;
    p.meshShape = {2};
    p.units.push_back({"", {"layers.1"}, {}, {}, {}, "plan.json:/units/0"});
    const ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    ASSERT_EQ(r.errorCount(), 1u);
    EXPECT_EQ(r.problems[0].toString(),
              "plan.json:/units/0/modules/0: error: \"layers.1\" is a ModuleList, which has no "
              "forward and "
              "cannot be a unit; make its children units, or group some of them in one unit's "
              "\"modules\" list");
}

TEST(TiedParameters, Fsdp2RequiresGroupingFsdp1UsesTheFirstWrappedUnit) {
    ModelGraph g;
    ModuleId model = g.addModule(g.root(), "model", "Model");
    ModuleId emb = leaf(g, model, "embed", 0, "Embedding");
    ParamId w = g.addParam(emb, "weight", {1000, 8}, DType::Float32);
    ModuleId layers = g.addModule(model, "layers", "ModuleList", {"ModuleList"});
    for (int i = 0; i < 2; ++i)
        leaf(g, g.addModule(layers, std::to_string(i), "Block"), "lin", 64);
    ModuleId head = g.addModule(g.root(), "head", "Linear");
    g.tieParam(w, head, "weight");
    ASSERT_TRUE(g.finalize().ok());
    EXPECT_EQ(g.totalParams(), 8000 + 128);

    Plan p;
    p.meshShape = {4};
    p.wrap = classPolicy({"Block"});
    // Blocks as units: the tied weight stays with the root, which contains both owners.
    ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_FALSE(r.hasErrors());
    EXPECT_EQ(r.units[0].numel, 8000);

    // The embedding alone as a unit splits the owners: FSDP2 refuses...
    p.units.push_back({"", {"model.embed"}, {}, {}, {}, "plan.json:/units/0"});
    r = resolvePlan(g, p, nullptr, "plan.json");
    ASSERT_EQ(r.errorCount(), 1u);
    EXPECT_NE(r.problems[0].message.find(
                  "parameter \"model.embed.weight\" is shared by \"model.embed\" "
                  "(unit model.embed), \"head\" (unit <root>); FSDP2 cannot shard"),
              std::string::npos)
        << r.problems[0].message;
    // ...grouping both owners in one unit works...
    p.units[0].modules = {"model.embed", "head"};
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_FALSE(r.hasErrors());
    EXPECT_EQ(r.units[r.findUnit("model.embed")->index()].numel, 8000);
    // ...and FSDP1 gives it to the first of its owners' units that _recursive_wrap wraps
    // (post-order: model.embed before the root), where the head, in the root's unit, sees
    // only its shard: real FSDP1 fails with a size mismatch (python_apply_fsdp1 checks this
    // on GPT-2 with real FullyShardedDataParallel), so the plan is an error.
    p.api = PlanApi::Fsdp1;
    p.units[0].modules = {"model.embed"};
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(r.units[0].numel, 0);
    EXPECT_EQ(r.units[r.findUnit("model.embed")->index()].numel, 8000);
    ASSERT_EQ(r.errorCount(), 1u);
    EXPECT_NE(r.problems[0].message.find("FSDP1 manages it in unit model.embed (the first "
                                         "wrapped), and \"head\" in unit <root> uses it while "
                                         "that unit is sharded"),
              std::string::npos)
        << r.problems[0].message;
}

TEST(BatchNorm, WrappedAloneInFullPrecisionUnderFsdp1MixedPrecision) {
    ModelGraph g;
    leaf(g, g.root(), "conv", 1000, "Conv2d");
    ModuleId bn = g.addModule(g.root(), "bn", "BatchNorm2d", {"_BatchNorm"});
    g.addParam(bn, "weight", {20}, DType::Float32);
    g.addParam(bn, "bias", {20}, DType::Float32);
    leaf(g, g.root(), "fc", 1000);
    ASSERT_TRUE(g.finalize().ok());

    Plan p;
    p.api = PlanApi::Fsdp1;
    p.meshShape = {2};
    p.wrap = sizePolicy(500);
    ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(unitNames(r), (std::vector<std::string>{"<root>", "conv", "fc"}));

    p.defaults.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
    r = resolvePlan(g, p, nullptr, "plan.json");
    ASSERT_EQ(unitNames(r), (std::vector<std::string>{"<root>", "conv", "bn", "fc"}));
    EXPECT_TRUE(r.units[2].batchNormRule);
    EXPECT_EQ(r.units[2].allGatherDtype, DType::Float32);  // mixed precision disabled
    EXPECT_EQ(r.units[1].allGatherDtype, DType::BFloat16);
    // FSDP2 has no such rule.
    p.api = PlanApi::Fsdp2;
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_EQ(unitNames(r), (std::vector<std::string>{"<root>", "conv", "fc"}));
}

TEST(FrozenParameters, Fsdp1MixedUnitsAreAnErrorWithoutOrigParams) {
    ModelGraph g;
    ModuleId blk = g.addModule(g.root(), "blk", "Block");
    leaf(g, blk, "frozen", 100, "Linear", false);
    leaf(g, blk, "train", 100);
    ASSERT_TRUE(g.finalize().ok());
    EXPECT_EQ(g.trainableParams(), 100);
    Plan p;
    p.api = PlanApi::Fsdp1;
    p.meshShape = {2};
    p.wrap = classPolicy({"Block"});
    p.fsdp1.useOrigParams = false;
    ResolvedPlan r = resolvePlan(g, p, nullptr, "plan.json");
    ASSERT_EQ(r.errorCount(), 1u);
    EXPECT_EQ(r.problems[0].message,
              "unit blk mixes frozen and trainable parameters, which FSDP1 rejects with "
              "use_orig_params=False");
    p.fsdp1.useOrigParams = true;
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_FALSE(r.hasErrors());
    ASSERT_EQ(r.problems.size(), 1u);
    EXPECT_EQ(r.problems[0].severity, Problem::Severity::Warning);
    p.api = PlanApi::Fsdp2;
    r = resolvePlan(g, p, nullptr, "plan.json");
    EXPECT_TRUE(r.problems.empty());
}

TEST(NamePattern, FullMatchOnQualifiedNames) {
    ModelGraph g;
    ModuleId layers = g.addModule(g.root(), "layers", "ModuleList", {"ModuleList"});
    for (int i = 0; i < 4; ++i)
        leaf(g, g.addModule(layers, std::to_string(i), "Block"), "lin", 10);
    ASSERT_TRUE(g.finalize().ok());
    WrapPolicySpec p;
    p.kind = WrapPolicySpec::Kind::NamePattern;
    p.patterns = {R"(layers\.[02])"};
    EXPECT_EQ(wrappedNames(g, p), (std::vector<std::string>{"layers.0", "layers.2"}));
    p.patterns = {"layers.(["};
    WrapOptions o;
    o.policy = p;
    EXPECT_FALSE(applyWrapPolicy(g, o).ok());
}
