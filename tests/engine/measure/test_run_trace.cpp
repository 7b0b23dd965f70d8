// SPDX-License-Identifier: Apache-2.0
// `shardscope run --trace` from ranks' results, including a CUDA rank's CUPTI recording:
// the merged trace is read back by the PyTorch-profiler importer, which must see the GPU
// streams, the NCCL kernel as a collective, and each launch bound to its kernel.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <tuple>

#include "engine/measure/run_trace.h"
#include "engine/measure/step_trace.h"
#include "engine/measure/trace_diff.h"
#include "profiler/import/kineto_import.h"
#include "profiler/record/device_activity.h"
#include "tests/support/golden.h"

namespace shardscope::cli {
namespace {

using record::DeviceActivity;
using record::DeviceOp;
using record::DeviceOpKind;

DeviceOp dop(DeviceOpKind k, int32_t name, int64_t s, int64_t e, uint32_t stream, uint32_t corr,
             int64_t external = record::kNoExternalId, int64_t bytes = 0) {
    DeviceOp op;
    op.kind = k;
    op.name = name;
    op.startNs = s;
    op.endNs = e;
    op.stream = stream;
    op.correlation = corr;
    op.external = external;
    op.bytes = bytes;
    return op;
}

nlohmann::json rankResult(int rank, bool withDevice) {
    const int64_t t = 1'000'000'000;
    nlohmann::json r;
    r["rank"] = rank;
    r["measured_start_ns"] = t;
    r["warmup_steps"] = 1;
    r["units"] = {"<root>", "model.layers.0"};
    r["ops"] = nlohmann::json::array({{{"op_id", 0},
                                       {"step", 1},
                                       {"kind", "all_gather"},
                                       {"phase", "forward"},
                                       {"stream", "all_gather"},
                                       {"unit", 1},
                                       {"micro_batch", 0},
                                       {"start_ns", t + 1000},
                                       {"end_ns", t + 9000},
                                       {"bytes", 4096}},
                                      {{"op_id", 2},
                                       {"step", 1},
                                       {"kind", "forward"},
                                       {"phase", "forward"},
                                       {"stream", "compute"},
                                       {"unit", 1},
                                       {"micro_batch", 0},
                                       {"start_ns", t + 10000},
                                       {"end_ns", t + 20000},
                                       {"bytes", 0}}});
    r["step_spans_ns"] = nlohmann::json::array({{t, t + 30000}});
    r["memory_timeline"] = nlohmann::json::array({{t, 100}, {t + 5000, 300}});
    if (withDevice) {
        DeviceActivity a;
        a.names = {"cudaLaunchKernel", "ncclDevKernel_AllGather_RING_LL", "ampere_sgemm_128x64",
                   "cudaStreamSynchronize", "Memcpy HtoD"};
        a.ops = {dop(DeviceOpKind::RuntimeApi, 0, t + 1100, t + 1300, 4242, 5, 0),
                 dop(DeviceOpKind::Kernel, 1, t + 2000, t + 8000, 13, 5, 0),
                 dop(DeviceOpKind::RuntimeApi, 0, t + 10100, t + 10200, 4242, 6, 1),
                 dop(DeviceOpKind::Kernel, 2, t + 10300, t + 19000, 7, 6, 1),
                 dop(DeviceOpKind::RuntimeApi, 3, t + 19100, t + 19200, 4242, 9),
                 dop(DeviceOpKind::Memcpy, 4, t + 21000, t + 22000, 7, 11, record::kNoExternalId,
                     1 << 20)};
        a.memory = {{t + 500, 1 << 20, 0xA000, 0}, {t + 600, -(1 << 10), 0xF000, 0}};
        r["device_activity"] = record::toJson(a);
    }
    return r;
}

TEST(RunTrace, CudaRanksCarryTheirGpuWorkInKinetoTerms) {
    const nlohmann::json trace =
        mergedTrace({rankResult(0, true), rankResult(1, false)}, "p", {{"device", "cuda"}});
    const auto path = shardscope::test::testTempDir() / "shardscope_run_trace_test.json";
    std::ofstream(path) << trace.dump();
    auto t = importKinetoFile(path.string());
    std::filesystem::remove(path);
    ASSERT_TRUE(t.ok()) << t.error();

    int32_t nccl = -1, gemm = -1, launch0 = -1, launch1 = -1, memcpy = -1, sync = -1;
    for (size_t i = 0; i < t->size(); ++i) {
        const std::string& n = t->strings.at(t->name[i]);
        const auto idx = static_cast<int32_t>(i);
        if (n == "ncclDevKernel_AllGather_RING_LL") nccl = idx;
        if (n == "ampere_sgemm_128x64") gemm = idx;
        if (n == "Memcpy HtoD") memcpy = idx;
        if (n == "cudaStreamSynchronize") sync = idx;
        if (n == "cudaLaunchKernel") (launch0 < 0 ? launch0 : launch1) = idx;
    }
    ASSERT_GE(nccl, 0);
    ASSERT_GE(gemm, 0);
    ASSERT_GE(memcpy, 0);
    ASSERT_GE(sync, 0);
    ASSERT_GE(launch1, 0);
    // GPU ops on device-stream lanes named by stream, one lane per stream; calls on a host lane.
    const Lane& ncclLane = t->lanes[static_cast<size_t>(t->lane[static_cast<size_t>(nccl)])];
    EXPECT_EQ(ncclLane.kind, LaneKind::DeviceStream);
    EXPECT_EQ(ncclLane.name, "rank 0 \u00b7 GPU 0 stream 13");
    EXPECT_EQ(ncclLane.rank, 0);
    EXPECT_NE(t->lane[static_cast<size_t>(nccl)], t->lane[static_cast<size_t>(gemm)]);
    EXPECT_EQ(t->lane[static_cast<size_t>(gemm)], t->lane[static_cast<size_t>(memcpy)]);
    EXPECT_EQ(t->lanes[static_cast<size_t>(t->lane[static_cast<size_t>(launch0)])].kind,
              LaneKind::HostThread);
    // The NCCL kernel is communication and a collective; the GEMM is computation.
    EXPECT_EQ(t->cls[static_cast<size_t>(nccl)], EventClass::Communication);
    EXPECT_EQ(t->cls[static_cast<size_t>(gemm)], EventClass::Computation);
    bool found = false;
    for (const auto& c : t->collectives)
        found = found || c.event == nccl;
    EXPECT_TRUE(found);
    // Each launch is bound to the kernel it queued; the synchronize call has no flow.
    EXPECT_EQ(t->orphanFlowEnds, 0);
    std::set<std::pair<int32_t, int32_t>> flows(t->flowEvents.begin(), t->flowEvents.end());
    EXPECT_EQ(flows.size(), 2u);
    EXPECT_TRUE(flows.count({launch0, nccl}));
    EXPECT_TRUE(flows.count({launch1, gemm}));
    // The FSDP ops of the CUDA rank are host launches: host lanes, not device work; the CPU
    // rank's ops stay device-stream rows (they are the work there).
    int fsdpOps = 0;
    for (size_t i = 0; i < t->size(); ++i) {
        const Lane& l = t->lanes[static_cast<size_t>(t->lane[i])];
        if (t->strings.at(t->name[i]) != "model.layers.0 all gather") continue;
        ++fsdpOps;
        EXPECT_EQ(l.kind, l.rank == 0 ? LaneKind::HostThread : LaneKind::DeviceStream) << l.name;
        EXPECT_EQ(t->cls[i], l.rank == 0 ? EventClass::Cpu : EventClass::Communication);
    }
    EXPECT_EQ(fsdpOps, 2);  // one per rank
    // The importer joins each labelled GPU op to its FSDP op's unit and phase.
    EXPECT_EQ(t->strings.at(t->unit[static_cast<size_t>(nccl)]), "model.layers.0");
    EXPECT_EQ(t->strings.at(t->phase[static_cast<size_t>(nccl)]), "forward");
    EXPECT_EQ(t->opId[static_cast<size_t>(nccl)], 0);
    EXPECT_EQ(t->opId[static_cast<size_t>(gemm)], 2);
    EXPECT_EQ(t->unit[static_cast<size_t>(memcpy)], -1);  // launched under no FSDP op
    // Times line up with the FSDP ops: the kernel lies inside its all-gather op.
    EXPECT_EQ(t->start[static_cast<size_t>(nccl)] - t->start[static_cast<size_t>(launch0)], 900);

    // The FSDP op that launched each GPU op rides in its args.
    bool labelled = false;
    for (const auto& e : trace["traceEvents"])
        if (e.value("name", "") == "ncclDevKernel_AllGather_RING_LL") {
            EXPECT_EQ(e["args"]["fsdp_unit"], "model.layers.0");
            EXPECT_EQ(e["args"]["fsdp_op"], "all_gather");
            EXPECT_EQ(e["args"]["fsdp_op_id"], 0);
            EXPECT_EQ(e["args"]["stream"], 13);
            labelled = true;
        }
    EXPECT_TRUE(labelled);
    // Device memory: what was allocated while recording; the free of older memory is ignored.
    int64_t lastReserved = -1;
    for (const auto& e : trace["traceEvents"])
        if (e.value("ph", "") == "C" && e.value("name", "").rfind("device memory", 0) == 0)
            lastReserved = e["args"]["reserved"].get<int64_t>();
    EXPECT_EQ(lastReserved, 1 << 20);
}

TEST(RunTrace, AKernelLaunchedInsideAComputeOpIsThatOps) {
    // The engine records a unit's forward when it ends, so CUPTI files the kernels launched
    // during it under the op before (seen on an H200: every forward kernel under the last
    // all-gather). A launch at 12 us lies in the forward's host span (10..20 us), outside the
    // all-gather's (1..9 us): the trace names the forward. A launch inside the op it was
    // filed under keeps it.
    nlohmann::json r = rankResult(0, true);
    DeviceActivity a = record::deviceActivityFromJson(r["device_activity"]);
    const int64_t t = 1'000'000'000;
    a.names.push_back("stale_kernel");
    const auto name = static_cast<int32_t>(a.names.size() - 1);
    a.ops.push_back(dop(DeviceOpKind::RuntimeApi, 0, t + 12000, t + 12100, 4242, 20, 0));
    a.ops.push_back(dop(DeviceOpKind::Kernel, name, t + 12200, t + 12900, 7, 20, 0));
    r["device_activity"] = record::toJson(a);
    const nlohmann::json trace = mergedTrace({r}, "p", {{"device", "cuda"}});
    int seen = 0;
    for (const auto& e : trace["traceEvents"]) {
        const std::string n = e.value("name", "");
        if (n == "stale_kernel") {
            EXPECT_EQ(e["args"]["fsdp_op_id"], 2);
            EXPECT_EQ(e["args"]["fsdp_op"], "forward");
            ++seen;
        }
        if (n == "ncclDevKernel_AllGather_RING_LL") {
            EXPECT_EQ(e["args"]["fsdp_op_id"], 0);
            ++seen;
        }
    }
    EXPECT_EQ(seen, 2);
}

TEST(RunTrace, ACudaRanksPeakIsTheDevicesNotTheHosts) {
    // The host recorder sees none of the caching allocator's memory: a CUDA rank's peak
    // (torch.cuda.max_memory_allocated) comes back from the trace, not the host counter's.
    nlohmann::json r = rankResult(0, true);
    r["peak_allocated_bytes"] = int64_t{38'533'842'432};  // measured on an H200
    const auto path = shardscope::test::testTempDir() / "shardscope_cuda_peak_test.json";
    std::ofstream(path) << mergedTrace({r}, "p", {{"device", "cuda"}}).dump();
    auto f = readTraceFile(path.string());
    std::filesystem::remove(path);
    ASSERT_TRUE(f.ok()) << f.error();
    EXPECT_EQ(f->peakAllocated, 38'533'842'432.0);
}

TEST(RunTrace, ACudaRanksBreakdownComesFromItsKernels) {
    nlohmann::json r = rankResult(0, true);
    r["step_time_ns"] = {30000};
    // Host op spans say compute 10 us, communication 8 us, none of it hidden. The GPU says
    // the all-gather kernel ran 2..8 us and the GEMM 10.3..19 us: nothing overlapped either,
    // but the figures are the kernels'. Then the kernel is moved to overlap the GEMM.
    Breakdown b = measuredBreakdown(r);
    EXPECT_EQ(b.commNs, 6000);
    EXPECT_EQ(b.computeNs, 8700);
    EXPECT_EQ(b.exposedNs, 6000);
    r["device_activity"]["ops"][1][3] = 1'000'000'000 + 12000;  // NCCL kernel ends at 12 us
    b = measuredBreakdown(r);
    EXPECT_EQ(b.commNs, 10000);
    EXPECT_EQ(b.exposedNs, 17000 - 8700);
    r.erase("device_activity");  // a CPU rank: from the FSDP ops' spans
    b = measuredBreakdown(r);
    EXPECT_EQ(b.commNs, 8000);
    EXPECT_EQ(b.computeNs, 10000);
    EXPECT_EQ(b.exposedNs, 8000);
}

TEST(RunTrace, DiffAndCalibrateSeeTheGpuTimeOfACudaRanksOps) {
    const nlohmann::json trace = mergedTrace({rankResult(0, true)}, "p", {{"device", "cuda"}});
    const auto path = shardscope::test::testTempDir() / "shardscope_run_trace_gpu.json";
    std::ofstream(path) << trace.dump();
    auto t = readTraceFile(path.string());
    std::filesystem::remove(path);
    ASSERT_TRUE(t.ok()) << t.error();
    ASSERT_EQ(t->ops.size(), 2u);
    // The all-gather's host span was 1..9 us; its NCCL kernel ran 2..8 us. The forward's
    // host span was 10..20 us; its GEMM ran 10.3..19 us.
    const int64_t base = t->ops[0].startNs - 2000;  // the trace's time origin
    EXPECT_EQ(t->ops[0].endNs - t->ops[0].startNs, 6000);
    EXPECT_EQ(t->ops[1].startNs - base, 10300);
    EXPECT_EQ(t->ops[1].endNs - t->ops[1].startNs, 8700);
}

TEST(RunTrace, ABrokenDeviceActivityNamesTheField) {
    nlohmann::json r = rankResult(0, true);
    r["device_activity"]["ops"][1][0] = "warp";
    try {
        (void)mergedTrace({r}, "p", {});
        FAIL() << "accepted a broken device_activity";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("device_activity/ops/1"), std::string::npos)
            << e.what();
    }
}

// A trace recorded by an earlier program (FSDP2 gathering over a group of one) against the
// current one, which lacks those ops: the ids name different ops, so the join goes by unit,
// phase, kind and order, not by id (by id it paired a copy-in with a forward).
TEST(TraceDiffJoin, IdsOfDifferentProgramsJoinByUnitPhaseAndKind) {
    auto side = [](std::vector<std::tuple<const char*, const char*, double>> ops) {
        DiffSide s;
        int64_t id = 0;
        for (const auto& [unit, kind, ns] : ops) {
            DiffOp& o = s.ops[id++];
            o.unit = unit;
            o.kind = kind;
            o.phase = "forward";
            o.label = std::string(unit) + " " + kind;
            o.sumNs = ns;
            o.count = 1;
        }
        return s;
    };
    const DiffSide older = side({{"l0", "copy_in", 1},
                                 {"l0", "all_gather", 2},
                                 {"l0", "copy_out", 3},
                                 {"l0", "forward", 10},
                                 {"l1", "forward", 20},
                                 {"l1", "forward", 30}});
    const DiffSide now = side({{"l0", "copy_out", 4},
                               {"l0", "forward", 11},
                               {"l1", "forward", 22},
                               {"l1", "forward", 33},
                               {"l2", "forward", 5}});
    const TraceDiff d = diffSides(older, now);
    EXPECT_TRUE(d.joinedByLabel);
    EXPECT_EQ(d.onlyA, 2u);  // the copy-in and the all-gather
    EXPECT_EQ(d.onlyB, 1u);  // l2
    ASSERT_EQ(d.rows.size(), 4u);
    EXPECT_DOUBLE_EQ(d.byKind.at("forward").first, 60);
    EXPECT_DOUBLE_EQ(d.byKind.at("forward").second, 66);  // the second l1 forward with the second
    EXPECT_DOUBLE_EQ(d.byKind.at("copy_out").second, 4);
    EXPECT_FALSE(d.byKind.count("copy_in"));
    // One program on both sides: by id.
    const TraceDiff same = diffSides(now, now);
    EXPECT_FALSE(same.joinedByLabel);
    EXPECT_EQ(same.rows.size(), 5u);
    EXPECT_EQ(same.onlyA + same.onlyB, 0u);
}

}  // namespace
}  // namespace shardscope::cli
