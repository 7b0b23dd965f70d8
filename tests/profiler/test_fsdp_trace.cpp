// SPDX-License-Identifier: Apache-2.0
// FSDP structure on a GPU trace: the collective a c10d op issued is the NCCL kernel its
// launch flows to, and its exposed time is the part no compute kernel covered. The real
// FSDP traces these tests cannot record without a GPU are built here event by event, as
// Kineto writes them (the CPU side is checked against real FSDP2 and FSDP1 runs in
// tests/python/test_fsdp_traces.py).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "profiler/analysis/fsdp_trace.h"
#include "profiler/import/kineto_import.h"
#include "tests/support/golden.h"

using namespace shardscope;
using Json = nlohmann::json;

namespace {

Json x(const char* cat, const std::string& name, int tid, double ts, double dur,
       Json args = nullptr) {
    Json e = {{"ph", "X"},  {"cat", cat}, {"name", name}, {"pid", 1},
              {"tid", tid}, {"ts", ts},   {"dur", dur}};
    if (!args.is_null()) e["args"] = std::move(args);
    return e;
}
Json flow(const char* ph, int id, int tid, double ts) {
    Json e = {{"ph", ph}, {"id", id},   {"cat", "ac2g"}, {"name", "ac2g"},
              {"pid", 1}, {"tid", tid}, {"ts", ts}};
    if (std::string(ph) == "f") e["bp"] = "e";
    return e;
}

}  // namespace

TEST(FsdpTrace, GpuCollectivesAreTheKernelsTheirLaunchesFlowTo) {
    Json ev = Json::array();
    const Json bf16 = {{"Input Dims", {{8}, {4}}},
                       {"Input type", {"c10::BFloat16", "c10::BFloat16"}}};
    const Json rs = {{"Input Dims", {{4}, {8}}}, {"Input type", {"float", "float"}}};
    ev.push_back(x("user_annotation", "ProfilerStep#1", 1, 0, 1000));
    ev.push_back(x("user_annotation", "FSDP::root_pre_forward", 1, 1, 1));
    ev.push_back(x("user_annotation", "FSDP::pre_forward (model.layers.0)", 1, 10, 30));
    ev.push_back(x("user_annotation", "FSDP::all_gather (model.layers.0)", 1, 11, 19));
    ev.push_back(x("cpu_op", "c10d::_allgather_base_", 1, 12, 8, bf16));
    ev.push_back(x("cuda_runtime", "cudaLaunchKernel", 1, 13, 2, {{"correlation", 1}}));
    ev.push_back(flow("s", 1, 1, 13));
    ev.push_back(x("kernel", "ncclDevKernel_AllGather_RING_LL", 8, 16, 40,
                   {{"stream", 8}, {"correlation", 1}}));
    ev.push_back(flow("f", 1, 8, 16));
    ev.push_back(x("kernel", "sm90_gemm", 7, 40, 10, {{"stream", 7}, {"correlation", 5}}));
    ev.push_back(x("user_annotation", "FSDP::post_forward (model.layers.0)", 1, 100, 1));
    ev.push_back(x("user_annotation", "FSDP::pre_backward (model.layers.0)", 1, 200, 10));
    ev.push_back(
        x("user_annotation", "FSDP::post_backward_accumulate (model.layers.0)", 1, 300, 1));
    ev.push_back(x("user_annotation", "FSDP::post_backward_reduce (model.layers.0)", 1, 302, 38));
    ev.push_back(x("cpu_op", "c10d::_reduce_scatter_base_", 1, 303, 2, rs));
    ev.push_back(x("cuda_runtime", "cudaLaunchKernel", 1, 303.5, 0.5, {{"correlation", 2}}));
    ev.push_back(flow("s", 2, 1, 303.5));
    ev.push_back(x("kernel", "ncclDevKernel_ReduceScatter_RING_LL", 8, 306, 14,
                   {{"stream", 8}, {"correlation", 2}}));
    ev.push_back(flow("f", 2, 8, 306));
    ev.push_back(x("kernel", "sm90_gemm_bwd", 7, 300, 30, {{"stream", 7}, {"correlation", 6}}));
    const Json trace = {{"distributedInfo", {{"rank", 0}, {"world_size", 2}}}, {"traceEvents", ev}};
    const std::string path =
        (shardscope::test::testTempDir() / "shardscope_fsdp_gpu.json").string();
    std::ofstream(path) << trace.dump();
    auto t = importKinetoFile(path);
    ASSERT_TRUE(t.ok()) << t.error();

    const FsdpTraceAnalysis a = analyzeFsdp(*t);
    EXPECT_EQ(a.api, "fsdp2");
    EXPECT_TRUE(a.gpu);
    EXPECT_EQ(a.unmatched, 0);
    ASSERT_EQ(a.units.size(), 1u);
    const FsdpUnit& u = a.units[0];
    EXPECT_EQ(u.name, "model.layers.0");
    // The all-gather kernel ran 16-56 us; the gemm covered 40-50: 30 us exposed.
    EXPECT_EQ(u.forward.allGathers, 1);
    EXPECT_EQ(u.forward.allGatherNs, 40000);
    EXPECT_EQ(u.forward.allGatherExposedNs, 30000);
    EXPECT_EQ(u.forward.minDistance, 0);
    // The reduce-scatter (306-320 us) ran under the backward gemm (300-330): hidden.
    EXPECT_EQ(u.backward.reduceScatters, 1);
    EXPECT_EQ(u.backward.reduceScatterNs, 14000);
    EXPECT_EQ(u.backward.reduceScatterExposedNs, 0);
    EXPECT_EQ(u.forwardGroup, 2);
    EXPECT_EQ(u.allGatherDtype, "c10::BFloat16");

    const RecoveredPlan r = recoverPlan(a, path);
    ASSERT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.plan.meshShape, std::vector<int64_t>{2});
    ASSERT_TRUE(r.plan.defaults.mixedPrecision.has_value());
    EXPECT_EQ(r.plan.defaults.mixedPrecision->paramDtype, DType::BFloat16);
    EXPECT_EQ(r.plan.defaults.mixedPrecision->reduceDtype, DType::Float32);
    // No backward all-gather: the unit was kept unsharded after forward.
    EXPECT_EQ(r.plan.defaults.reshardAfterForward, ReshardSetting::ofBool(false));
}
