// SPDX-License-Identifier: Apache-2.0
// Kernel calibration recovers the machine its kernels ran on: samples timed by a cluster with
// known parameters (a GEMM curve, a by-bytes memory curve, a collective line) and fitted from
// a cluster that is wrong in each must predict the held-back kernels exactly; and the cluster
// format keeps the by-bytes curve and refuses a bad one.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/sim/cost_model.h"
#include "plans/cluster/cluster.h"
#include "engine/calibrate/kernel_fit.h"

using namespace shardscope;

namespace {

ClusterSpec machine() {
    ClusterSpec c;
    c.name = "test";
    c.device.name = "test GPU";
    c.device.memoryBytes = int64_t{80} << 30;
    c.device.peakFlops = {{DType::BFloat16, 1e15}, {DType::Float32, 1e14}};
    c.device.hbmBandwidth = 3e12;
    c.node.devicesPerNode = 8;
    c.node.intraBandwidth = 4e11;
    c.network.nicBandwidth = 5e10;
    c.host.linkBandwidth = 5e10;
    return c;
}

}  // namespace

TEST(KernelFit, RecoversTheMachineFromItsKernels) {
    ClusterSpec truth = machine();
    truth.sim.computeEfficiency = {{1e9, 0.2}, {1e11, 0.6}, {1e13, 0.7}};
    truth.sim.memoryEfficiencyByBytes = {{1e4, 0.02}, {1e6, 0.3}, {1e8, 0.8}};
    truth.sim.protocols = {{"truth", 20000, 0, 0, 1.0}};
    truth.node.intraBandwidth = 2e11 / truth.sim.intraEfficiency;
    truth.sim.attentionEfficiency = {{1e10, 0.25}, {1e12, 0.45}};
    KernelSamples all;
    for (int32_t step = 0; step < 4; ++step) {
        for (double f : {1e10, 1e12}) {
            KernelSample s;
            s.cls = KernelClass::Attention;
            s.step = step;
            s.flops = f;
            s.dtype = DType::BFloat16;
            s.durNs = static_cast<int64_t>(predictKernelNs(truth, s));
            all.samples.push_back(s);
        }
        // Launch to launch: 12 us on the fitted steps, 13 us on the held-back ones.
        for (int k = 0; k < 9; ++k)
            all.launchGaps.push_back({step, step % 2 ? 13000 : 12000});
        for (double f : {1e9, 1e11, 1e13}) {
            KernelSample s;
            s.cls = KernelClass::Gemm;
            s.step = step;
            s.flops = f;
            s.dtype = DType::BFloat16;
            s.durNs = static_cast<int64_t>(predictKernelNs(truth, s));
            all.samples.push_back(s);
        }
        for (double b : {1e4, 1e6, 1e8}) {
            KernelSample s;
            s.cls = KernelClass::MemoryBound;
            s.step = step;
            s.bytes = b;
            s.durNs = static_cast<int64_t>(predictKernelNs(truth, s));
            all.samples.push_back(s);
        }
        for (double b : {1e6, 1e8, 1e9}) {
            KernelSample s;
            s.cls = KernelClass::Collective;
            s.collective = "allgather";
            s.groupSize = 8;
            s.step = step;
            s.bytes = b;
            s.durNs = static_cast<int64_t>(predictKernelNs(truth, s));
            all.samples.push_back(s);
        }
    }
    ClusterSpec wrong = machine();  // the defaults: another curve, NCCL's protocols
    auto fit = fitKernels(all, wrong, "synthetic");
    ASSERT_TRUE(fit.ok()) << fit.error();
    EXPECT_NE(fit->split.find("ProfilerSteps 0, 2"), std::string::npos) << fit->split;
    ASSERT_EQ(fit->classes.size(), 4u);
    for (const auto& c : fit->classes) {
        SCOPED_TRACE(kernelClassName(c.cls));
        const int64_t perStep = c.cls == KernelClass::Attention ? 2 : 3;
        EXPECT_EQ(c.fitted, 2 * perStep);
        EXPECT_EQ(c.heldOut, 2 * perStep);
        EXPECT_GT(c.beforeMedianErr, 0.05);  // the starting cluster is wrong
        EXPECT_LT(c.afterMedianErr, 1e-3);
        EXPECT_NEAR(c.afterNs / c.measuredNs, 1.0, 1e-3);
    }
    EXPECT_NEAR(fit->cluster.sim.protocols.front().baseNs, 20000, 50);
    EXPECT_EQ(fit->cluster.sim.cpuLaunchNs, 12000);
    EXPECT_EQ(fit->launch.fitted, 18);
    EXPECT_EQ(fit->launch.heldBackNs, 13000);
    // The fitted cluster is a valid cluster file, by-bytes curve included.
    auto back = clusterFromJson(clusterToJson(fit->cluster), "fitted.json");
    ASSERT_TRUE(back.ok()) << back.error();
    EXPECT_EQ(back->sim.memoryEfficiencyByBytes.size(), 3u);
    EXPECT_NEAR(back->sim.memoryEfficiencyFor(1e6), 0.3, 1e-3);  // durations are whole ns
    EXPECT_NEAR(back->sim.attentionEfficiencyFor(1e12), 0.45, 1e-3);
    EXPECT_EQ(back->sim.cpuLaunchNs, 12000);
}

