// SPDX-License-Identifier: Apache-2.0
#include "profiler/export/chrome_export.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace shardscope {

namespace {

using json = nlohmann::json;

double us(int64_t ns) {
    return static_cast<double>(ns) / 1000.0;
}

}  // namespace

namespace {
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
    json ev = json::array();
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
            ev.push_back({{"ph", "M"},
                          {"pid", lanePid[i]},
                          {"name", "process_name"},
                          {"args",
                           {{"name", multiRank ? "rank " + std::to_string(l.rank)
                                               : "pid " + std::to_string(l.pid)}}}});
        const std::string name =
            multiRank ? l.name.substr(prefix.size()) : (l.name.empty() ? l.tid : l.name);
        ev.push_back({{"ph", "M"},
                      {"pid", lanePid[i]},
                      {"tid", laneTid[i]},
                      {"name", "thread_name"},
                      {"args", {{"name", name}}}});
    }
    std::unordered_map<int32_t, const Collective*> collectiveOf;
    for (const auto& c : t.collectives)
        collectiveOf.emplace(c.event, &c);
    for (size_t i = 0; i < t.size(); ++i) {
        const auto lane = static_cast<size_t>(t.lane[i]);
        const bool ours = i < t.opId.size() && t.opId[i] >= 0;
        // Events in their order with their category: the importer then gives each lane the
        // same kind (from its first event) and the same index.
        const std::string& cat = t.strings.at(t.category[i]);
        json e{{"ph", "X"},
               {"name", t.strings.at(t.name[i])},
               {"cat", cat},
               {"pid", lanePid[lane]},
               {"tid", laneTid[lane]},
               {"ts", us(t.start[i])},
               {"dur", us(t.dur[i])}};
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
        if (!args.empty()) e["args"] = std::move(args);
        ev.push_back(std::move(e));
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
        ev.push_back({{"ph", "i"},
                      {"s", "t"},
                      {"name", "[memory]"},
                      {"cat", "cpu_instant_event"},
                      {"pid", 1},
                      {"tid", 999},
                      {"ts", us(m.ts)},
                      {"args", std::move(args)}});
    };
    for (const auto& m : t.memory)
        memoryEvent(m, 1);
    for (const auto& m : t.hostMemory)
        memoryEvent(m, 0);
    for (size_t f = 0; f < t.flowEvents.size(); ++f) {
        const auto [from, to] = t.flowEvents[f];
        const auto lf = static_cast<size_t>(t.lane[static_cast<size_t>(from)]);
        const auto lt = static_cast<size_t>(t.lane[static_cast<size_t>(to)]);
        ev.push_back({{"ph", "s"},
                      {"id", f + 1},
                      {"cat", "ac2g"},
                      {"name", "ac2g"},
                      {"pid", lanePid[lf]},
                      {"tid", laneTid[lf]},
                      {"ts", us(t.start[static_cast<size_t>(from)])}});
        ev.push_back({{"ph", "f"},
                      {"id", f + 1},
                      {"bp", "e"},
                      {"cat", "ac2g"},
                      {"name", "ac2g"},
                      {"pid", lanePid[lt]},
                      {"tid", laneTid[lt]},
                      {"ts", us(t.start[static_cast<size_t>(to)])}});
    }
    return {{"traceEvents", std::move(ev)},
            {"displayTimeUnit", "ns"},
            {"distributedInfo", distributedInfo(t)},
            {"metadata", {{"producer", "shardscope trace export"}, {"dialect", t.dialect}}}};
}

}  // namespace shardscope
