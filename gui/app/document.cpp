// SPDX-License-Identifier: Apache-2.0
#include "gui/app/document.h"

#include "gui/timeline/sim_timeline.h"
#include "plans/core/json_reader.h"
#include "plans/model/model_json.h"
#include "plans/plan/plan_json.h"
#include "profiler/analysis/trace_loader.h"
#include "profiler/import/kineto_import.h"

#include <QFileInfo>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace shardscope::gui {

namespace {

// An empty row with its name and rank group (the other members at their defaults).
TimelineRow namedRow(std::string name, std::string group) {
    TimelineRow row;
    row.name = std::move(name);
    row.group = std::move(group);
    return row;
}

// Kineto traces are gzip files or JSON with "traceEvents": sniffed from the first bytes, then
// imported streaming rather than parsed whole.
// A Chrome/Kineto trace by its content: gzip; a top-level array; or an object whose keys
// include traceEvents or Kineto's header keys. Kineto writes deviceProperties (kilobytes on
// a multi-GPU machine) before traceEvents, so the search goes on past the first block, up to
// 1 MiB, unless the file has shown itself to be a model, plan or cluster first.
bool looksLikeTrace(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string text;
    char block[16384];
    for (size_t read = 0; in && read < (1u << 20); read += sizeof block) {
        in.read(block, sizeof block);
        text.append(block, static_cast<size_t>(in.gcount()));
        if (text.size() >= 2 && static_cast<unsigned char>(text[0]) == 0x1f &&
            static_cast<unsigned char>(text[1]) == 0x8b)
            return true;
        const size_t first = text.find_first_not_of(" \t\r\n");
        if (first != std::string::npos && text[first] == '[') return true;
        for (const char* key : {"\"traceEvents\"", "\"schemaVersion\"", "\"deviceProperties\"",
                                "\"distributedInfo\"", "\"displayTimeUnit\""})
            if (text.find(key) != std::string::npos) return true;
        for (const char* other : {"\"format\"", "\"model_type\"", "\"architectures\""})
            if (text.find(other) != std::string::npos) return false;
    }
    return false;
}

// The colour a measured collective gets: broadcasts, point-to-point and all-to-all are
// "other" communication.
EventKind collectiveKind(const std::string& name) {
    switch (collectiveKindOf(name)) {
        case CollectiveKind::AllGather:
            return EventKind::AllGather;
        case CollectiveKind::ReduceScatter:
            return EventKind::ReduceScatter;
        case CollectiveKind::AllReduce:
            return EventKind::AllReduce;
        case CollectiveKind::Other:
            break;
    }
    return EventKind::Other;
}

// Each unit's forward (pre_forward to post_forward) and backward (pre_backward to its last
// post_backward hook) from FSDP2's labels: the root's encloses the others, so the track
// nests.
void fsdp2UnitSpans(const Trace& t, std::unordered_map<std::string, int32_t>& unitByName,
                    TimelineData& d, TimelineRow& units) {
    struct Open {
        // (start, event) of each pre_forward / pre_backward: the span's op is that
        // event, so a click shows its details.
        std::vector<std::pair<int64_t, int32_t>> fwd, bwd;
        std::vector<std::pair<int64_t, int64_t>> fwdEnds, bwdEnds;  // (start, end)
    };
    std::map<std::string, Open> byUnit;
    for (size_t i = 0; i < t.size(); ++i) {
        const auto l = parseFsdp2Label(t.strings.at(t.name[i]));
        if (!l) continue;
        Open& o = byUnit[l->fqn];
        const int64_t a = t.start[i], b = t.start[i] + t.dur[i];
        if (l->op == "FSDP::pre_forward")
            o.fwd.push_back({a, static_cast<int32_t>(i)});
        else if (l->op == "FSDP::post_forward")
            o.fwdEnds.push_back({a, b});
        else if (l->op == "FSDP::pre_backward")
            o.bwd.push_back({a, static_cast<int32_t>(i)});
        else if (l->op.rfind("FSDP::post_backward", 0) == 0)
            o.bwdEnds.push_back({a, b});
    }
    // Each opening pairs with the last closing hook before the next opening.
    struct Span {
        int64_t start, end;
        int32_t event;
    };
    const auto spans = [](std::vector<std::pair<int64_t, int32_t>> opens,
                          std::vector<std::pair<int64_t, int64_t>> closes) {
        std::sort(opens.begin(), opens.end());
        std::sort(closes.begin(), closes.end());
        std::vector<Span> out;
        for (size_t k = 0; k < opens.size(); ++k) {
            const int64_t at = opens[k].first;
            const int64_t next = k + 1 < opens.size() ? opens[k + 1].first : INT64_MAX;
            int64_t end = -1;
            for (const auto& [a, b] : closes)
                if (a >= at && a < next) end = std::max(end, b);
            if (end > at) out.push_back({at, end, opens[k].second});
        }
        return out;
    };
    for (const auto& [fqn, o] : byUnit) {
        auto [it, added] = unitByName.emplace(fqn, static_cast<int32_t>(d.units.size()));
        if (added) d.units.push_back(fqn);
        const std::string name = fqn.empty() ? std::string("<root>") : fqn;
        for (const Span& sp : spans(o.fwd, o.fwdEnds))
            units.events.push_back(
                {sp.start, sp.end, EventKind::Other, sp.event, name + " forward", it->second});
        for (const Span& sp : spans(o.bwd, o.bwdEnds))
            units.events.push_back(
                {sp.start, sp.end, EventKind::Other, sp.event, name + " backward", it->second});
    }
}

// FSDP1 names no unit: each FullyShardedDataParallel.forward range is one, numbered as the
// analysis numbers them (the root 0, then the nested ones in start order).
void fsdp1UnitSpans(const Trace& t, std::unordered_map<std::string, int32_t>& unitByName,
                    TimelineData& d, TimelineRow& units) {
    std::vector<int32_t> fwd;
    for (size_t i = 0; i < t.size(); ++i)
        if (t.strings.at(t.name[i]) == "FullyShardedDataParallel.forward")
            fwd.push_back(static_cast<int32_t>(i));
    std::sort(fwd.begin(), fwd.end(), [&](int32_t a, int32_t b) {
        return t.start[a] != t.start[b] ? t.start[a] < t.start[b] : t.dur[a] > t.dur[b];
    });
    int64_t rootEnd = -1;
    int32_t nested = 0;
    for (int32_t i : fwd) {
        const bool inRoot = t.start[i] < rootEnd;
        if (!inRoot) {
            rootEnd = t.start[i] + t.dur[i];
            nested = 0;
        }
        const std::string name = "unit " + std::to_string(inRoot ? ++nested : 0);
        auto [it, added] = unitByName.emplace(name, static_cast<int32_t>(d.units.size()));
        if (added) d.units.push_back(name);
        units.events.push_back({t.start[i], t.start[i] + t.dur[i], EventKind::Other, i,
                                name + " forward", it->second});
    }
}

// FSDP's units, from its own labels (a PyTorch FSDP2/FSDP1 run): a row of all-gathers and
// one of reduce-scatters and all-reduces, each labelled with its unit, phase and exposed
// time, as `shardscope trace overlap` prints them, and a row of the units' spans.
void addFsdpRows(const Trace& t, const FsdpTraceAnalysis* fsdp, bool manyRanks, TimelineData& d) {
    const std::string group = manyRanks ? "rank " + std::to_string(t.rank) : std::string();
    TimelineRow ag = namedRow("FSDP all-gathers", group),
                rs = namedRow("FSDP reduce-scatters", group);
    std::unordered_map<std::string, int32_t> unitByName;
    for (size_t u = 0; u < d.units.size(); ++u)
        unitByName.emplace(d.units[u], static_cast<int32_t>(u));
    for (const auto& c : fsdp->collectives) {
        if (c.unit < 0 || c.commEvent < 0) continue;
        const FsdpUnit& u = fsdp->units[static_cast<size_t>(c.unit)];
        auto [it, added] = unitByName.emplace(u.name, static_cast<int32_t>(d.units.size()));
        if (added) d.units.push_back(u.name);
        const bool gather = c.kind == CollectiveKind::AllGather;
        const char* what = gather                                    ? "all-gather"
                           : c.kind == CollectiveKind::ReduceScatter ? "reduce-scatter"
                                                                     : "all-reduce";
        char b[160];
        char wait[64] = "";
        if (c.peerWaitNs > 0)
            std::snprintf(wait, sizeof wait, ", %.2f ms waiting for a peer",
                          static_cast<double>(c.peerWaitNs) * 1e-6);
        std::snprintf(b, sizeof b, " (%s%s, %.2f ms exposed%s)",
                      c.backward ? "backward" : "forward", c.prefetch ? ", prefetched" : "",
                      static_cast<double>(c.exposedNs) * 1e-6, wait);
        (gather ? ag : rs)
            .events.push_back({c.startNs, c.endNs,
                               gather                                    ? EventKind::AllGather
                               : c.kind == CollectiveKind::ReduceScatter ? EventKind::ReduceScatter
                                                                         : EventKind::AllReduce,
                               c.commEvent, u.displayName() + " " + what + b, it->second});
    }
    // Each unit's forward (pre_forward to post_forward) and backward (pre_backward to
    // its last post_backward hook) from FSDP2's labels: the root's encloses the others,
    // so the track nests.
    TimelineRow units = namedRow("FSDP units", group);
    if (fsdp->api == "fsdp2") fsdp2UnitSpans(t, unitByName, d, units);
    if (fsdp->api == "fsdp1") fsdp1UnitSpans(t, unitByName, d, units);
    for (TimelineRow* r : {&units, &ag, &rs})
        if (!r->events.empty()) d.rows.push_back(std::move(*r));
}

// ShardScope's own lanes in stream order (compute first), each stream's overflow lanes
// ("reduce_scatter ·2") after it; other traces keep their lane order.
void orderRows(TimelineData& d) {
    auto streamRank = [](const std::string& name) {
        if (name.rfind("FSDP ", 0) == 0) return -1;  // FSDP's units and collectives on top
        const std::string base = name.substr(0, name.find(" \u00b7"));
        for (int s = 0; s < static_cast<int>(Stream::Count); ++s)
            if (base == streamName(static_cast<Stream>(s))) return s;
        return static_cast<int>(Stream::Count);
    };
    std::unordered_map<std::string, size_t> groupOrder;
    for (const auto& r : d.rows)
        groupOrder.emplace(r.group, groupOrder.size());
    std::stable_sort(d.rows.begin(), d.rows.end(), [&](const TimelineRow& a, const TimelineRow& b) {
        const size_t ga = groupOrder.at(a.group), gb = groupOrder.at(b.group);
        return ga != gb ? ga < gb : streamRank(a.name) < streamRank(b.name);
    });
}

// Launch-to-kernel flows between the rows' events, after the rows are in their final order.
void addFlows(const Trace& t, TimelineData& d) {
    if (t.flowEvents.empty()) return;
    std::unordered_map<int32_t, std::pair<int32_t, int64_t>> where;  // event -> (row, start)
    std::unordered_set<int32_t> ends;
    for (const auto& [from, to] : t.flowEvents)
        ends.insert(from), ends.insert(to);
    for (size_t r = 0; r < d.rows.size(); ++r)
        for (const auto& e : d.rows[r].events)
            if (ends.count(e.op)) where[e.op] = {static_cast<int32_t>(r), e.start};
    for (const auto& [from, to] : t.flowEvents) {
        const auto a = where.find(from), b = where.find(to);
        if (a == where.end() || b == where.end()) continue;
        d.flows.push_back({a->second.first, a->second.second, b->second.first, b->second.second});
    }
    std::sort(d.flows.begin(), d.flows.end(),
              [](const auto& x, const auto& y) { return x.fromTime < y.fromTime; });
}

// The details of an event, as the timeline shows them on a click.
std::function<std::string(int32_t)> describer(
    std::shared_ptr<const Trace> trace,
    std::shared_ptr<std::unordered_map<int32_t, Collective>> collectiveOf,
    std::shared_ptr<std::unordered_map<int32_t, int32_t>> launchOf) {
    return [trace, collectiveOf, launchOf](int32_t op) -> std::string {
        const Trace& t = *trace;
        if (op < 0 || static_cast<size_t>(op) >= t.size()) return {};
        const auto i = static_cast<size_t>(op);
        const Lane& lane = t.lanes[static_cast<size_t>(t.lane[i])];
        char b[128];
        std::snprintf(b, sizeof b, "\nstart %.3f ms, duration %.3f ms",
                      static_cast<double>(t.start[i]) * 1e-6, static_cast<double>(t.dur[i]) * 1e-6);
        std::string s = t.strings.at(t.name[i]) + "\n" + eventClassName(t.cls[i]) + " · " +
                        t.strings.at(t.category[i]) + " · " +
                        (lane.name.empty() ? lane.tid : lane.name) + b;
        if (i < t.opId.size() && t.opId[i] >= 0) {
            s += "\nop " + std::to_string(t.opId[i]);
            if (t.unit[i] >= 0)
                s += " · unit " + (t.strings.at(t.unit[i]).empty() ? std::string("<root>")
                                                                   : t.strings.at(t.unit[i]));
            if (t.phase[i] >= 0) s += " · " + t.strings.at(t.phase[i]);
        }
        if (const auto l = launchOf->find(op); l != launchOf->end()) {
            const auto li = static_cast<size_t>(l->second);
            const Lane& ll = t.lanes[static_cast<size_t>(t.lane[li])];
            char w[160];
            std::snprintf(w, sizeof w, " at %.3f ms on %s (queued %.3f ms before it ran)",
                          static_cast<double>(t.start[li]) * 1e-6,
                          (ll.name.empty() ? ll.tid : ll.name).c_str(),
                          static_cast<double>(t.start[i] - t.start[li]) * 1e-6);
            s += "\nlaunched by " + t.strings.at(t.name[li]) + w;
        }
        const auto c = collectiveOf->find(op);
        if (c != collectiveOf->end())
            s += "\n" + (c->second.bytes > 0
                             ? describeCollective(c->second.name.c_str(), c->second.bytes,
                                                  c->second.groupSize, t.dur[i])
                             : c->second.name + " (message size not in the trace)");
        return s;
    };
}

TimelineData timelineFromTrace(const std::shared_ptr<const Trace>& trace,
                               const FsdpTraceAnalysis* fsdp) {
    const Trace& t = *trace;
    TimelineData d;
    std::unordered_map<int32_t, EventKind> commKind;  // event -> kind, for collectives
    auto collectiveOf = std::make_shared<std::unordered_map<int32_t, Collective>>();
    for (const auto& c : t.collectives) {
        commKind.emplace(c.event, collectiveKind(c.name));
        collectiveOf->emplace(c.event, c);
    }
    // GPU streams: kernels on one stream do not overlap. CPU-only traces show host threads.
    bool anyDevice = false;
    std::set<int32_t> ranks;
    for (const auto& l : t.lanes) {
        anyDevice = anyDevice || l.kind == LaneKind::DeviceStream;
        ranks.insert(l.rank);
    }
    std::vector<int32_t> rowOfLane(t.lanes.size(), -1);
    for (size_t i = 0; i < t.lanes.size(); ++i)
        if ((t.lanes[i].kind == LaneKind::DeviceStream) == anyDevice) {
            rowOfLane[i] = static_cast<int32_t>(d.rows.size());
            std::string name = t.lanes[i].name.empty() ? t.lanes[i].tid : t.lanes[i].name;
            std::string group;
            if (ranks.size() > 1) {  // "rank 1 · compute": the rank becomes the row's group
                group = "rank " + std::to_string(t.lanes[i].rank);
                const std::string prefix = group + " \u00b7 ";
                if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
            }
            d.rows.push_back(namedRow(name, group));
        }
    // Launches that start a flow: one host row per thread (shown with the flows only);
    // launches on one thread do not overlap.
    std::unordered_set<int32_t> launches;
    for (const auto& [from, to] : t.flowEvents)
        launches.insert(from);
    std::vector<int32_t> hostRowOfLane(t.lanes.size(), -1);
    std::unordered_map<int32_t, int32_t> unitIndex;  // string id -> TimelineData::units
    for (size_t i = 0; i < t.size(); ++i) {
        if (launches.count(static_cast<int32_t>(i))) {
            const auto ln = static_cast<size_t>(t.lane[i]);
            if (hostRowOfLane[ln] < 0 && rowOfLane[ln] < 0) {
                hostRowOfLane[ln] = static_cast<int32_t>(d.rows.size());
                const Lane& l = t.lanes[ln];
                TimelineRow row;
                row.name = "launches " + (l.name.empty() ? l.tid : l.name);
                row.group = ranks.size() > 1 ? "rank " + std::to_string(l.rank) : std::string();
                row.host = true;
                d.rows.push_back(std::move(row));
            }
            const int32_t hr = hostRowOfLane[ln] >= 0 ? hostRowOfLane[ln] : rowOfLane[ln];
            d.rows[static_cast<size_t>(hr)].events.push_back(
                {t.start[i], t.start[i] + t.dur[i], EventKind::Other, static_cast<int32_t>(i),
                 t.strings.at(t.name[i]), -1});
            continue;
        }
        const std::string& cat = t.strings.at(t.category[i]);
        if (cat == "step" || t.strings.at(t.name[i]).rfind("ProfilerStep#", 0) == 0) {
            const Lane& l = t.lanes[static_cast<size_t>(t.lane[i])];
            d.steps.push_back({ranks.size() > 1 ? "rank " + std::to_string(l.rank) : std::string(),
                               t.start[i], t.start[i] + t.dur[i]});
        }
        const int32_t row = rowOfLane[static_cast<size_t>(t.lane[i])];
        if (row < 0 || (anyDevice && t.cls[i] == EventClass::Cpu))
            continue;  // annotations overlap kernels
        EventKind k = EventKind::Other;
        switch (t.cls[i]) {
            case EventClass::Computation:
                k = EventKind::Compute;
                break;
            case EventClass::Communication: {
                const auto it = commKind.find(static_cast<int32_t>(i));
                k = it == commKind.end() ? EventKind::Other : it->second;
                break;
            }
            case EventClass::Memory:
                k = EventKind::Copy;
                break;
            default:
                k = EventKind::Other;
        }
        int32_t unit = -1;
        if (i < t.unit.size() && t.unit[i] >= 0) {
            auto [it, added] = unitIndex.emplace(t.unit[i], static_cast<int32_t>(d.units.size()));
            if (added) d.units.push_back(t.strings.at(t.unit[i]));
            unit = it->second;
        }
        d.rows[static_cast<size_t>(row)].events.push_back({t.start[i], t.start[i] + t.dur[i], k,
                                                           static_cast<int32_t>(i),
                                                           t.strings.at(t.name[i]), unit});
        d.endNs = std::max(d.endNs, t.start[i] + t.dur[i]);
    }
    // FSDP's units, from its own labels (a PyTorch FSDP2/FSDP1 run): a row of all-gathers and
    // one of reduce-scatters and all-reduces, each labelled with its unit, phase and exposed
    // time, as `shardscope trace overlap` prints them.
    if (fsdp && !fsdp->api.empty()) addFsdpRows(t, fsdp, ranks.size() > 1, d);
    splitNestedRows(d.rows);  // a CPU thread's nested slices: one row per depth
    sortEventsByStart(d.rows);
    orderRows(d);
    std::sort(d.steps.begin(), d.steps.end(),
              [](const auto& a, const auto& b) { return a.start < b.start; });
    markExposedCommunication(d);
    addFlows(t, d);
    // What a kernel waited on, as far as a trace tells: the launch that queued it.
    auto launchOf = std::make_shared<std::unordered_map<int32_t, int32_t>>();
    for (const auto& [from, to] : t.flowEvents)
        launchOf->emplace(to, from);
    d.describe = describer(trace, collectiveOf, launchOf);
    return d;
}

}  // namespace

