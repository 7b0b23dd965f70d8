// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a device recorder captured on one rank, in a form free of CUDA headers: GPU ops
// (kernels, copies, memsets, synchronisation) with their stream, the host-side API calls
// that launched them (bound by correlation id, so each kernel has a launch-to-kernel flow),
// device memory allocations and frees, and the FSDP op each GPU op belongs to (external
// correlation: the engine pushes its op index before it launches work). Times are
// nanoseconds on the engine's CPU clock once a ClockFit has been applied.
//
// The CUPTI recorder (cupti_recorder.h) fills it; `shardscope run` merges it into the
// multi-rank trace; tests build it from synthetic CUPTI records (cupti_converter.h).
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardscope::record {

enum class DeviceOpKind : uint8_t {
    Kernel,
    Memcpy,
    Memset,
    Synchronization,  // cudaStreamSynchronize, cudaEventSynchronize, cudaStreamWaitEvent, ...
    RuntimeApi,       // a host thread's CUDA runtime call (cudaLaunchKernel, ...)
    DriverApi,        // a host thread's CUDA driver call (cuLaunchKernel, ...)
};
[[nodiscard]] const char* deviceOpKindName(DeviceOpKind k);
[[nodiscard]] bool isHostSide(DeviceOpKind k);
// Work a launch queued on the device: kernels, copies and memsets (what a flow ends on and
// what an FSDP op's GPU time spans).
[[nodiscard]] bool isDeviceWork(DeviceOpKind k);
// The PyTorch profiler's (Kineto's) category for the kind: "kernel", "gpu_memcpy",
// "gpu_memset", "cuda_sync", "cuda_runtime", "cuda_driver".
[[nodiscard]] const char* kinetoCategory(DeviceOpKind k);
// Whether a Kineto category is device work (kernel, gpu_memcpy, gpu_memset).
[[nodiscard]] bool isDeviceWorkCategory(std::string_view category);

inline constexpr int64_t kNoExternalId = -1;

struct DeviceOp {
    DeviceOpKind kind = DeviceOpKind::Kernel;
    int32_t name = 0;  // index into DeviceActivity::names
    int64_t startNs = 0, endNs = 0;
    uint32_t device = 0;
    uint32_t stream = 0;  // device-side ops; host-side ops: the thread id
    uint32_t correlation = 0;
    int64_t bytes = 0;                 // copies and memsets
    int64_t external = kNoExternalId;  // the engine's op index it was launched under
};

struct DeviceMemoryEvent {
    int64_t ts = 0;
    int64_t bytes = 0;  // > 0 allocated, < 0 freed
    uint64_t address = 0;
    uint32_t device = 0;
};

// CPU time = offset + slope * device time, from two (CPU, device) clock samples taken at
// the start and the end of recording (so a drift between the clocks is corrected too).
struct ClockFit {
    double offsetNs = 0;
    double slope = 1;
    [[nodiscard]] int64_t toCpu(uint64_t deviceNs) const;
    static ClockFit fromSamples(int64_t cpu0, uint64_t dev0, int64_t cpu1, uint64_t dev1);
};

struct DeviceActivity {
    std::vector<std::string> names;
    std::vector<DeviceOp> ops;              // sorted by start
    std::vector<DeviceMemoryEvent> memory;  // sorted by time
    uint64_t droppedRecords = 0;            // CUPTI's count: buffers were full
    uint64_t otherRecords = 0;  // record kinds the converter does not use (overhead, ...)
    // The largest sum of live device allocations made while recording (frees of memory
    // allocated before recording started are not counted against it).
    int64_t peakDeviceBytes = 0;

    [[nodiscard]] const std::string& nameOf(const DeviceOp& op) const {
        return names[static_cast<size_t>(op.name)];
    }
};

// Device memory allocated while recording, after each allocation or free: (time, bytes).
// A free of memory allocated before recording started (an address not seen) is left out.
[[nodiscard]] std::vector<std::pair<int64_t, int64_t>> deviceMemoryTimeline(
    const std::vector<DeviceMemoryEvent>& events);

// The rank result's "device_activity" object and back; fromJson names the field it
// rejects in its exception message.
[[nodiscard]] nlohmann::json toJson(const DeviceActivity& a);
[[nodiscard]] DeviceActivity deviceActivityFromJson(const nlohmann::json& j);

}  // namespace shardscope::record
