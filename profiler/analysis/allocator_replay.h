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

}  // namespace shardscope
