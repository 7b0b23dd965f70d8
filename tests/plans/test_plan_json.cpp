// SPDX-License-Identifier: Apache-2.0
// Plan and cluster JSON: lossless round trips and messages that name the field.
#include <gtest/gtest.h>

#include <filesystem>

#include "plans/cluster/cluster.h"
#include "plans/core/json_reader.h"
#include "plans/plan/plan_json.h"
#include "tests/support/golden.h"

using namespace shardscope;
using shardscope::test::samplePath;

namespace {

std::string planError(const std::string& text) {
    auto j = parseJsonText(text, "plan.json");
    if (!j) return j.error();
    auto p = planFromJson(*j, "plan.json");
    return p.ok() ? std::string() : p.error();
}

const char* kHead = R"({"format": "shardscope.plan", "version": 1, )";

}  // namespace

TEST(PlanJson, EverySampleRoundTripsLosslessly) {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(samplePath("plans"))) {
        if (!e.is_regular_file() || e.path().extension() != ".json") continue;
        auto p = loadPlanFile(e.path().string());
        ASSERT_TRUE(p.ok()) << p.error();
        const nlohmann::json once = planToJson(*p);
        auto again = planFromJson(once, "again.json");
        ASSERT_TRUE(again.ok()) << again.error();
        EXPECT_EQ(*again, *p) << e.path();
        EXPECT_EQ(planToJson(*again), once) << e.path();
        ++n;
    }
    EXPECT_GE(n, 5);
}

TEST(PlanJson, ExplicitNullsAndAbsentFieldsStayDistinct) {
    auto j = parseJsonText(std::string(kHead) + R"("units": [
        {"modules": ["a"], "reshard_after_forward": null, "mixed_precision": null},
        {"modules": ["b"]}]})",
                           "plan.json");
    auto p = planFromJson(*j, "plan.json");
    ASSERT_TRUE(p.ok()) << p.error();
    EXPECT_TRUE(p->units[0].settings.reshardAfterForward.has_value());
    EXPECT_TRUE(p->units[0].settings.mixedPrecision.has_value());
    EXPECT_FALSE(p->units[1].settings.reshardAfterForward.has_value());
    const auto out = planToJson(*p);
    EXPECT_TRUE(out["units"][0]["reshard_after_forward"].is_null());
    EXPECT_FALSE(out["units"][1].contains("reshard_after_forward"));
}

TEST(PlanJson, ErrorsNameFileFieldAndExpectation) {
    const std::string h = kHead;
    EXPECT_EQ(planError(h + R"("units": [{"modules": ["a"]}, {"modules": ["b"]}, {"modules": ["c"]},
        {"modules": ["d"], "reshard_after_forward": "yes"}]})"),
              "plan.json:/units/3/reshard_after_forward: expected bool or int, got \"yes\"");
    EXPECT_EQ(planError(h + R"("units": [{"modules": ["a"], "reshard_after_forward": 0}]})"),
              "plan.json:/units/0/reshard_after_forward: an int reshard_after_forward must be >= "
              "1, got 0");
    EXPECT_EQ(planError(h + R"("api": "fsdp3"})"),
              "plan.json:/api: expected one of \"fsdp2\", \"fsdp1\", \"lightning\", got \"fsdp3\" "
              "(did you "
              "mean \"fsdp2\"?)");
    EXPECT_EQ(planError(h + R"("defaults": {"mixed_precision": {"param_dtype": "bf61"}}})"),
              "plan.json:/defaults/mixed_precision/param_dtype: unknown dtype \"bf61\" (did you "
              "mean \"bf16\"?)");
    EXPECT_EQ(planError(h + R"("defaults": {"reshard_after_froward": true}})"),
              "plan.json:/defaults/reshard_after_froward: unknown field \"reshard_after_froward\" "
              "(did you mean "
              "\"reshard_after_forward\"?)");
    EXPECT_EQ(
        planError(h + R"("fsdp1": {"sharding_strategy": "FULL_SHARD"}})"),
        "plan.json:/fsdp1: FSDP1 options need \"api\": \"fsdp1\" (this plan's api is \"fsdp2\")");
    EXPECT_EQ(planError(h + R"("mesh": {"shape": [2, 0]}})"),
              "plan.json:/mesh/shape/1: expected an integer >= 1, got 0");
    EXPECT_EQ(planError(h + R"("units": [{"modules": []}]})"),
              "plan.json:/units/0/modules: a unit needs at least one module");
    EXPECT_EQ(planError(R"({"format": "shardscope.cluster", "version": 1})"),
              "plan.json:/format: expected \"shardscope.plan\", got \"shardscope.cluster\"");
    EXPECT_EQ(planError(h + R"("api": "lightning", "lightning": {"fp32_reduce_scatter": true}})"),
              "plan.json:/lightning/fp32_reduce_scatter: fp32_reduce_scatter requires mixed "
              "precision: set "
              "compute_dtype (fairscale asserts mixed_precision)");
}