TEST(KernelFit, OperatorsOfOneSizeRunAtTheirOwnSpeed) {
    // A copy and a norm of the same sizes: one curve by bytes cannot price both (its median
    // lands on one of them); each operator with enough kernels gets its own curve, and an
    // operator seen too rarely falls back to the curve by bytes.
    ClusterSpec truth = machine();
    truth.sim.memoryEfficiencyByOp = {{"aten::copy_", {{1e5, 0.3}, {1e7, 0.9}}},
                                      {"aten::native_layer_norm", {{1e5, 0.05}, {1e7, 0.3}}}};
    truth.sim.memoryEfficiencyByBytes = {{1e5, 0.1}, {1e7, 0.5}};
    KernelSamples all;
    for (int32_t step = 0; step < 4; ++step)
        for (const char* op : {"aten::copy_", "aten::native_layer_norm", "aten::add"})
            for (double b : {1e5, 1e6, 1e7}) {
                if (std::string(op) == "aten::add" && (b != 1e6 || step % 2 == 0)) continue;
                KernelSample s;
                s.cls = KernelClass::MemoryBound;
                s.step = step;
                s.bytes = b;
                s.op = op;
                s.durNs = static_cast<int64_t>(predictKernelNs(truth, s));
                all.samples.push_back(s);
            }
    ClusterSpec wrong = machine();
    auto fit = fitKernels(all, wrong, "synthetic");
    ASSERT_TRUE(fit.ok()) << fit.error();
    const auto& byOp = fit->cluster.sim.memoryEfficiencyByOp;
    // aten::add: no fitted kernel (held back only); the modules' curve (kModuleKernelsKey),
    // which a step program's memory-bound entries take, pools both operators' kernels by
    // their bytes over their time.
    ASSERT_EQ(byOp.size(), 3u);
    EXPECT_NEAR(fit->cluster.sim.memoryEfficiencyFor(1e6, kModuleKernelsKey),
                2.0 / (1.0 / 0.6 + 1.0 / 0.175), 1e-3);
    EXPECT_NEAR(fit->cluster.sim.memoryEfficiencyFor(1e6, "aten::copy_"), 0.6, 1e-3);
    EXPECT_NEAR(fit->cluster.sim.memoryEfficiencyFor(1e6, "aten::native_layer_norm"), 0.175, 1e-3);
    EXPECT_EQ(fit->cluster.sim.memoryEfficiencyFor(1e6, "aten::add"),
              fit->cluster.sim.memoryEfficiencyFor(1e6));
    const auto& mem = fit->classes[0];
    ASSERT_EQ(mem.cls, KernelClass::MemoryBound);
    // The copies and norms exact; the adds, priced by the pooled curve, are not.
    EXPECT_LT(mem.afterMedianErr, 1e-3);
    auto back = clusterFromJson(clusterToJson(fit->cluster), "fitted.json");
    ASSERT_TRUE(back.ok()) << back.error();
    EXPECT_EQ(back->sim.memoryEfficiencyByOp, byOp);

    nlohmann::json j = clusterToJson(machine());
    j["sim"]["memory_efficiency_by_op"] = {{"aten::add", {{1e6, 1.5}}}};
    auto bad = clusterFromJson(j, "c.json");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().find("c.json:/sim/memory_efficiency_by_op/aten::add/0/1"),
              std::string::npos)
        << bad.error();
    j["sim"]["memory_efficiency_by_op"] = nlohmann::json::array();
    bad = clusterFromJson(j, "c.json");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().find("memory_efficiency_by_op"), std::string::npos) << bad.error();
}