namespace {

// A trace's memory counters as a memory timeline (allocated and reserved), times shifted by
// `shift`; null without counters.
// A trace's memory counters: the device's, or on a CPU run the CPU allocator's.
const std::vector<MemoryCounter>& countersOf(const Trace& t) {
    return t.memory.empty() ? t.hostMemory : t.memory;
}

std::shared_ptr<const SimResult> memoryTimelineOf(const Trace& t, int64_t shift) {
    const auto& counters = countersOf(t);
    if (counters.empty()) return nullptr;
    auto m = std::make_shared<SimResult>();
    for (const auto& c : counters) {
        m->timeline.push_back({c.ts + shift, c.allocated, c.reserved, {}});
        m->peakAllocated = std::max(m->peakAllocated, c.allocated);
        m->peakReserved = std::max(m->peakReserved, c.reserved);
    }
    return m;
}

// Every rank's counter of a multi-rank trace (Trace::memoryByRank) as the chart's lines,
// built once with the load; null when the trace has one rank's.
std::shared_ptr<const std::vector<MemorySeries>> rankMemoryOf(const Trace& t) {
    if (t.memoryByRank.empty()) return nullptr;
    auto out = std::make_shared<std::vector<MemorySeries>>();
    for (const auto& [rank, counters] : t.memoryByRank) {
        MemorySeries r{"rank " + std::to_string(rank), {}};
        r.points.reserve(counters.size());
        for (const auto& c : counters)
            r.points.push_back({c.ts, c.allocated});
        std::stable_sort(r.points.begin(), r.points.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
        out->push_back(std::move(r));
    }
    return out;
}

// Several ranks' timelines as one: rank k's rows under the group "rank R", its times shifted
// by `shift[k]` (the ranks' clocks aligned), its op ids by `opBase[k]` (so that selection,
// details, exposure and flows stay per rank).
TimelineData mergeRankTimelines(std::vector<std::pair<int32_t, TimelineData>> ranks,
                                const std::vector<int64_t>& shift,
                                const std::vector<int32_t>& opBase) {
    TimelineData d;
    std::vector<std::function<std::string(int32_t)>> describes;
    for (size_t k = 0; k < ranks.size(); ++k) {
        auto& [rank, t] = ranks[k];
        const std::string group = "rank " + std::to_string(rank);
        const int64_t dt = shift[k];
        const int32_t base = opBase[k];
        const auto rowBase = static_cast<int32_t>(d.rows.size());
        const auto unitBase = static_cast<int32_t>(d.units.size());
        d.units.insert(d.units.end(), t.units.begin(), t.units.end());
        for (auto& r : t.rows) {
            r.group = r.group.empty() ? group : group + " \u00b7 " + r.group;
            for (auto& e : r.events) {
                e.start += dt;
                e.end += dt;
                if (e.op >= 0) e.op += base;
                if (e.unit >= 0) e.unit += unitBase;
            }
            d.rows.push_back(std::move(r));
        }
        for (auto s : t.steps) {
            s.group = s.group.empty() ? group : group + " \u00b7 " + s.group;
            s.start += dt;
            s.end += dt;
            d.steps.push_back(std::move(s));
        }
        for (auto f : t.flows) {
            f.fromRow += rowBase;
            f.toRow += rowBase;
            f.fromTime += dt;
            f.toTime += dt;
            d.flows.push_back(f);
        }
        for (auto& [op, spans] : t.exposed) {
            for (auto& [a, b] : spans)
                a += dt, b += dt;
            d.exposed[op + base] = std::move(spans);
        }
        d.endNs = std::max(d.endNs, t.endNs + dt);
        describes.push_back(std::move(t.describe));
    }
    std::sort(d.steps.begin(), d.steps.end(),
              [](const auto& a, const auto& b) { return a.start < b.start; });
    std::sort(d.flows.begin(), d.flows.end(),
              [](const auto& a, const auto& b) { return a.fromTime < b.fromTime; });
    d.describe = [describes = std::move(describes), opBase](int32_t op) -> std::string {
        for (size_t k = describes.size(); k-- > 0;)
            if (op >= opBase[k]) return describes[k] ? describes[k](op - opBase[k]) : std::string();
        return {};
    };
    return d;
}

// A folder of per-rank profiler traces (torch.profiler's tensorboard_trace_handler writes
// one file per rank): every rank on one time axis, a group each, rank 0's summary, FSDP
// analysis and memory, and every rank's memory counter.
LoadedFile loadTraceFolder(const QString& path, const std::atomic<bool>* cancel,
                           const std::function<void(double)>& progress) {
    LoadedFile f;
    f.path = path;
    f.kind = LoadedFile::Kind::Trace;
    // The CLI's reading of a folder (forEachTrace): files that are not traces are skipped,
    // any other error names its file. Progress runs over the files.
    const auto files = expandTraceArgs({path.toStdString()});
    const double n = files ? static_cast<double>(files->size()) : 1.0;
    size_t done = 0;
    KinetoImportOptions io;
    io.cancel = cancel;
    if (progress) io.progress = [&](double x) { progress((static_cast<double>(done) + x) / n); };
    std::vector<std::shared_ptr<Trace>> traces;
    const Status st =
        forEachTrace({path.toStdString()}, io, [&](const std::string&, Trace&& t) -> Status {
            traces.push_back(std::make_shared<Trace>(std::move(t)));
            ++done;
            return {};
        });
    if (!st) {
        f.error =
            cancel && cancel->load() ? path + ": cancelled" : QString::fromStdString(st.error());
        return f;
    }
    std::stable_sort(traces.begin(), traces.end(),
                     [](const auto& a, const auto& b) { return a->rank < b->rank; });
    // Files without distributedInfo all say rank 0: number them in file order instead.
    for (size_t k = 1; k < traces.size(); ++k)
        if (traces[k]->rank == traces[k - 1]->rank) {
            for (size_t j = 0; j < traces.size(); ++j)
                traces[j]->rank = static_cast<int64_t>(j);
            break;
        }
    int64_t origin = INT64_MAX;
    for (const auto& t : traces)
        origin = std::min(origin, t->timeOriginNs);
    std::vector<std::pair<int32_t, TimelineData>> timelines;
    std::vector<int64_t> shift;
    std::vector<int32_t> opBase;
    int64_t events = 0;
    std::shared_ptr<const FsdpTraceAnalysis> fsdp0;
    // FSDP's structure per rank, then each collective's wait for the last rank to start it
    // (peer_wait.h), which the collectives' labels carry.
    std::vector<std::shared_ptr<FsdpTraceAnalysis>> analyses;
    std::vector<FsdpTraceAnalysis*> fsdpRanks;
    for (const auto& t : traces) {
        analyses.push_back(std::make_shared<FsdpTraceAnalysis>(analyzeFsdp(*t)));
        if (!analyses.back()->api.empty()) fsdpRanks.push_back(analyses.back().get());
    }
    if (fsdpRanks.size() == traces.size()) (void)fillPeerWaits(fsdpRanks);
    for (size_t k = 0; k < traces.size(); ++k) {
        const std::shared_ptr<const Trace> t = traces[k];
        const auto& fsdp = analyses[k];
        if (k == 0 && !fsdp->api.empty()) fsdp0 = fsdp;
        timelines.emplace_back(static_cast<int32_t>(t->rank), timelineFromTrace(t, fsdp.get()));
        shift.push_back(t->timeOriginNs - origin);
        opBase.push_back(static_cast<int32_t>(std::min<int64_t>(events, INT32_MAX)));
        events += static_cast<int64_t>(t->size());
    }
    // Every rank's memory counter, on the shared axis, for the chart's per-rank lines.
    Trace& first = *traces.front();
    if (traces.size() > 1)
        for (size_t k = 0; k < traces.size(); ++k) {
            std::vector<MemoryCounter> c = countersOf(*traces[k]);
            for (auto& m : c)
                m.ts += shift[k];
            if (!c.empty())
                first.memoryByRank.emplace_back(static_cast<int32_t>(traces[k]->rank),
                                                std::move(c));
        }
    f.traceTimeline = std::make_shared<const TimelineData>(
        mergeRankTimelines(std::move(timelines), shift, opBase));
    f.trace = traces.front();
    f.traceFsdp = fsdp0;
    f.traceSummary = std::make_shared<const TraceSummary>(summarize(*f.trace));
    f.traceMemory = memoryTimelineOf(first, shift[0]);
    f.traceRankMemory = rankMemoryOf(first);
    return f;
}

}  // namespace

LoadedFile loadFile(const QString& path, const std::atomic<bool>* cancel,
                    std::function<void(double)> progress) {
    LoadedFile f;
    f.path = path;
    const std::string p = path.toStdString();
    if (QFileInfo(path).isDir()) return loadTraceFolder(path, cancel, progress);
    if (looksLikeTrace(p)) {
        f.kind = LoadedFile::Kind::Trace;
        KinetoImportOptions io;
        io.cancel = cancel;
        io.progress = std::move(progress);
        auto t = importKinetoFile(p, io);
        if (t) {
            f.trace = std::make_shared<const Trace>(std::move(*t));
            // Built here, off the GUI thread like the import: a trace can hold millions of
            // events, and the window shows the summary on every refresh.
            auto fsdp = std::make_shared<FsdpTraceAnalysis>(analyzeFsdp(*f.trace));
            if (!fsdp->api.empty()) f.traceFsdp = fsdp;
            f.traceTimeline =
                std::make_shared<const TimelineData>(timelineFromTrace(f.trace, fsdp.get()));
            f.traceSummary = std::make_shared<const TraceSummary>(summarize(*f.trace));
            f.traceMemory = memoryTimelineOf(*f.trace, 0);
            f.traceRankMemory = rankMemoryOf(*f.trace);
        } else
            f.error = QString::fromStdString(t.error());
        return f;
    }
    auto j = readJsonFile(p);
    if (!j) {
        f.error = QString::fromStdString(j.error());
        return f;
    }
    const std::string format = j->is_object() && j->contains("format") && (*j)["format"].is_string()
                                   ? (*j)["format"].get<std::string>()
                                   : std::string();
    if (format == kPlanFormat) {
        f.kind = LoadedFile::Kind::Plan;
        auto plan = planFromJson(*j, p);
        if (plan)
            f.plan = std::make_shared<const Plan>(std::move(*plan));
        else
            f.error = QString::fromStdString(plan.error());
    } else if (format == kClusterFormat) {
        f.kind = LoadedFile::Kind::Cluster;
        auto c = clusterFromJson(*j, p);
        if (c)
            f.cluster = std::make_shared<const ClusterSpec>(std::move(*c));
        else
            f.error = QString::fromStdString(c.error());
    } else {
        f.kind = LoadedFile::Kind::Model;
        auto g = looksLikeHfConfig(*j) ? modelFromHfConfig(*j, p)
                 : format == kModelFormat
                     ? modelFromJson(*j, p)
                     : Expected<ModelGraph>(
                           Error{p + ":/: not a ShardScope model, plan or cluster file, nor a "
                                     "Hugging Face config.json"});
        if (g)
            f.model = std::make_shared<const ModelGraph>(std::move(*g));
        else
            f.error = QString::fromStdString(g.error());
    }
    return f;
}

void Document::apply(const LoadedFile& f) {
    if (!f.error.isEmpty()) return;
    switch (f.kind) {
        case LoadedFile::Kind::Model:
            model = f.model;
            modelPath = f.path;
            break;
        case LoadedFile::Kind::Plan:
            // A plan loaded (a file or a recommendation) is shown as it is: the edits and
            // what-ifs made to the one before do not carry over.
            plan = f.plan;
            planPath = f.path;
            planEdited = false;
            whatIf = {};
            break;
        case LoadedFile::Kind::Cluster:
            cluster = f.cluster;
            clusterPath = f.path;
            break;
        case LoadedFile::Kind::Trace:
            std::erase_if(traces, [&](const OpenedTrace& o) { return o.path == f.path; });
            traces.push_back({f.path, f.trace, f.traceTimeline, f.traceSummary, f.traceMemory,
                              f.traceFsdp, f.traceRankMemory});
            showTrace = true;
            return;
    }
    showTrace = false;
    resolved.reset();
    timeline.reset();
    simulation.reset();
    if (model && plan)
        resolved = std::make_shared<const ResolvedPlan>(
            resolvePlan(*model, *plan, cluster.get(), planPath.toStdString()));
    resimulate();
}

bool Document::resimulate(QString* why) {
    timeline.reset();
    simulation.reset();
    baseTimeline.reset();
    baseSimulation.reset();
    if (!resolved || !cluster || resolved->hasErrors()) return false;
    // Simulating one step takes well under a millisecond: done here, not in a thread.
    auto run = [&](const ResolvedPlan& r, int64_t mbs, std::shared_ptr<const TimelineData>& tl,
                   std::shared_ptr<const SimResult>& sr) {
        StepOptions o = stepOptionsFor(*plan, *cluster);
        o.microBatchSize = mbs;
        const StepProgram program = buildStepProgram(r, o);
        auto sim = std::make_shared<SimResult>(simulate(program, *cluster, r.worldSize));
        tl = std::make_shared<const TimelineData>(timelineFromSimulation(r, program, *sim));
        sr = std::move(sim);
    };
    run(*resolved, plan->microBatchSize, baseTimeline, baseSimulation);
    if (!whatIf.active()) {
        timeline = baseTimeline;
        simulation = baseSimulation;
        return true;
    }
    ResolvedPlan edited = *resolved;
    std::string reason;
    if (!applyVariant(edited, whatIf.variant, &reason)) {
        if (why) *why = QString::fromStdString(reason);
        return false;
    }
    run(edited, whatIf.microBatchSize > 0 ? whatIf.microBatchSize : plan->microBatchSize, timeline,
        simulation);
    return true;
}

void Document::replacePlan(Plan p) {
    plan = std::make_shared<const Plan>(std::move(p));
    planEdited = true;
    showTrace = false;  // an edit shows its step; an opened trace stays in Compare
    resolved.reset();
    if (model) {
        resolved = std::make_shared<const ResolvedPlan>(
            resolvePlan(*model, *plan, cluster.get(), planPath.toStdString()));
    }
    resimulate();
}

bool Document::tryPlan(Plan p, QString* why) {
    if (model) {
        const ResolvedPlan r = resolvePlan(*model, p, cluster.get(), planPath.toStdString());
        if (r.errorCount() > (resolved ? resolved->errorCount() : 0)) {
            // The edit's own mistake: the first error the plan did not have before.
            for (const auto& pr : r.problems) {
                if (pr.severity != Problem::Severity::Error) continue;
                bool old = false;
                if (resolved)
                    for (const auto& q : resolved->problems)
                        old = old || q.message == pr.message;
                if (!old) {
                    if (why) *why = QString::fromStdString(pr.message);
                    break;
                }
            }
            return false;
        }
    }
    replacePlan(std::move(p));
    return true;
}

namespace {
// The plan's explicit unit naming exactly this module, if any.
int explicitUnitOf(const Plan& p, const std::string& fqn) {
    for (size_t i = 0; i < p.units.size(); ++i)
        if (p.units[i].modules.size() == 1 && p.units[i].modules[0] == fqn)
            return static_cast<int>(i);
    return -1;
}
}  // namespace

bool Document::setModuleIsUnit(ModuleId module, bool isUnit, QString* why) {
    if (!model || !plan || !resolved) return false;
    const std::string fqn = model->module(module).fqn;
    Plan p = *plan;
    const int spec = explicitUnitOf(p, fqn);
    if (isUnit) {
        if (spec >= 0) return true;
        UnitSpec u;
        u.name = fqn;
        u.modules = {fqn};
        p.units.push_back(std::move(u));
    } else {
        const ResolvedUnit* policyUnit = nullptr;
        for (const auto& u : resolved->units)
            if (u.fromPolicy && u.modules.size() == 1 && u.modules[0] == module) policyUnit = &u;
        if (policyUnit) {
            // The wrap policy made it a unit: the policy's other units become explicit ones
            // and the policy goes, so that this module alone stops being a unit.
            for (const auto& u : resolved->units)
                if (u.fromPolicy && &u != policyUnit &&
                    explicitUnitOf(p, model->module(u.modules[0]).fqn) < 0) {
                    UnitSpec s;
                    s.name = u.name;
                    s.modules = {model->module(u.modules[0]).fqn};
                    p.units.push_back(std::move(s));
                }
            p.wrap = WrapPolicySpec{};
            p.wrap.kind = WrapPolicySpec::Kind::None;
        }
        const int again = explicitUnitOf(p, fqn);
        if (again >= 0) p.units.erase(p.units.begin() + again);
        if (!policyUnit && again < 0) {
            if (why) *why = QString::fromStdString(fqn) + " is not a unit of its own";
            return false;
        }
    }
    return tryPlan(std::move(p), why);
}

bool Document::setWrapPolicy(const WrapPolicySpec& wrap, QString* why) {
    if (!plan) return false;
    Plan p = *plan;
    p.wrap = wrap;
    return tryPlan(std::move(p), why);
}

// The plan's unit spec for a resolved unit, added (same modules, so it overrides a policy
// unit or the root) when the plan has none.
static UnitSpec& specFor(Plan& p, const ModelGraph& g, const ResolvedUnit& ru) {
    const std::string fqn = ru.isRoot ? std::string() : g.module(ru.modules[0]).fqn;
    int spec = explicitUnitOf(p, fqn);
    if (spec < 0) {
        UnitSpec s;
        if (!ru.isRoot) s.name = ru.name;
        s.modules = {fqn};
        p.units.push_back(std::move(s));
        spec = static_cast<int>(p.units.size() - 1);
    }
    return p.units[static_cast<size_t>(spec)];
}

bool Document::setUnitPrefetch(size_t unit, bool forward, const QString& value, QString* why) {
    if (!plan || !resolved || !model || unit >= resolved->units.size()) return false;
    Plan p = *plan;
    UnitSpec& s = specFor(p, *model, resolved->units[unit]);
    auto& list = forward ? s.forwardPrefetch : s.backwardPrefetch;
    const QString v = value.trimmed();
    if (v.isEmpty() || v.compare("implicit", Qt::CaseInsensitive) == 0) {
        list.reset();
    } else {
        list = std::vector<std::string>{};
        if (v.compare("none", Qt::CaseInsensitive) != 0)
            for (const QString& n : v.split(',', Qt::SkipEmptyParts))
                list->push_back(n.trimmed().toStdString());
    }
    return tryPlan(std::move(p), why);
}

bool Document::setUnitSetting(size_t unit, UnitSetting which, const QString& value, QString* why) {
    if (!plan || !resolved || !model || unit >= resolved->units.size()) return false;
    Plan p = *plan;
    UnitSettings& st = specFor(p, *model, resolved->units[unit]).settings;
    const QString v = value.trimmed().toLower();
    switch (which) {
        case UnitSetting::Checkpointing:
            if (v == "none")
                st.activationCheckpointing = AcMode::None;
            else if (v == "attention")
                st.activationCheckpointing = AcMode::Attention;
            else if (v == "selective_op")
                st.activationCheckpointing = AcMode::SelectiveOp;
            else if (v == "full")
                st.activationCheckpointing = AcMode::Full;
            else {
                if (why)
                    *why =
                        "activation_checkpointing: expected none, full, selective_op or "
                        "attention, got \"" +
                        value + "\"";
                return false;
            }
            break;
        case UnitSetting::Precision: {
            if (v == "-" || v.isEmpty()) {
                st.mixedPrecision = MixedPrecisionSpec{};
                break;
            }
            const QStringList parts = v.split('/');
            MixedPrecisionSpec mp;
            for (int i = 0; i < parts.size() && i < 2; ++i) {
                const QString name = parts[i].trimmed();
                if (name.isEmpty() || name == "-") continue;
                const auto d = parseDType(name.toStdString());
                if (!d || parts.size() > 2) {
                    if (why)
                        *why =
                            "mixed_precision: expected \"PARAM / REDUCE\" dtypes such as "
                            "\"bfloat16 / float32\", or \"-\", got \"" +
                            value + "\"";
                    return false;
                }
                (i == 0 ? mp.paramDtype : mp.reduceDtype) = *d;
            }
            st.mixedPrecision = mp;
            break;
        }
        case UnitSetting::Offload:
            if (v == "yes" || v == "true" || v == "on")
                st.offload = OffloadSpec{true, true};
            else if (v == "no" || v == "false" || v == "off")
                st.offload = OffloadSpec{false, true};
            else {
                if (why) *why = "offload: expected yes or no, got \"" + value + "\"";
                return false;
            }
            break;
    }
    return tryPlan(std::move(p), why);
}

bool Document::setPlanWide(const QString& mesh, const QString& paramDtype,
                           const QString& reduceDtype, bool offload, QString* why) {
    if (!plan) return false;
    Plan p = *plan;
    p.meshShape.clear();
    for (const QString& d : mesh.split(',', Qt::SkipEmptyParts)) {
        bool ok = false;
        const qlonglong n = d.trimmed().toLongLong(&ok);
        if (!ok || n < 1) {
            if (why)
                *why =
                    "mesh: expected ranks per dimension, e.g. 64 or 8,8 (replicate, shard), "
                    "got \"" +
                    mesh + "\"";
            return false;
        }
        p.meshShape.push_back(n);
    }
    auto dtype = [&](const QString& name, std::optional<DType>& out) {
        if (name.isEmpty()) {
            out.reset();
            return true;
        }
        auto d = parseDType(name.toStdString());
        if (!d) {
            if (why)
                *why = "mixed precision: unknown dtype \"" + name +
                       "\" (float32, bfloat16, float16, ...)";
            return false;
        }
        out = *d;
        return true;
    };
    MixedPrecisionSpec mp = p.defaults.mixedPrecision.value_or(MixedPrecisionSpec{});
    if (!dtype(paramDtype, mp.paramDtype) || !dtype(reduceDtype, mp.reduceDtype)) return false;
    if (mp.paramDtype || mp.reduceDtype)
        p.defaults.mixedPrecision = mp;
    else
        p.defaults.mixedPrecision.reset();
    if (offload)
        p.defaults.offload = OffloadSpec{true, true};
    else
        p.defaults.offload.reset();
    return tryPlan(std::move(p), why);
}

bool Document::setUnitReshard(size_t unit, const QString& value, QString* why) {
    if (!plan || !resolved || unit >= resolved->units.size()) return false;
    ReshardSetting setting;
    const QString v = value.toLower();
    bool isInt = false;
    const int k = value.toInt(&isInt);
    if (v == "true")
        setting = ReshardSetting::ofBool(true);
    else if (v == "false")
        setting = ReshardSetting::ofBool(false);
    else if (isInt && k >= 1)
        setting = ReshardSetting::ofInt(k);
    else {
        if (why)
            *why =
                "reshard_after_forward: expected True, False or a group size (an integer "
                "that divides the shard size), got \"" +
                value + "\"";
        return false;
    }
    Plan p = *plan;
    specFor(p, *model, resolved->units[unit]).settings.reshardAfterForward = setting;
    return tryPlan(std::move(p), why);
}

std::vector<CompareSource> Document::compareSources() const {
    std::vector<CompareSource> out;
    const QString plan = planPath.isEmpty() ? QString("plan") : QFileInfo(planPath).fileName();
    if (timeline && timeline != baseTimeline)
        out.push_back({"simulated: " + plan + " with the what-if edits", timeline, simulation});
    if (baseTimeline)
        out.push_back({"simulated: " + plan + " as written", baseTimeline, baseSimulation});
    for (const auto& t : traces)
        out.push_back({"trace: " + QFileInfo(t.path).fileName(), t.timeline, t.memory});
    return out;
}

}  // namespace shardscope::gui