TEST(ClusterJson, SamplesLoadAndRoundTrip) {
    for (const char* f : {"h100-sxm-8x8.json", "h100-sxm-64x8.json", "h200-8x8.json",
                          "a100-80gb-8x8.json", "cpu-2core.json"}) {
        auto c = loadClusterFile(samplePath(std::string("clusters/") + f));
        ASSERT_TRUE(c.ok()) << c.error();
        auto back = clusterFromJson(clusterToJson(*c), "back.json");
        ASSERT_TRUE(back.ok()) << back.error();
        EXPECT_EQ(clusterToJson(*back), clusterToJson(*c));
        EXPECT_FALSE(c->sources.empty()) << f << " must cite its figures";
    }
    auto h100 = loadClusterFile(samplePath("clusters/h100-sxm-64x8.json"));
    EXPECT_EQ(h100->worldSize(), 512);
    EXPECT_DOUBLE_EQ(h100->device.peakFor(DType::BFloat16), 989e12);
    EXPECT_DOUBLE_EQ(h100->device.peakFor(DType::Int8), 67e12);  // falls back to fp32
}

TEST(ClusterJson, ErrorsNameTheField) {
    auto j = readJsonFile(samplePath("clusters/h100-sxm-8x8.json"));
    ASSERT_TRUE(j.ok());
    (*j)["device"]["peak_flops"]["bfloat16"] = -1;
    EXPECT_EQ(clusterFromJson(*j, "c.json").error(),
              "c.json:/device/peak_flops/bfloat16: expected a positive number, got -1");
    (*j)["device"]["peak_flops"] = {{"bf17", 1}};
    EXPECT_EQ(clusterFromJson(*j, "c.json").error(),
              "c.json:/device/peak_flops/bf17: unknown dtype \"bf17\" (did you mean \"bf16\"?)");
    (*j)["node"].erase("devices_per_node");
    (*j)["device"]["peak_flops"] = {{"bf16", 1}};
    EXPECT_EQ(clusterFromJson(*j, "c.json").error(),
              "c.json:/node: missing required field \"devices_per_node\"");
}

TEST(ClusterJson, AttentionCurvesUpToTwiceThePeak) {
    // flop_counter's FLOPs count all s x s of attention; a causal kernel does half, so its
    // efficiency against them reaches up to 2. A masked (sliding-window) kernel has its own
    // curve. Both load, round-trip, and refuse more than 2 naming the point.
    auto j = readJsonFile(samplePath("clusters/h200-8x8.json"));
    ASSERT_TRUE(j.ok());
    (*j)["sim"]["attention_efficiency"] = {{1e11, 1.2}, {1e12, 1.36}};
    (*j)["sim"]["masked_attention_efficiency"] = {{1e12, 0.45}};
    auto c = clusterFromJson(*j, "c.json");
    ASSERT_TRUE(c.ok()) << c.error();
    EXPECT_DOUBLE_EQ(c->sim.attentionEfficiencyFor(1e12), 1.36);
    EXPECT_DOUBLE_EQ(c->sim.maskedAttentionEfficiencyFor(1e12), 0.45);
    EXPECT_EQ(clusterToJson(*clusterFromJson(clusterToJson(*c), "back.json")), clusterToJson(*c));
    (*j)["sim"].erase("masked_attention_efficiency");
    c = clusterFromJson(*j, "c.json");
    EXPECT_DOUBLE_EQ(c->sim.maskedAttentionEfficiencyFor(1e12), 0.68);  // half, without a curve
    (*j)["sim"]["masked_attention_efficiency"] = {{1e12, 2.5}};
    EXPECT_EQ(clusterFromJson(*j, "c.json").error(),
              "c.json:/sim/masked_attention_efficiency/0/1: expected an efficiency in (0, 2.0], "
              "got 2.5");
}