TEST(KernelFit, NothingToPriceIsAnError) {
    KernelSamples none;
    none.deviceKernels = 12;
    auto fit = fitKernels(none, machine(), "t.json");
    ASSERT_FALSE(fit.ok());
    EXPECT_NE(fit.error().find("t.json: no kernel could be priced"), std::string::npos);
}

TEST(KernelFit, ClusterRefusesABadByBytesCurve) {
    nlohmann::json j = clusterToJson(machine());
    j["sim"]["memory_efficiency_by_bytes"] = {{1e6, 0.5}, {1e4, 0.2}};
    auto c = clusterFromJson(j, "c.json");
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.error().find("memory_efficiency_by_bytes"), std::string::npos) << c.error();
    EXPECT_NE(c.error().find("increasing bytes"), std::string::npos) << c.error();
    j["sim"]["memory_efficiency_by_bytes"] = {{1e6, 1.5}};
    c = clusterFromJson(j, "c.json");
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.error().find("fraction"), std::string::npos) << c.error();
}

TEST(KernelSamples, CollectiveKindsAndDevices) {
    EXPECT_EQ(collectiveKind("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"), "allreduce");
    EXPECT_EQ(collectiveKind("_allgather_base"), "allgather");
    EXPECT_EQ(collectiveKind("all_gather_into_tensor"), "allgather");
    EXPECT_EQ(collectiveKind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"), "reduce_scatter");
    EXPECT_EQ(collectiveKind("aten::mm"), "");
    EXPECT_TRUE(sameDevice("NVIDIA A100-PG509-200", "NVIDIA A100 SXM4 80GB"));
    EXPECT_TRUE(sameDevice("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"));
    EXPECT_FALSE(sameDevice("NVIDIA B200", "NVIDIA H200 SXM 141GB"));
}

// cuBLAS runs GEMMs of one FLOP count at different rates by shape (a linear layer's forward,
// input gradient and weight gradient): the fit keeps each shape's own efficiency, predicts
// held-back kernels of each shape by it, and the cluster file keeps the table and refuses a
// bad one.
TEST(KernelFit, GemmShapesKeepTheirOwnRates) {
    ClusterSpec truth = machine();
    truth.sim.gemmEfficiencyByShape = {{32, 1000, 2048, DType::Float32, 0.27},
                                       {32, 2048, 1000, DType::Float32, 0.27},
                                       {1000, 2048, 32, DType::Float32, 0.36}};
    KernelSamples all;
    for (int32_t step = 0; step < 4; ++step)
        for (const auto& g : truth.sim.gemmEfficiencyByShape) {
            KernelSample s;
            s.cls = KernelClass::Gemm;
            s.step = step;
            s.m = g.m;
            s.n = g.n;
            s.k = g.k;
            s.flops = 2.0 * 32 * 1000 * 2048;
            s.durNs = static_cast<int64_t>(predictKernelNs(truth, s));
            all.samples.push_back(s);
        }
    auto fit = fitKernels(all, machine(), "fc.json");
    ASSERT_TRUE(fit.ok()) << fit.error();
    const auto& table = fit->cluster.sim.gemmEfficiencyByShape;
    ASSERT_EQ(table.size(), 3u);
    for (const auto& g : truth.sim.gemmEfficiencyByShape)
        EXPECT_NEAR(fit->cluster.sim.gemmEfficiencyFor(1, g.m, g.n, g.k, DType::Float32),
                    g.efficiency, 1e-3);
    // Another dtype or shape: the FLOPs curve.
    EXPECT_EQ(fit->cluster.sim.gemmEfficiencyFor(4e9, 32, 1000, 2048, DType::BFloat16),
              fit->cluster.sim.efficiencyFor(4e9));
    const auto& gemm = fit->classes[0];
    ASSERT_EQ(gemm.cls, KernelClass::Gemm);
    EXPECT_LT(std::abs(gemm.afterNs / gemm.measuredNs - 1), 1e-3);
    EXPECT_LT(gemm.afterMedianErr, 1e-3);
    EXPECT_NE(fit->cluster.sources.count("/sim/gemm_efficiency_by_shape"), 0u);

    auto back = clusterFromJson(clusterToJson(fit->cluster), "fitted.json");
    ASSERT_TRUE(back.ok()) << back.error();
    EXPECT_EQ(back->sim.gemmEfficiencyByShape, table);

    nlohmann::json j = clusterToJson(machine());
    j["sim"]["gemm_efficiency_by_shape"] = {
        {{"m", 32}, {"n", 1000}, {"k", 2048}, {"dtype", "float23"}, {"efficiency", 0.3}}};
    auto bad = clusterFromJson(j, "c.json");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().find("c.json:/sim/gemm_efficiency_by_shape/0/dtype"), std::string::npos)
        << bad.error();
    j["sim"]["gemm_efficiency_by_shape"][0]["dtype"] = "float32";
    j["sim"]["gemm_efficiency_by_shape"][0]["efficiency"] = 1.5;
    bad = clusterFromJson(j, "c.json");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().find("/sim/gemm_efficiency_by_shape/0/efficiency"), std::string::npos)
        << bad.error();
    j["sim"]["gemm_efficiency_by_shape"][0]["efficiency"] = 0.3;
    j["sim"]["gemm_efficiency_by_shape"].push_back(j["sim"]["gemm_efficiency_by_shape"][0]);
    bad = clusterFromJson(j, "c.json");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().find("listed twice"), std::string::npos) << bad.error();
    j["sim"]["gemm_efficiency_by_shape"][1]["m"] = 0;
    bad = clusterFromJson(j, "c.json");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().find("/sim/gemm_efficiency_by_shape/1/m"), std::string::npos)
        << bad.error();
}

