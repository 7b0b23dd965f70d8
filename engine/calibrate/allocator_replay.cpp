// SPDX-License-Identifier: Apache-2.0
#include "engine/calibrate/allocator_replay.h"

#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

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

namespace {

// The whole file, gzip or plain (gzread passes plain files through); "" when unreadable.
bool readAll(const std::string& path, std::string& out, size_t limit = SIZE_MAX) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) return false;
    char buf[1 << 16];
    int n = 0;
    while (out.size() < limit && (n = gzread(f, buf, sizeof buf)) > 0)
        out.append(buf, static_cast<size_t>(n));
    const bool ok = n >= 0;
    gzclose(f);
    return ok;
}

}  // namespace

bool looksLikeAllocatorHistory(const std::string& path) {
    std::string head;
    if (!readAll(path, head, 4096)) return false;
    const size_t brace = head.find('{');
    if (brace == std::string::npos) return false;
    const size_t key = head.find('"', brace);
    if (key == std::string::npos) return false;
    const std::string rest = head.substr(key);
    if (rest.rfind("\"segments\"", 0) == 0) return true;
    return rest.rfind("\"format\"", 0) == 0 &&
           rest.find("shardscope.cuda_memory_history") != std::string::npos &&
           rest.find("shardscope.cuda_memory_history") < 64;
}

namespace {
// Bounds on a history the replay accepts: sizes a device can hold, and events the model's
// block indices can count (AllocatorModel packs a block's index into 24 bits).
constexpr int64_t kMaxHistoryBytes = int64_t{1} << 50;
constexpr size_t kMaxHistoryEvents = size_t{1} << 23;
}  // namespace

Expected<AllocatorHistory> readAllocatorHistory(const std::string& path) {
    std::string text;
    if (!readAll(path, text)) return Error{path + ": cannot read the file"};
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        return Error{path + ": not JSON (" + e.what() + ")"};
    }
    if (!j.is_object()) return Error{path + ": expected a JSON object"};
    AllocatorHistory h;
    auto kindOf = [](const std::string& a) -> int {
        if (a == "alloc") return static_cast<int>(AllocatorHistoryEvent::Kind::Alloc);
        if (a == "free_completed") return static_cast<int>(AllocatorHistoryEvent::Kind::Free);
        if (a == "segment_alloc" || a == "segment_map")
            return static_cast<int>(AllocatorHistoryEvent::Kind::SegmentAlloc);
        if (a == "segment_free" || a == "segment_unmap")
            return static_cast<int>(AllocatorHistoryEvent::Kind::SegmentFree);
        if (a == "free_requested" || a == "snapshot" || a == "oom" || a == "user_defined")
            return -1;  // not a change of allocated or reserved memory
        return -2;
    };
    auto add = [&](const std::string& where, const std::string& action, const nlohmann::json& addr,
                   const nlohmann::json& size, const nlohmann::json& stream) -> std::string {
        const int k = kindOf(action);
        if (k == -2)
            return where + ": unknown action \"" + action +
                   "\" (expected alloc, free_requested, free_completed, segment_alloc, "
                   "segment_free, segment_map, segment_unmap, snapshot or oom)";
        if (!addr.is_number_integer() || !size.is_number_integer() || !stream.is_number_integer() ||
            size.get<int64_t>() < 0)
            return where + ": expected an integer address, a size of at least 0 and a stream";
        if (size.get<int64_t>() > kMaxHistoryBytes)
            return where + ": a size of " + std::to_string(size.get<int64_t>()) +
                   " B is larger than any device (at most 2^50 B)";
        if (k < 0) return {};
        if (h.events.size() >= kMaxHistoryEvents)
            return where + ": more than " + std::to_string(kMaxHistoryEvents) +
                   " allocator events; the replay takes at most that many";
        h.events.push_back({static_cast<AllocatorHistoryEvent::Kind>(k), addr.get<int64_t>(),
                            size.get<int64_t>(), stream.get<int64_t>()});
        return {};
    };
    if (j.contains("format")) {
        if (j["format"] != "shardscope.cuda_memory_history")
            return Error{path + ":/format: expected \"shardscope.cuda_memory_history\""};
        if (!j.contains("events") || !j["events"].is_array())
            return Error{path + ":/events: expected an array of [action, address, size, stream]"};
        const auto& ev = j["events"];
        for (size_t i = 0; i < ev.size(); ++i) {
            const std::string where = path + ":/events/" + std::to_string(i);
            const auto& e = ev[i];
            if (!e.is_array() || e.size() != 4 || !e[0].is_string())
                return Error{where + ": expected [action, address, size, stream]"};
            if (auto err = add(where, e[0].get<std::string>(), e[1], e[2], e[3]); !err.empty())
                return Error{err};
        }
        if (j.contains("max_memory_allocated") && j["max_memory_allocated"].is_number_integer())
            h.maxAllocated = j["max_memory_allocated"].get<int64_t>();
        if (j.contains("max_memory_reserved") && j["max_memory_reserved"].is_number_integer())
            h.maxReserved = j["max_memory_reserved"].get<int64_t>();
        if (j.contains("device") && j["device"].is_string()) h.device = j["device"];
    } else {
        // json.dump(torch.cuda.memory._snapshot()): the first device with a history.
        if (!j.contains("device_traces") || !j["device_traces"].is_array())
            return Error{path +
                         ":/device_traces: expected the per-device lists of "
                         "torch.cuda.memory._snapshot() (record with "
                         "torch.cuda.memory._record_memory_history() first)"};
        const auto& dt = j["device_traces"];
        for (size_t d = 0; d < dt.size() && h.events.empty(); ++d) {
            if (!dt[d].is_array())
                return Error{path + ":/device_traces/" + std::to_string(d) +
                             ": expected a list of events"};
            for (size_t i = 0; i < dt[d].size(); ++i) {
                const std::string where =
                    path + ":/device_traces/" + std::to_string(d) + "/" + std::to_string(i);
                const auto& e = dt[d][i];
                if (!e.is_object() || !e.contains("action") || !e["action"].is_string())
                    return Error{where + ": expected an object with action, addr, size, stream"};
                if (auto err = add(
                        where, e["action"].get<std::string>(), e.value("addr", nlohmann::json()),
                        e.value("size", nlohmann::json()), e.value("stream", nlohmann::json()));
                    !err.empty())
                    return Error{err};
            }
        }
    }
    if (h.events.empty())
        return Error{path +
                     ": no allocator events (was _record_memory_history on before the run?)"};
    return h;
}

