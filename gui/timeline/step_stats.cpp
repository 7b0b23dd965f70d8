// SPDX-License-Identifier: Apache-2.0
#include "gui/timeline/step_stats.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "plans/core/intervals.h"

namespace shardscope::gui {

namespace {

bool isComm(EventKind k) {
    return k == EventKind::AllGather || k == EventKind::ReduceScatter || k == EventKind::AllReduce;
}

struct Clipped {
    std::vector<Interval> all, compute, comm;
    int32_t events = 0;
};

Clipped clip(const TimelineData& d, const std::string& group, int64_t t0, int64_t t1) {
    Clipped c;
    for (const auto& row : d.rows) {
        if (row.group != group || row.host) continue;  // launches are not device work
        auto it = std::lower_bound(row.events.begin(), row.events.end(), t0,
                                   [](const TimelineEvent& e, int64_t t) { return e.end <= t; });
        for (; it != row.events.end() && it->start < t1; ++it) {
            const Interval iv{std::max(it->start, t0), std::min(it->end, t1)};
            if (iv.second <= iv.first) continue;
            ++c.events;
            c.all.push_back(iv);
            if (it->kind == EventKind::Compute) c.compute.push_back(iv);
            if (isComm(it->kind)) c.comm.push_back(iv);
        }
    }
    return c;
}

RangeStats statsOf(Clipped c, const std::string& group, int64_t t0, int64_t t1) {
    RangeStats s;
    s.group = group;
    s.startNs = t0;
    s.endNs = t1;
    s.events = c.events;
    const auto all = mergeIntervals(std::move(c.all));
    const auto compute = mergeIntervals(std::move(c.compute));
    const auto comm = mergeIntervals(std::move(c.comm));
    s.busyNs = totalLength(all);
    s.computeNs = totalLength(compute);
    s.commNs = totalLength(comm);
    s.exposedCommNs = s.commNs - intersectionLength(comm, compute);
    return s;
}

std::vector<std::string> groupsOf(const TimelineData& d) {
    std::vector<std::string> groups;
    for (const auto& row : d.rows)
        if (std::find(groups.begin(), groups.end(), row.group) == groups.end())
            groups.push_back(row.group);
    return groups;
}

}  // namespace

std::vector<RangeStats> rangeStats(const TimelineData& d, int64_t startNs, int64_t endNs) {
    std::vector<RangeStats> out;
    for (const auto& g : groupsOf(d))
        out.push_back(statsOf(clip(d, g, startNs, endNs), g, startNs, endNs));
    return out;
}

StepStats stepStats(const TimelineData& d) {
    StepStats s;
    const auto groups = groupsOf(d);
    if (groups.empty()) return s;
    const std::string& g = groups.front();
    std::vector<Interval> ranges;
    for (const auto& st : d.steps)
        if (st.group == g && st.end > st.start) ranges.push_back({st.start, st.end});
    if (ranges.empty()) {
        int64_t t0 = INT64_MAX, t1 = INT64_MIN;
        for (const auto& row : d.rows)
            if (row.group == g && !row.events.empty()) {
                t0 = std::min(t0, row.events.front().start);
                for (const auto& e : row.events)
                    t1 = std::max(t1, e.end);
            }
        if (t0 > t1) return s;
        ranges.push_back({std::min<int64_t>(0, t0), t1});  // a step starts at time 0
    }
    s.steps = static_cast<int32_t>(ranges.size());
    const auto n = static_cast<int64_t>(ranges.size());
    s.total.group = g;
    s.total.startNs = ranges.front().first;
    s.total.endNs = ranges.back().second;
    int64_t span = 0;
    for (const auto& [t0, t1] : ranges) {
        const RangeStats r = statsOf(clip(d, g, t0, t1), g, t0, t1);
        span += t1 - t0;
        s.total.busyNs += r.busyNs;
        s.total.computeNs += r.computeNs;
        s.total.commNs += r.commNs;
        s.total.exposedCommNs += r.exposedCommNs;
        s.total.events += r.events;
    }
    s.stepNs = span / n;
    s.total.busyNs /= n;
    s.total.computeNs /= n;
    s.total.commNs /= n;
    s.total.exposedCommNs /= n;
    std::vector<Interval> compute;
    for (const auto& row : d.rows)
        if (row.group == g)
            for (const auto& e : row.events)
                if (e.kind == EventKind::Compute) compute.push_back({e.start, e.end});
    const auto computeU = mergeIntervals(std::move(compute));
    for (const auto& row : d.rows) {
        if (row.group != g) continue;
        for (const auto& e : row.events) {
            if (!isComm(e.kind)) continue;
            bool inStep = false;
            for (const auto& [t0, t1] : ranges)
                inStep = inStep || (e.start < t1 && e.end > t0);
            if (!inStep) continue;
            const std::string unit = e.unit >= 0 && static_cast<size_t>(e.unit) < d.units.size()
                                         ? (d.units[static_cast<size_t>(e.unit)].empty()
                                                ? std::string("<root>")
                                                : d.units[static_cast<size_t>(e.unit)])
                                         : std::string("(unknown unit)");
            const std::vector<Interval> one{{e.start, e.end}};
            s.commByUnit[unit] += e.end - e.start;
            s.exposedCommByUnit[unit] += (e.end - e.start) - intersectionLength(one, computeU);
        }
    }
    for (auto* m : {&s.commByUnit, &s.exposedCommByUnit})
        for (auto& [_, v] : *m)
            v /= n;
    return s;
}

namespace {
// What a selection groups by: the label without its unit ("model.layers.3 all-gather" ->
// "all-gather", "<root> forward" -> "forward"), so that one op kind over all units is one
// row; a trace's kernel names as they are.
std::string aggregateName(const TimelineData& d, const TimelineEvent& e) {
    if (e.unit >= 0 && static_cast<size_t>(e.unit) < d.units.size()) {
        const std::string& u = d.units[static_cast<size_t>(e.unit)];
        const std::string prefix = (u.empty() ? std::string("<root>") : u) + " ";
        if (e.label.size() > prefix.size() && e.label.compare(0, prefix.size(), prefix) == 0)
            return e.label.substr(prefix.size());
    }
    return e.label;
}
}  // namespace

std::vector<NameStats> statsByName(const TimelineData& d, int64_t startNs, int64_t endNs) {
    std::map<std::string, NameStats> by;
    for (const auto& row : d.rows) {
        if (row.host) continue;
        // Sorted by start; nested slices may end out of order, so every earlier event is
        // checked for its end.
        const auto last =
            std::lower_bound(row.events.begin(), row.events.end(), endNs,
                             [](const TimelineEvent& e, int64_t t) { return e.start < t; });
        for (auto it = row.events.begin(); it != last; ++it) {
            if (it->end <= startNs) continue;
            NameStats& n = by[aggregateName(d, *it)];
            ++n.count;
            n.inRangeNs += std::min(it->end, endNs) - std::max(it->start, startNs);
            n.totalNs += it->end - it->start;
            n.maxNs = std::max(n.maxNs, it->end - it->start);
        }
    }
    std::vector<NameStats> out;
    out.reserve(by.size());
    for (auto& [name, n] : by) {
        n.name = name;
        out.push_back(std::move(n));
    }
    std::sort(out.begin(), out.end(), [](const NameStats& a, const NameStats& b) {
        return a.inRangeNs != b.inRangeNs ? a.inRangeNs > b.inRangeNs : a.name < b.name;
    });
    return out;
}

std::vector<EventRef> findEvents(const TimelineData& d, const std::string& query) {
    std::vector<EventRef> out;
    if (query.empty()) return out;
    auto lower = [](unsigned char c) { return static_cast<char>(std::tolower(c)); };
    std::string q(query.size(), ' ');
    std::transform(query.begin(), query.end(), q.begin(), lower);
    std::string label;
    for (size_t r = 0; r < d.rows.size(); ++r) {
        if (d.rows[r].host) continue;
        const auto& ev = d.rows[r].events;
        for (size_t i = 0; i < ev.size(); ++i) {
            label.resize(ev[i].label.size());
            std::transform(ev[i].label.begin(), ev[i].label.end(), label.begin(), lower);
            if (label.find(q) != std::string::npos)
                out.push_back({static_cast<int32_t>(r), static_cast<int32_t>(i)});
        }
    }
    std::stable_sort(out.begin(), out.end(), [&](const EventRef& a, const EventRef& b) {
        return d.rows[static_cast<size_t>(a.row)].events[static_cast<size_t>(a.index)].start <
               d.rows[static_cast<size_t>(b.row)].events[static_cast<size_t>(b.index)].start;
    });
    return out;
}

}  // namespace shardscope::gui