namespace {

// Samples that price: one GEMM a step, timed by the machine itself (fitKernels needs some).
KernelSamples withGemms(int32_t steps) {
    KernelSamples all;
    for (int32_t step = 0; step < steps; ++step) {
        KernelSample g;
        g.cls = KernelClass::Gemm;
        g.step = step;
        g.flops = 1e12;
        g.dtype = DType::BFloat16;
        g.durNs = 2000000;
        all.samples.push_back(g);
    }
    return all;
}

}  // namespace

TEST(KernelFit, EachThreadsLaunchRateWithoutTheProfilersShare) {
    using L = KernelSamples::Launcher;
    KernelSamples all = withGemms(4);
    for (int32_t step = 0; step < 4; ++step) {
        const bool held = step % 2 == 1;
        for (int k = 0; k < 25; ++k) {
            // The means: 60 us (forward), 40 us (backward) on the fitted steps; the optimizer's
            // 9 us launches are most of the step's and set cpu_launch_ns (their median).
            all.launchGaps.push_back({step, 50000, L::Forward});
            all.launchGaps.push_back({step, 70000, L::Forward});
            all.launchGaps.push_back({step, held ? 44000 : 40000, L::Backward});
            for (int o = 0; o < 6; ++o)
                all.launchGaps.push_back({step, 9000, L::Optimizer});
        }
        all.launcherEvents.push_back({step, L::Forward, 25, 200});   // 8 events a kernel
        all.launcherEvents.push_back({step, L::Backward, 25, 250});  // 10
    }
    ClusterSpec base = machine();
    auto fit = fitKernels(all, base, "synthetic");
    ASSERT_TRUE(fit.ok()) << fit.error();
    EXPECT_EQ(fit->launchForward.fitted, 100);
    EXPECT_EQ(fit->launchForward.fittedNs, 60000);
    EXPECT_EQ(fit->launchBackward.fittedNs, 40000);
    EXPECT_EQ(fit->launchBackward.heldBackNs, 44000);
    EXPECT_EQ(fit->cluster.sim.cpuLaunchNs, 9000);
    EXPECT_DOUBLE_EQ(fit->eventsPerLaunchForward, 8);
    EXPECT_DOUBLE_EQ(fit->eventsPerLaunchBackward, 10);
    // Without a profiler figure the rates are the profiled run's.
    EXPECT_EQ(fit->cluster.sim.cpuLaunchForwardNs, 60000);
    EXPECT_EQ(fit->cluster.sim.cpuLaunchBackwardNs, 40000);
    EXPECT_EQ(fit->cluster.sim.profilerNsPerEvent, 0);
    // With the base cluster's 2 us an event: 60 - 8 x 2 and 40 - 10 x 2.
    base.sim.profilerNsPerEvent = 2000;
    fit = fitKernels(all, base, "synthetic");
    ASSERT_TRUE(fit.ok()) << fit.error();
    EXPECT_EQ(fit->cluster.sim.cpuLaunchForwardNs, 44000);
    EXPECT_EQ(fit->cluster.sim.cpuLaunchBackwardNs, 20000);
    EXPECT_NE(fit->cluster.sources["/sim/cpu_launch_backward_ns"].find("less 2000 ns"),
              std::string::npos)
        << fit->cluster.sources["/sim/cpu_launch_backward_ns"];
    // Never below a quarter of the profiled rate: 40 - 10 x 5 would be negative.
    applyProfilerOverhead(*fit, 5000, "a test");
    EXPECT_EQ(fit->cluster.sim.cpuLaunchForwardNs, 20000);
    EXPECT_EQ(fit->cluster.sim.cpuLaunchBackwardNs, 10000);
    // The cluster file keeps all three.
    auto back = clusterFromJson(clusterToJson(fit->cluster), "fitted.json");
    ASSERT_TRUE(back.ok()) << back.error();
    EXPECT_EQ(back->sim.cpuLaunchForwardNs, 20000);
    EXPECT_EQ(back->sim.cpuLaunchBackwardNs, 10000);
    EXPECT_EQ(back->sim.profilerNsPerEvent, 5000);
    // A trace without the model's thread told apart (no ProfilerSteps: every launch is on
    // "another" thread) fits no per-thread rate.
    KernelSamples one = withGemms(4);
    for (int32_t step = 0; step < 4; ++step)
        for (int k = 0; k < 25; ++k)
            one.launchGaps.push_back({step, 40000, L::Backward});
    fit = fitKernels(one, machine(), "synthetic");
    ASSERT_TRUE(fit.ok()) << fit.error();
    EXPECT_EQ(fit->cluster.sim.cpuLaunchForwardNs, 0);
    EXPECT_EQ(fit->cluster.sim.cpuLaunchBackwardNs, 0);
}