AllocatorReplay replayAllocatorHistory(const AllocatorHistory& h, bool expandableSegments) {
    AllocatorReplay r;
    AllocatorModel model(expandableSegments);
    std::map<int64_t, int> streams;  // the history's stream -> the model's index, in order seen
    std::unordered_map<int64_t, int64_t> handle;  // address -> model handle
    int64_t allocated = 0, reserved = 0;
    std::unordered_map<int64_t, int64_t> sizeAt;  // address -> bytes, for frees
    for (const auto& e : h.events) {
        using K = AllocatorHistoryEvent::Kind;
        switch (e.kind) {
            case K::SegmentAlloc:
                reserved += e.size;
                r.reservedChanged = true;
                break;
            case K::SegmentFree:
                reserved -= e.size;
                break;
            case K::Alloc: {
                ++r.allocations;
                const int s =
                    streams.try_emplace(e.stream, static_cast<int>(streams.size())).first->second;
                handle[e.addr] = model.allocate(e.size, s);
                sizeAt[e.addr] = e.size;
                allocated += e.size;
                break;
            }
            case K::Free: {
                ++r.frees;
                if (auto it = handle.find(e.addr); it != handle.end()) {
                    model.free(it->second);
                    handle.erase(it);
                    allocated -= sizeAt[e.addr];
                    sizeAt.erase(e.addr);
                } else {
                    ++r.freesOfEarlierBlocks;
                }
                break;
            }
        }
        ++r.events;
        // A segment is reserved just before the allocation it serves: compare after the
        // allocation, not between the two.
        if (e.kind == K::SegmentAlloc) continue;
        r.traceAllocatedPeak = std::max(r.traceAllocatedPeak, allocated);
        r.traceReservedPeak = std::max(r.traceReservedPeak, reserved);
        r.modelAllocatedPeak = std::max(r.modelAllocatedPeak, model.allocated());
        r.modelReservedPeak = std::max(r.modelReservedPeak, model.reserved());
        if (model.allocated() != allocated) ++r.allocatedMismatches;
        r.largestAllocatedGap =
            std::max(r.largestAllocatedGap, std::abs(model.allocated() - allocated));
        r.largestReservedGap =
            std::max(r.largestReservedGap, std::abs(model.reserved() - reserved));
    }
    return r;
}

}  // namespace shardscope
