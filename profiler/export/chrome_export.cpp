// SPDX-License-Identifier: Apache-2.0
#include "profiler/export/chrome_export.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include "profiler/export/chrome_trace_writer.h"

namespace shardscope {

namespace {

using json = nlohmann::json;

double ns(int64_t t) {
    return static_cast<double>(t);
}
// Kineto's distributedInfo as the importer reads it back: rank, world size, process groups.
nlohmann::json distributedInfo(const Trace& t) {
    nlohmann::json d = {{"rank", t.rank}};
    if (t.worldSize > 0) d["world_size"] = t.worldSize;
    if (!t.processGroups.empty()) {
        nlohmann::json pgs = nlohmann::json::array();
        for (const auto& g : t.processGroups)
            pgs.push_back({{"pg_name", g.name},
                           {"pg_desc", g.desc},
                           {"pg_size", g.size},
                           {"ranks", g.ranks}});
        d["pg_config"] = std::move(pgs);
    }
    return d;
}
}  // namespace

json exportChromeTrace(const Trace& t) {
    ChromeTraceWriter w;
    // Processes: one per (rank, original pid); lanes keep their names as thread names. A
    // multi-rank trace's lane names are "rank N · stream"; the process takes "rank N" and
    // the thread the rest, which the importer joins back.
    std::map<std::pair<int32_t, int64_t>, int> pidOf;
    std::vector<int> lanePid(t.lanes.size()), laneTid(t.lanes.size());
    for (size_t i = 0; i < t.lanes.size(); ++i) {
        const Lane& l = t.lanes[i];
        auto [it, added] =
            pidOf.emplace(std::make_pair(l.rank, l.pid), static_cast<int>(pidOf.size()) + 1);
        lanePid[i] = it->second;
        laneTid[i] = it->second * 1000 + static_cast<int>(i) + 1;
        const std::string prefix = "rank " + std::to_string(l.rank) + " \u00b7 ";
        const bool multiRank = l.name.rfind(prefix, 0) == 0;
        if (added)
            w.processName(lanePid[i], multiRank ? "rank " + std::to_string(l.rank)
                                                : "pid " + std::to_string(l.pid));
        w.threadName(lanePid[i], laneTid[i],
                     multiRank ? l.name.substr(prefix.size()) : (l.name.empty() ? l.tid : l.name));
    }
    std::unordered_map<int32_t, const Collective*> collectiveOf;
    for (const auto& c : t.collectives)
        collectiveOf.emplace(c.event, &c);
    for (size_t i = 0; i < t.size(); ++i) {
        const auto lane = static_cast<size_t>(t.lane[i]);
        const bool ours = i < t.opId.size() && t.opId[i] >= 0;
        // Events in their order with their category: the importer then gives each lane the
        // same kind (from its first event) and the same index.
        json args = json::object();
        if (ours) {
            args["op_id"] = t.opId[i];
            args["kind"] = t.strings.at(t.category[i]);
            if (t.unit[i] >= 0) args["unit"] = t.strings.at(t.unit[i]);
            if (t.phase[i] >= 0) args["phase"] = t.strings.at(t.phase[i]);
        }
        // record_shapes' inputs (c10d ops, Gloo collectives, the embedding): a Gloo
        // collective is rebuilt from its name and these.
        const auto in = t.opInputs.find(static_cast<int32_t>(i));
        if (in != t.opInputs.end()) {
            args["Input Dims"] = in->second.dims;
            args["Input type"] = in->second.types;
            if (!in->second.strides.empty()) args["Input Strides"] = in->second.strides;
        }
        const bool gloo = t.strings.at(t.name[i]).rfind("gloo:", 0) == 0;
        if (const auto c = collectiveOf.find(static_cast<int32_t>(i));
            c != collectiveOf.end() && !gloo) {
            const Collective& col = *c->second;
            if (ours) {
                args["bytes"] = col.bytes;
                args["group_size"] = col.groupSize;
            } else {
                // As Kineto writes it, in bytes: the importer multiplies by the dtype's size.
                args["Collective name"] = col.name;
                args["In msg nelems"] = col.bytes;
                args["Out msg nelems"] = std::max(col.bytes, col.fullBytes);
                args["dtype"] = "Byte";
                if (col.groupSize > 0) args["Group size"] = col.groupSize;
            }
        }
        w.span(lanePid[lane], laneTid[lane], t.strings.at(t.name[i]), t.strings.at(t.category[i]),
               ns(t.start[i]), ns(t.dur[i]), args.empty() ? json() : std::move(args));
    }
    // [memory] instant events as Kineto writes them: the device's (Device Type 1, with each
    // allocation's Bytes and Addr) and the CPU allocator's (Device Type 0).
    auto memoryEvent = [&](const MemoryCounter& m, int deviceType) {
        json args{{"Device Type", deviceType},
                  {"Total Allocated", m.allocated},
                  {"Total Reserved", m.reserved}};
        if (deviceType == 1) {
            args["Bytes"] = m.bytes;
            args["Addr"] = m.addr;
        }
        w.instant(1, 999, "[memory]", "cpu_instant_event", ns(m.ts), std::move(args));
    };
    for (const auto& m : t.memory)
        memoryEvent(m, 1);
    for (const auto& m : t.hostMemory)
        memoryEvent(m, 0);
    for (size_t f = 0; f < t.flowEvents.size(); ++f) {
        const auto [from, to] = t.flowEvents[f];
        const auto lf = static_cast<size_t>(t.lane[static_cast<size_t>(from)]);
        const auto lt = static_cast<size_t>(t.lane[static_cast<size_t>(to)]);
        w.flowStart(lanePid[lf], laneTid[lf], "ac2g", "ac2g", f + 1,
                    ns(t.start[static_cast<size_t>(from)]));
        w.flowEnd(lanePid[lt], laneTid[lt], "ac2g", "ac2g", f + 1,
                  ns(t.start[static_cast<size_t>(to)]), true);
    }
    return w.finish({{"producer", "shardscope trace export"}, {"dialect", t.dialect}},
                    {{"distributedInfo", distributedInfo(t)}});
}

}  // namespace shardscope
