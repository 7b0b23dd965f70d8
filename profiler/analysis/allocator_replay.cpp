// SPDX-License-Identifier: Apache-2.0
#include "profiler/analysis/allocator_replay.h"

#include <algorithm>
#include <cstdlib>
#include <unordered_map>

#include "engine/sim/allocator_model.h"

namespace shardscope {

AllocatorReplay replayAllocator(const Trace& t, bool expandableSegments) {
    AllocatorReplay r;
    std::vector<const MemoryCounter*> ev;
    for (const auto& m : t.memory)
        if (m.bytes != 0 && m.addr != 0) ev.push_back(&m);  // legacy files have no Addr
    std::stable_sort(ev.begin(), ev.end(),
                     [](const MemoryCounter* a, const MemoryCounter* b) { return a->ts < b->ts; });
    r.events = static_cast<int64_t>(ev.size());
    if (ev.empty()) return r;
    // The state before the first event: Total Allocated then, less its own allocation.
    const MemoryCounter& first = *ev.front();
    r.startAllocated = first.allocated - first.bytes;
    r.startReserved = first.reserved;
    // Blocks the trace frees without having allocated them existed before it.
    std::unordered_map<int64_t, int64_t> live;         // addr -> bytes, replayed from the start
    std::vector<std::pair<int64_t, int64_t>> earlier;  // (addr, bytes) freed, never allocated
    for (const MemoryCounter* m : ev) {
        if (m->bytes > 0) {
            live[m->addr] = m->bytes;
        } else if (live.erase(m->addr) == 0) {
            earlier.emplace_back(m->addr, -m->bytes);
        }
    }
    AllocatorModel model(expandableSegments);
    std::unordered_map<int64_t, int64_t> handle;  // addr -> model handle
    int64_t earlierBytes = 0;
    for (const auto& [addr, bytes] : earlier) {
        handle[addr] = model.allocate(bytes, 0);
        earlierBytes += AllocatorModel::roundSize(bytes);
    }
    if (r.startAllocated > earlierBytes) (void)model.allocate(r.startAllocated - earlierBytes, 0);
    for (const MemoryCounter* m : ev) {
        if (m->bytes > 0) {
            ++r.allocations;
            handle[m->addr] = model.allocate(m->bytes, 0);
        } else {
            ++r.frees;
            auto it = handle.find(m->addr);
            if (it != handle.end()) {
                model.free(it->second);
                handle.erase(it);
            }
        }
        r.traceAllocatedPeak = std::max(r.traceAllocatedPeak, m->allocated);
        r.traceReservedPeak = std::max(r.traceReservedPeak, m->reserved);
        r.modelAllocatedPeak = std::max(r.modelAllocatedPeak, model.allocated());
        r.modelReservedPeak = std::max(r.modelReservedPeak, model.reserved());
        if (model.allocated() != m->allocated) ++r.allocatedMismatches;
        r.largestAllocatedGap =
            std::max(r.largestAllocatedGap, std::abs(model.allocated() - m->allocated));
        r.largestReservedGap =
            std::max(r.largestReservedGap, std::abs(model.reserved() - m->reserved));
        r.reservedChanged = r.reservedChanged || m->reserved != first.reserved;
    }
    r.freesOfEarlierBlocks = static_cast<int64_t>(earlier.size());
    return r;
}

}  // namespace shardscope
