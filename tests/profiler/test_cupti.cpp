// SPDX-License-Identifier: Apache-2.0
// The CUPTI record converter, fed activity records built here the way CUPTI lays them out
// (cupti_activity.h), and the recorder itself where a CUDA device exists.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>

#include "profiler/record/cupti_converter.h"
#include "profiler/record/cupti_recorder.h"

namespace shardscope::record {
namespace {

CUpti_ActivityKernel10 kernel(const char* name, uint64_t start, uint64_t end, uint32_t stream,
                              uint32_t correlation) {
    CUpti_ActivityKernel10 k;
    std::memset(&k, 0, sizeof k);
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.name = name;
    k.start = start;
    k.end = end;
    k.deviceId = 0;
    k.streamId = stream;
    k.correlationId = correlation;
    return k;
}

CUpti_ActivityAPI api(CUpti_ActivityKind kind, uint32_t cbid, uint64_t start, uint64_t end,
                      uint32_t thread, uint32_t correlation) {
    CUpti_ActivityAPI a;
    std::memset(&a, 0, sizeof a);
    a.kind = kind;
    a.cbid = cbid;
    a.start = start;
    a.end = end;
    a.threadId = thread;
    a.correlationId = correlation;
    return a;
}

CUpti_ActivityExternalCorrelation external(
    uint32_t correlation, uint64_t id, CUpti_ExternalCorrelationKind kind = kFsdpOpCorrelation) {
    CUpti_ActivityExternalCorrelation e;
    std::memset(&e, 0, sizeof e);
    e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    e.externalKind = kind;
    e.externalId = id;
    e.correlationId = correlation;
    return e;
}

CUpti_ActivityMemory4 memory(bool alloc, uint64_t ts, uint64_t address, uint64_t bytes,
                             CUpti_ActivityMemoryKind kind = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE) {
    CUpti_ActivityMemory4 m;
    std::memset(&m, 0, sizeof m);
    m.kind = CUPTI_ACTIVITY_KIND_MEMORY2;
    m.memoryOperationType = alloc ? CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION
                                  : CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;
    m.memoryKind = kind;
    m.timestamp = ts;
    m.address = address;
    m.bytes = bytes;
    return m;
}

template <typename R>
void feed(CuptiConverter& c, const R& r) {
    c.add(reinterpret_cast<const CUpti_Activity*>(&r));
}

const DeviceOp* findOp(const DeviceActivity& a, const std::string& name) {
    for (const auto& op : a.ops)
        if (a.nameOf(op) == name) return &op;
    return nullptr;
}

TEST(CuptiConverter, KernelNamesAreDemangledAsKinetoShowsThem) {
    // Names CUPTI gave on an H200 (shardscope run --device cuda), and how Kineto's traces of
    // the same kernels name them.
    EXPECT_EQ(demangledKernelName("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_"
                                  "13AUnaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEES"
                                  "t5arrayIPcLm2EEEEviT0_T1_"),
              "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<float, "
              "float, float, at::native::binary_internal::MulFunctor<float> >, std::array<char*, "
              "2ul> >(int, at::native::AUnaryFunctor<float, float, float, "
              "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 2ul>)");
    EXPECT_EQ(demangledKernelName("ncclDevKernel_AllGather_RING_LL"),
              "ncclDevKernel_AllGather_RING_LL");  // extern "C": left as it is
    EXPECT_EQ(demangledKernelName(nullptr), "kernel");
}

TEST(CuptiConverter, KernelsBindToTheirLaunchAndTheFsdpOp) {
    CuptiConverter c([](bool runtime, uint32_t cbid) {
        return runtime && cbid == 211 ? std::string("cudaLaunchKernel") : std::string();
    });
    // Records arrive out of order and per buffer; the converter sorts and binds them.
    feed(c, kernel("ncclDevKernel_AllGather_RING_LL", 5'000, 9'000, 21, 7));
    feed(c, api(CUPTI_ACTIVITY_KIND_RUNTIME, 211, 1'000, 1'400, 4242, 7));
    feed(c, api(CUPTI_ACTIVITY_KIND_DRIVER, 9999, 1'500, 1'600, 4242, 8));
    feed(c, external(7, 31));
    feed(c, external(8, 99, CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1));  // not ours
    feed(c, kernel("gemm", 2'000, 4'000, 7, 8));
    const DeviceActivity a = c.finish(ClockFit{});

    ASSERT_EQ(a.ops.size(), 4u);
    EXPECT_EQ(a.nameOf(a.ops[0]), "cudaLaunchKernel");  // sorted by start
    EXPECT_EQ(a.ops[0].kind, DeviceOpKind::RuntimeApi);
    EXPECT_EQ(a.ops[0].stream, 4242u);  // host ops keep their thread
    EXPECT_EQ(a.ops[0].external, 31);
    EXPECT_EQ(a.nameOf(a.ops[1]), "cuda driver #9999");  // the namer did not know it
    const DeviceOp* ag = findOp(a, "ncclDevKernel_AllGather_RING_LL");
    ASSERT_NE(ag, nullptr);
    EXPECT_EQ(ag->kind, DeviceOpKind::Kernel);
    EXPECT_EQ(ag->stream, 21u);
    EXPECT_EQ(ag->correlation, 7u);
    EXPECT_EQ(ag->external, 31);  // launched under FSDP op index 31
    EXPECT_EQ(ag->startNs, 5'000);
    EXPECT_EQ(ag->endNs, 9'000);
    const DeviceOp* gemm = findOp(a, "gemm");
    ASSERT_NE(gemm, nullptr);
    EXPECT_EQ(gemm->external, kNoExternalId);  // CUSTOM1 is someone else's label
    EXPECT_EQ(a.otherRecords, 1u);
}

TEST(CuptiConverter, CopiesMemsetsAndSynchronisation) {
    CuptiConverter c;
    CUpti_ActivityMemcpy6 cp;
    std::memset(&cp, 0, sizeof cp);
    cp.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
    cp.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_HTOD;
    cp.bytes = 1 << 20;
    cp.start = 100;
    cp.end = 300;
    cp.streamId = 3;
    feed(c, cp);
    CUpti_ActivityMemset4 ms;
    std::memset(&ms, 0, sizeof ms);
    ms.kind = CUPTI_ACTIVITY_KIND_MEMSET;
    ms.bytes = 4096;
    ms.start = 400;
    ms.end = 350;  // CUPTI could not time it: kept at zero length, never negative
    ms.streamId = 3;
    feed(c, ms);
    CUpti_ActivitySynchronization2 sy;
    std::memset(&sy, 0, sizeof sy);
    sy.kind = CUPTI_ACTIVITY_KIND_SYNCHRONIZATION;
    sy.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT;
    sy.start = 500;
    sy.end = 520;
    sy.streamId = 9;
    feed(c, sy);
    const DeviceActivity a = c.finish(ClockFit{});
    ASSERT_EQ(a.ops.size(), 3u);
    EXPECT_EQ(a.nameOf(a.ops[0]), "Memcpy HtoD");
    EXPECT_EQ(a.ops[0].bytes, 1 << 20);
    EXPECT_EQ(a.ops[0].kind, DeviceOpKind::Memcpy);
    EXPECT_EQ(a.nameOf(a.ops[1]), "Memset");
    EXPECT_EQ(a.ops[1].bytes, 4096);
    EXPECT_EQ(a.ops[1].endNs, a.ops[1].startNs);
    EXPECT_EQ(a.nameOf(a.ops[2]), "cudaStreamWaitEvent");
    EXPECT_EQ(a.ops[2].kind, DeviceOpKind::Synchronization);
    EXPECT_EQ(a.ops[2].stream, 9u);
}

TEST(CuptiConverter, DeviceMemoryTimelineAndPeak) {
    CuptiConverter c;
    feed(c, memory(true, 300, 0xB000, 200));
    feed(c, memory(true, 100, 0xA000, 1000));
    feed(c, memory(false, 200, 0xA000, 1000));
    feed(c, memory(false, 250, 0x1000, 5000));  // allocated before recording: not counted
    feed(c, memory(true, 400, 0xC000, 300));
    feed(c, memory(true, 150, 0xD000, 64, CUPTI_ACTIVITY_MEMORY_KIND_PINNED));  // host
    const DeviceActivity a = c.finish(ClockFit{});
    ASSERT_EQ(a.memory.size(), 5u);
    EXPECT_EQ(a.memory[0].ts, 100);
    EXPECT_EQ(a.memory[0].bytes, 1000);
    EXPECT_EQ(a.memory[1].bytes, -1000);
    EXPECT_EQ(a.peakDeviceBytes, 1000);  // 1000 alone beats 200 + 300 later
    EXPECT_EQ(a.otherRecords, 1u);       // the pinned host allocation
}

TEST(CuptiConverter, DeviceTimesMoveOntoTheCpuClock) {
    // An offset of 5 s and a drift of 1 in 1000 between the clocks.
    const ClockFit fit =
        ClockFit::fromSamples(5'001'001'000, 1'000'000, 8'004'001'000, 3'001'000'000);
    EXPECT_NEAR(fit.slope, 1.001, 1e-12);
    CuptiConverter c;
    feed(c, kernel("k", 1'000'000, 3'001'000'000, 1, 1));
    feed(c, memory(true, 1'501'000'000, 0xA, 8));
    const DeviceActivity a = c.finish(fit);
    ASSERT_EQ(a.ops.size(), 1u);
    EXPECT_EQ(a.ops[0].startNs, 5'001'001'000);
    EXPECT_EQ(a.ops[0].endNs, 8'004'001'000);
    EXPECT_EQ(a.memory[0].ts, 6'502'501'000);
    // Samples closer than a millisecond keep slope 1 (noise, not drift).
    const ClockFit close = ClockFit::fromSamples(10, 0, 20'000, 10'000);
    EXPECT_EQ(close.slope, 1.0);
    EXPECT_EQ(close.toCpu(500), 510);
}

TEST(CuptiConverter, DroppedAndUnusedRecordsAreCounted) {
    CuptiConverter c;
    CUpti_ActivityOverhead3 o;
    std::memset(&o, 0, sizeof o);
    o.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
    feed(c, o);
    c.addDropped(17);
    c.addDropped(3);
    DeviceActivity a = c.finish(ClockFit{});
    EXPECT_EQ(a.otherRecords, 1u);
    EXPECT_EQ(a.droppedRecords, 20u);
    // finish() leaves the converter empty for the next recording.
    EXPECT_EQ(c.finish(ClockFit{}).droppedRecords, 0u);
}

TEST(DeviceActivity, JsonRoundTripAndErrors) {
    CuptiConverter c;
    feed(c, kernel("gemm", 10, 20, 7, 5));
    feed(c, external(5, 12));
    feed(c, memory(true, 15, 0xA0, 512));
    c.addDropped(2);
    const DeviceActivity a = c.finish(ClockFit{});
    const nlohmann::json j = toJson(a);
    const DeviceActivity b = deviceActivityFromJson(nlohmann::json::parse(j.dump()));
    ASSERT_EQ(b.ops.size(), 1u);
    EXPECT_EQ(b.nameOf(b.ops[0]), "gemm");
    EXPECT_EQ(b.ops[0].external, 12);
    EXPECT_EQ(b.ops[0].stream, 7u);
    EXPECT_EQ(b.memory.size(), 1u);
    EXPECT_EQ(b.memory[0].address, 0xA0u);
    EXPECT_EQ(b.droppedRecords, 2u);
    EXPECT_EQ(b.peakDeviceBytes, 512);

    nlohmann::json bad = j;
    bad["ops"][0][0] = "warp";
    try {
        (void)deviceActivityFromJson(bad);
        FAIL() << "accepted an unknown kind";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("device_activity/ops/0"), std::string::npos);
        EXPECT_NE(std::string(e.what()).find("warp"), std::string::npos);
    }
    bad = j;
    bad["ops"][0][1] = 5;
    EXPECT_THROW((void)deviceActivityFromJson(bad), std::runtime_error);
}

int64_t steadyNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

int deviceCount() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

TEST(CuptiRecorder, WithoutADeviceStartSaysWhy) {
    if (deviceCount() > 0) GTEST_SKIP() << "this machine has a CUDA device";
    CuptiRecorder rec(&steadyNs);
    const Status st = rec.start();
    if (!st) {
        EXPECT_NE(st.error().find("CUPTI"), std::string::npos) << st.error();
        std::printf("without a device: %s\n", st.error().c_str());
        EXPECT_FALSE(rec.running());
        return;
    }
    // CUPTI may start lazily without a driver; then it records nothing.
    auto a = rec.stop();
    ASSERT_TRUE(a.ok()) << a.error();
    EXPECT_TRUE(a->ops.empty());
}

TEST(CuptiRecorder, RecordsCopiesMemsetsAndAllocationsOnADevice) {
    if (deviceCount() == 0) GTEST_SKIP() << "needs a CUDA device";
    CuptiRecorder rec(&steadyNs);
    ASSERT_TRUE(rec.start().ok());
    CuptiRecorder second(&steadyNs);
    EXPECT_FALSE(second.start().ok());  // one CUPTI subscriber per process
    const int64_t t0 = steadyNs();
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, 8 << 20), cudaSuccess);
    CuptiRecorder::pushOp(77);
    ASSERT_EQ(cudaMemsetAsync(p, 0, 8 << 20, nullptr), cudaSuccess);
    CuptiRecorder::popOp();
    std::vector<char> host(8 << 20);
    ASSERT_EQ(cudaMemcpy(host.data(), p, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaFree(p), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const int64_t t1 = steadyNs();
    auto a = rec.stop();
    ASSERT_TRUE(a.ok()) << a.error();
    const DeviceOp* ms = findOp(*a, "Memset");
    ASSERT_NE(ms, nullptr);
    EXPECT_EQ(ms->bytes, 8 << 20);
    EXPECT_EQ(ms->external, 77);
    const DeviceOp* cp = findOp(*a, "Memcpy DtoH");
    ASSERT_NE(cp, nullptr);
    EXPECT_EQ(cp->bytes, 8 << 20);
    // Aligned clocks: the GPU ops lie within the CPU window around them (1 ms slack).
    EXPECT_GE(ms->startNs, t0 - 1'000'000);
    EXPECT_LE(cp->endNs, t1 + 1'000'000);
    EXPECT_GE(a->peakDeviceBytes, 8 << 20);
    EXPECT_EQ(a->droppedRecords, 0u);
    std::printf("recorded %zu device ops, %zu memory events\n", a->ops.size(), a->memory.size());
}

}  // namespace
}  // namespace shardscope::record
