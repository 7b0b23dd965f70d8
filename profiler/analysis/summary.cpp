// SPDX-License-Identifier: Apache-2.0
#include "profiler/analysis/summary.h"

#include <cctype>

#include <algorithm>
#include <unordered_map>

#include "plans/core/intervals.h"
#include "profiler/analysis/fsdp_trace.h"
#include "profiler/import/kineto_import.h"

namespace shardscope {

namespace {}  // namespace

namespace {

// HTA's merge_kernel_intervals and its sums: intervals sorted by start; a new group starts
// when a start is after every earlier end; a group spans its first start to its largest end
// (which a rounded-away kernel can leave before its start). Returns the groups in order.
std::vector<Interval> htaMerge(std::vector<Interval> v) {
    std::stable_sort(v.begin(), v.end(),
                     [](const Interval& a, const Interval& b) { return a.first < b.first; });
    std::vector<Interval> groups;
    int64_t cummax = INT64_MIN;
    for (const auto& iv : v) {
        if (groups.empty() || iv.first > cummax)
            groups.push_back(iv);
        else
            groups.back().second = std::max(groups.back().second, iv.second);
        cummax = std::max(cummax, iv.second);
    }
    return groups;
}

int64_t htaLength(const std::vector<Interval>& groups) {
    int64_t n = 0;
    for (const auto& g : groups)
        n += g.second - g.first;
    return n;
}

// HTA's rounding of a float-microsecond time: start up, end down (in the file's clock).
int64_t ceilUs(int64_t ns) {
    const int64_t q = ns / 1000, r = ns % 1000;
    return (r > 0 ? q + 1 : q) * 1000;
}
int64_t floorUs(int64_t ns) {
    const int64_t q = ns / 1000, r = ns % 1000;
    return (r < 0 ? q - 1 : q) * 1000;
}

// A CPU run: collectives on Gloo's threads, compute on the thread that issued them (the host
// thread with the most ops). Exposed: communication while it was idle.
void hostCommunication(const Trace& t, TraceSummary& s) {
    std::vector<Interval> comm;
    std::unordered_map<int32_t, int64_t> ops;
    for (size_t i = 0; i < t.size(); ++i) {
        if (t.cls[i] == EventClass::Communication)
            comm.emplace_back(t.start[i], t.start[i] + t.dur[i]);
        else if (t.cls[i] == EventClass::Cpu)
            ++ops[t.lane[i]];
    }
    if (!comm.empty() && !ops.empty()) {
        const int32_t main =
            std::max_element(ops.begin(), ops.end(), [](const auto& x, const auto& y) {
                return x.second < y.second;
            })->first;
        const auto commU = mergeIntervals(std::move(comm));
        s.hostCommNs = totalLength(commU);
        s.hostExposedNs = s.hostCommNs - intersectionLength(commU, hostBusy(t, {main}));
    }
}

// Collective bandwidth by kind and size, in buckets of factor 16 from 64 KiB: per bucket
// the sums, then the ratios. Only the kept events (`keep`) count.
void collectiveBandwidth(const Trace& t, const std::vector<bool>& keep, TraceSummary& s) {
    static const int64_t edges[] = {0, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
    constexpr int kBuckets = 5;
    struct Sums {
        TraceSummary::Bandwidth bw;
        double busBytes = 0;  // S x the bus factor, summed
        bool busKnown = true;
    };
    std::map<std::pair<std::string, int>, Sums> buckets;
    for (const auto& c : t.collectives) {
        if (!keep[static_cast<size_t>(c.event)]) continue;
        const int64_t dur = t.dur[static_cast<size_t>(c.event)];
        if (c.fullBytes <= 0 || dur <= 0) continue;
        int b = 0;
        while (b + 1 < kBuckets && c.fullBytes >= edges[b + 1])
            ++b;
        const std::string name = c.name.empty() ? "unknown" : c.name;
        Sums& k = buckets[{name, b}];
        k.bw.collective = name;
        k.bw.minBytes = edges[b];
        k.bw.maxBytes = b + 1 < kBuckets ? edges[b + 1] : 0;
        ++k.bw.count;
        k.bw.bytes += c.fullBytes;
        k.bw.durationNs += dur;
        const double factor = busBandwidthFactor(collectiveKindOf(name), c.groupSize);
        k.busKnown = k.busKnown && factor >= 0;
        k.busBytes += factor * static_cast<double>(c.fullBytes);
    }
    for (auto& [_, k] : buckets) {
        const auto ns = static_cast<double>(k.bw.durationNs);
        k.bw.algGBps = static_cast<double>(k.bw.bytes) / ns;
        k.bw.busGBps = k.busKnown ? k.busBytes / ns : -1;
        s.bandwidth.push_back(k.bw);
    }
}

}  // namespace

TraceSummary summarize(const Trace& t, const SummaryOptions& o) {
    TraceSummary s;
    s.rank = t.rank;
    s.dialect = t.dialect;
    s.events = t.size();
    for (const auto& l : t.lanes)
        (l.kind == LaneKind::DeviceStream ? s.deviceLanes : s.hostLanes)++;
    auto isDevice = [&](size_t i) {
        return t.lanes[static_cast<size_t>(t.lane[i])].kind == LaneKind::DeviceStream;
    };
    // Times as HTA sees them: rounded in the file's clock, then back to the trace's.
    auto startOf = [&](size_t i) {
        return o.roundToMicroseconds ? ceilUs(t.start[i] + t.timeOriginNs) - t.timeOriginNs
                                     : t.start[i];
    };
    auto endOf = [&](size_t i) {
        return o.roundToMicroseconds
                   ? floorUs(t.start[i] + t.dur[i] + t.timeOriginNs) - t.timeOriginNs
                   : t.start[i] + t.dur[i];
    };
    // HTA's filter of the last ProfilerStep and of GPU events no kept host event launched.
    std::vector<bool> keep(t.size(), true);
    {
        std::unordered_map<int32_t, bool> stepNames;
        int64_t lastStepStart = INT64_MIN;
        for (size_t i = 0; i < t.size(); ++i) {
            if (isDevice(i)) continue;
            const std::string& n = t.strings.at(t.name[i]);
            if (n.rfind("ProfilerStep", 0) != 0) continue;
            stepNames[t.name[i]] = true;
            lastStepStart = std::max(lastStepStart, startOf(i));
        }
        s.profilerSteps = static_cast<int64_t>(stepNames.size());
        if (stepNames.size() >= 2 && (o.dropLastStep || o.dropUnlinkedKernels)) {
            s.droppedLastStep = o.dropLastStep;
            std::vector<bool> launched(t.size(), false);
            for (const auto& [from, to] : t.flowEvents)
                if (!o.dropLastStep || startOf(static_cast<size_t>(from)) < lastStepStart)
                    launched[static_cast<size_t>(to)] = true;
            for (size_t i = 0; i < t.size(); ++i) {
                if (!isDevice(i)) {
                    if (o.dropLastStep && startOf(i) >= lastStepStart) keep[i] = false;
                    continue;
                }
                if (o.dropUnlinkedKernels ? !launched[i]
                                          : (o.dropLastStep && startOf(i) >= lastStepStart)) {
                    keep[i] = false;
                    ++s.droppedDeviceEvents;
                }
            }
        }
    }
    std::vector<Interval> all, compute, comm;
    auto add = [&](size_t i, EventClass cls) {
        const Interval iv{startOf(i), endOf(i)};
        all.push_back(iv);
        if (cls == EventClass::Computation) compute.push_back(iv);
        if (cls == EventClass::Communication) comm.push_back(iv);
    };
    for (size_t i = 0; i < t.size(); ++i) {
        // GPU activity only (kernels, memcpy, memset, stream syncs): host ranges and GPU user
        // annotations projected onto a stream are not device work.
        if (t.cls[i] == EventClass::Cpu || !isDevice(i) || !keep[i]) continue;
        add(i, t.cls[i]);
    }
    if (o.hostOpsWithStream)
        for (const int32_t e : t.hostOpsWithStream)
            if (keep[static_cast<size_t>(e)])
                add(static_cast<size_t>(e),
                    classifyDeviceEvent(t.strings.at(t.name[static_cast<size_t>(e)]), "kernel"));
    if (!all.empty()) {
        const auto allG = htaMerge(all), compG = htaMerge(compute), commG = htaMerge(comm);
        s.kernelTimeNs = allG.back().second - allG.front().first;
        s.idleNs = s.kernelTimeNs - htaLength(allG);
        s.computeNs = htaLength(compG);
        s.nonComputeNs = s.kernelTimeNs - s.computeNs - s.idleNs;
        s.commNs = htaLength(commG);
        s.overlapRatio = s.commNs > 0 ? static_cast<double>(intersectionLength(
                                            mergeIntervals(commG), mergeIntervals(compG))) /
                                            static_cast<double>(s.commNs)
                                      : 0;
    }
    if (s.kernelTimeNs == 0) hostCommunication(t, s);
    for (const auto& m : t.hostMemory)
        s.hostPeakAllocated = std::max(s.hostPeakAllocated, m.allocated);
    for (const auto& c : t.collectives) {
        if (!keep[static_cast<size_t>(c.event)]) continue;
        auto& st = s.collectives[c.name.empty() ? "unknown" : c.name];
        ++st.count;
        st.bytes += c.bytes;
        st.durationNs += t.dur[static_cast<size_t>(c.event)];
    }
    collectiveBandwidth(t, keep, s);
    for (const auto& m : t.memory) {
        s.peakAllocated = std::max(s.peakAllocated, m.allocated);
        s.peakReserved = std::max(s.peakReserved, m.reserved);
    }
    s.skippedPythonFunctions = t.skippedPythonFunctions;
    s.orphanFlowEnds = t.orphanFlowEnds;
    s.flows = t.flows;
    s.eventsByCategory.insert(t.eventsByCategory.begin(), t.eventsByCategory.end());
    return s;
}

CollectiveKind collectiveKindOf(std::string_view name) {
    std::string n;
    for (const char c : name)
        if (c != '_') n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (n.find("allgather") != std::string::npos) return CollectiveKind::AllGather;
    if (n.find("reducescatter") != std::string::npos) return CollectiveKind::ReduceScatter;
    if (n.find("allreduce") != std::string::npos) return CollectiveKind::AllReduce;
    return CollectiveKind::Other;
}

double busBandwidthFactor(CollectiveKind k, int32_t groupSize) {
    if (k == CollectiveKind::Other) return 1.0;
    if (groupSize <= 0) return -1.0;
    const double ring = static_cast<double>(groupSize - 1) / static_cast<double>(groupSize);
    return k == CollectiveKind::AllReduce ? 2.0 * ring : ring;
}

nlohmann::json summaryToJson(const TraceSummary& s) {
    nlohmann::json coll = nlohmann::json::object();
    for (const auto& [name, c] : s.collectives)
        coll[name] = {{"count", c.count}, {"bytes", c.bytes}, {"duration_ns", c.durationNs}};
    nlohmann::json bw = nlohmann::json::array();
    for (const auto& b : s.bandwidth)
        bw.push_back(
            {{"collective", b.collective},
             {"min_bytes", b.minBytes},
             {"max_bytes", b.maxBytes > 0 ? nlohmann::json(b.maxBytes) : nlohmann::json()},
             {"count", b.count},
             {"bytes", b.bytes},
             {"duration_ns", b.durationNs},
             {"algbw_gbps", b.algGBps},
             {"busbw_gbps", b.busGBps >= 0 ? nlohmann::json(b.busGBps) : nlohmann::json()}});
    return {{"rank", s.rank},
            {"dialect", s.dialect},
            {"events", s.events},
            {"profiler_steps", s.profilerSteps},
            {"dropped_last_step", s.droppedLastStep},
            {"dropped_device_events", s.droppedDeviceEvents},
            {"device_lanes", s.deviceLanes},
            {"host_lanes", s.hostLanes},
            {"temporal_breakdown",
             {{"kernel_time_ns", s.kernelTimeNs},
              {"compute_ns", s.computeNs},
              {"non_compute_ns", s.nonComputeNs},
              {"idle_ns", s.idleNs}}},
            {"comm_ns", s.commNs},
            {"comp_comm_overlap_ratio", s.overlapRatio},
            {"host_comm_ns", s.hostCommNs},
            {"host_exposed_comm_ns", s.hostExposedNs},
            {"host_peak_allocated_bytes", s.hostPeakAllocated},
            {"collectives", coll},
            {"bandwidth", bw},
            {"peak_allocated_bytes", s.peakAllocated},
            {"peak_reserved_bytes", s.peakReserved},
            {"skipped_python_functions", s.skippedPythonFunctions},
            {"flows", s.flows},
            {"orphan_flow_ends", s.orphanFlowEnds},
            {"events_by_category", s.eventsByCategory}};
}

}  // namespace shardscope
