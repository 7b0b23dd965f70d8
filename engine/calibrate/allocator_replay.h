// SPDX-License-Identifier: Apache-2.0
#pragma once
// The caching-allocator model (engine/sim/allocator_model.h) against a real GPU run: the
// [memory] events of a PyTorch profiler trace (Addr, Bytes, Total Allocated, Total
// Reserved) replayed through the model, its reserved bytes over time against the trace's.
//
// A trace starts mid-run: what was allocated before profiling began (Total Allocated at the
// first event) is seeded as live blocks (those the trace frees, at their sizes, the rest as
// one block), and what the allocator had cached but not allocated (Total Reserved minus
// Total Allocated) cannot be known: the replay reports it rather than guess it.
#include <cstdint>
#include <string>
#include <vector>

#include "plans/core/expected.h"
#include "profiler/trace/trace.h"

namespace shardscope {

struct AllocatorReplay {
    int64_t events = 0, allocations = 0, frees = 0;
    int64_t freesOfEarlierBlocks = 0;  // freed blocks allocated before the trace began
    int64_t startAllocated = 0, startReserved = 0;
    int64_t traceAllocatedPeak = 0, traceReservedPeak = 0;
    int64_t modelAllocatedPeak = 0, modelReservedPeak = 0;
    // Events where the model's allocated bytes differ from the trace's Total Allocated:
    // 0 when every allocation and free was read and sized as the allocator reported it.
    int64_t allocatedMismatches = 0;
    int64_t largestAllocatedGap = 0;  // max |model allocated - trace allocated|
    int64_t largestReservedGap = 0;   // max |model reserved - trace reserved| over the events
    bool reservedChanged = false;     // whether the trace's Total Reserved moved at all
    [[nodiscard]] double peakReservedError() const {
        return traceReservedPeak > 0 ? static_cast<double>(modelReservedPeak - traceReservedPeak) /
                                           static_cast<double>(traceReservedPeak)
                                     : 0.0;
    }
};

[[nodiscard]] AllocatorReplay replayAllocator(const Trace& t, bool expandableSegments = false);

// The caching allocator's whole history, from its first allocation: what
// torch.cuda.memory._record_memory_history records and _snapshot() returns. Unlike a
// profiler trace it starts empty and names each event's stream and the segments the
// allocator reserved, so the model's reserved bytes can be checked at every event.
struct AllocatorHistoryEvent {
    enum class Kind : uint8_t { Alloc, Free, SegmentAlloc, SegmentFree };
    Kind kind = Kind::Alloc;
    int64_t addr = 0, size = 0, stream = 0;
};
struct AllocatorHistory {
    std::vector<AllocatorHistoryEvent> events;
    int64_t maxAllocated = -1, maxReserved = -1;  // torch.cuda.max_memory_*(), when given
    std::string device;
};
// Whether `path` (plain or gzip JSON) is such a history rather than a profiler trace: its
// first key is "format": "shardscope.cuda_memory_history" (scripts/record_fsdp_trace.py
// --memory-history) or "segments" (json.dump of torch.cuda.memory._snapshot()).
[[nodiscard]] bool looksLikeAllocatorHistory(const std::string& path);
[[nodiscard]] Expected<AllocatorHistory> readAllocatorHistory(const std::string& path);
[[nodiscard]] AllocatorReplay replayAllocatorHistory(const AllocatorHistory& h,
                                                     bool expandableSegments = false);

}  // namespace shardscope
