// SPDX-License-Identifier: Apache-2.0
#pragma once
// Turns CUPTI activity records into a DeviceActivity. It reads the records' structs from
// cupti_activity.h and calls nothing in libcupti, so tests feed it records they build
// themselves; the recorder feeds it what CUPTI hands back in its buffers.
//
// Records used: KERNEL / CONCURRENT_KERNEL, MEMCPY, MEMSET, SYNCHRONIZATION, RUNTIME,
// DRIVER, MEMORY2 (allocations and frees) and EXTERNAL_CORRELATION (the engine's op index,
// pushed as CUSTOM0 around the work of each FSDP op). Other kinds are counted.
#include <cupti_activity.h>

#include <functional>
#include <string>
#include <unordered_map>

#include "profiler/record/device_activity.h"

namespace shardscope::record {

// The external correlation kind the engine pushes its op index under.
inline constexpr CUpti_ExternalCorrelationKind kFsdpOpCorrelation =
    CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;

class CuptiConverter {
public:
    // Names API records (domain CUPTI_CB_DOMAIN_RUNTIME_API or DRIVER_API, callback id);
    // the recorder asks CUPTI (cuptiGetCallbackName). Without one: "cuda runtime #<cbid>".
    using ApiNamer = std::function<std::string(bool runtime, uint32_t cbid)>;
    explicit CuptiConverter(ApiNamer namer = {}) : m_namer(std::move(namer)) {}

    void add(const CUpti_Activity* record);
    void addDropped(uint64_t n) { m_out.droppedRecords += n; }
    // Binds external correlations, moves times onto the CPU clock, sorts, and computes the
    // device memory peak. The converter is empty afterwards.
    [[nodiscard]] DeviceActivity finish(const ClockFit& fit);

private:
    int32_t intern(const std::string& s);
    void addOp(DeviceOpKind kind, const std::string& name, uint64_t start, uint64_t end,
               uint32_t device, uint32_t stream, uint32_t correlation, int64_t bytes);

    ApiNamer m_namer;
    DeviceActivity m_out;  // times still on the device clock until finish()
    std::unordered_map<std::string, int32_t> m_names;
    std::unordered_map<uint32_t, uint64_t> m_external;  // correlation id -> op index
};

[[nodiscard]] const char* memcpyKindName(uint8_t copyKind);
// A kernel's name as Kineto shows it: demangled when it is a mangled C++ symbol.
[[nodiscard]] std::string demangledKernelName(const char* name);
[[nodiscard]] const char* synchronizationName(CUpti_ActivitySynchronizationType t);

}  // namespace shardscope::record