// kernel_gap_ns (the device's time between queued kernels): loads, round-trips, and a value
// past a millisecond or below zero is refused naming the field.
TEST(ClusterJson, KernelGap) {
    auto j = readJsonFile(samplePath("clusters/h200-8x8.json"));
    ASSERT_TRUE(j.ok());
    (*j)["sim"]["kernel_gap_ns"] = 2200;
    auto c = clusterFromJson(*j, "c.json");
    ASSERT_TRUE(c.ok()) << c.error();
    EXPECT_DOUBLE_EQ(c->sim.kernelGapNs, 2200);
    EXPECT_EQ(clusterToJson(*clusterFromJson(clusterToJson(*c), "back.json")), clusterToJson(*c));
    (*j)["sim"]["kernel_gap_ns"] = 2000000;
    EXPECT_EQ(clusterFromJson(*j, "c.json").error(),
              "c.json:/sim/kernel_gap_ns: implausibly large (more than a millisecond per kernel)");
    (*j)["sim"]["kernel_gap_ns"] = -1;
    EXPECT_FALSE(clusterFromJson(*j, "c.json").ok());
}

// Activation checkpointing as users write it (issue 15): the spellings that load, and every
// bad spec refused naming the field.
TEST(PlanJson, ActivationCheckpointingSpellings) {
    const std::string h = kHead;
    auto acOf = [&](const std::string& spec) {
        auto j =
            nlohmann::json::parse(h + R"("defaults": {"activation_checkpointing": )" + spec + "}}");
        auto p = planFromJson(j, "plan.json");
        EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error());
        // Written back as read.
        const auto again = planFromJson(planToJson(*p), "again.json");
        EXPECT_TRUE(again.ok() && *again == *p);
        return p->defaults.activationCheckpointing->toString();
    };
    EXPECT_EQ(acOf(R"("none")"), "none");
    EXPECT_EQ(acOf(R"("full")"), "full");
    EXPECT_EQ(acOf(R"("selective_op")"), "selective_op");
    EXPECT_EQ(acOf(R"("attention")"), "attention");
    EXPECT_EQ(acOf(R"("selective")"), "attention");  // the earlier word, with a resolver warning
    EXPECT_EQ(acOf(R"({"mode": "full", "every": 2})"), "full every 2");
    EXPECT_EQ(acOf(R"({"mode": "selective_op", "save": ["mm", "sdpa"]})"),
              "selective_op [mm,sdpa]");

    const std::string d = h + R"("defaults": {"activation_checkpointing": )";
    EXPECT_EQ(planError(d + R"({"mode": "selective_op", "save": ["mm", "softmax"]}}})"),
              "plan.json:/defaults/activation_checkpointing/save/1: expected one of \"mm\", "
              "\"addmm\", \"bmm\", \"sdpa\", \"reduce_scatter\", \"max\", got \"softmax\"");
    EXPECT_EQ(planError(d + R"({"mode": "selective_op", "save": ["mmm"]}}})"),
              "plan.json:/defaults/activation_checkpointing/save/0: expected one of \"mm\", "
              "\"addmm\", \"bmm\", \"sdpa\", \"reduce_scatter\", \"max\", got \"mmm\" (did you "
              "mean \"mm\"?)");
    EXPECT_EQ(
        planError(d + R"({"mode": "full", "every": 0}}})"),
        "plan.json:/defaults/activation_checkpointing/every: expected an integer >= 1, got 0");
    EXPECT_EQ(
        planError(d + R"({"mode": "selective_op", "every": 2}}})"),
        "plan.json:/defaults/activation_checkpointing/every: \"every\" applies to mode \"full\" "
        "(checkpoint every k-th unit)");
    EXPECT_EQ(planError(d + R"({"mode": "full", "save": ["mm"]}}})"),
              "plan.json:/defaults/activation_checkpointing/save: \"save\" applies to mode "
              "\"selective_op\"");
    EXPECT_EQ(
        planError(d + R"({"mode": "selective_op", "save": []}}})"),
        "plan.json:/defaults/activation_checkpointing/save: a save list needs at least one op "
        "(omit it for torchtitan's preset)");
    EXPECT_EQ(
        planError(d + R"({"mode": "full", "evrey": 2}}})"),
        "plan.json:/defaults/activation_checkpointing/evrey: unknown field \"evrey\" (did you "
        "mean \"every\"?)");
}