TEST(KernelFit, ChunkCatsHostTimeIsItsLowerQuartilePerBlock) {
    // The block table's host time per block of one chunk: the lower quartile of the fitted
    // steps' copy-ins (the host is slower at it while the device lags), copy-ins under
    // 65,536 blocks left out (their fixed costs would weigh), the held-back steps' summed.
    KernelSamples all = withGemms(4);
    for (int32_t step = 0; step < 4; ++step) {
        for (int k = 0; k < 4; ++k)  // 3, 4, 5, 9 ns a block on every step
            all.chunkCatHost.push_back({step, 100000, int64_t{100000} * (k == 3 ? 9 : 3 + k)});
        all.chunkCatHost.push_back({step, 1000, 50000000});  // small: out
    }
    auto fit = fitKernels(all, machine(), "synthetic");
    ASSERT_TRUE(fit.ok()) << fit.error();
    EXPECT_EQ(fit->chunkCatHost.fitted, 8);
    EXPECT_DOUBLE_EQ(fit->cluster.sim.chunkCatHostNsPerBlock, 3);  // of 3 3 4 4 5 5 9 9
    EXPECT_EQ(fit->chunkCatHost.heldBack, 8);
    EXPECT_DOUBLE_EQ(fit->chunkCatHost.heldBackMeasuredNs, 2 * 100000.0 * (3 + 4 + 5 + 9));
    EXPECT_DOUBLE_EQ(fit->chunkCatHost.heldBackPredictedNs, 8 * 100000.0 * 3);
    // Only small copy-ins (many ranks): nothing fitted, and a note says why.
    KernelSamples small = withGemms(4);
    for (int32_t step = 0; step < 4; ++step)
        small.chunkCatHost.push_back({step, 4000, 400000});
    fit = fitKernels(small, machine(), "synthetic");
    ASSERT_TRUE(fit.ok()) << fit.error();
    EXPECT_EQ(fit->cluster.sim.chunkCatHostNsPerBlock, 0);
    bool noted = false;
    for (const auto& n : fit->notes)
        noted |= n.find("chunk_cat_host_ns_per_block kept") != std::string::npos;
    EXPECT_TRUE(noted);
}

TEST(KernelFit, ClusterRefusesBadHostFigures) {
    for (const auto& [field, value] :
         {std::pair{"chunk_cat_host_ns_per_block", nlohmann::json(-1)},
          std::pair{"chunk_cat_host_ns_per_block", nlohmann::json("fast")},
          std::pair{"profiler_ns_per_event", nlohmann::json(2e6)},
          std::pair{"cpu_launch_forward_ns", nlohmann::json(-5)},
          std::pair{"cpu_launch_backward_ns", nlohmann::json(2e9)}}) {
        nlohmann::json j = clusterToJson(machine());
        j["sim"][field] = value;
        auto c = clusterFromJson(j, "c.json");
        ASSERT_FALSE(c.ok()) << field;
        EXPECT_NE(c.error().find(std::string("/sim/") + field), std::string::npos) << c.error();
    }
}
