// SPDX-License-Identifier: Apache-2.0
#include "profiler/analysis/summary.h"

#include <cctype>

#include <algorithm>
#include <unordered_map>

#include "plans/core/intervals.h"
#include "profiler/analysis/fsdp_trace.h"

namespace shardscope {

namespace {}  // namespace

TraceSummary summarize(const Trace& t) {
    TraceSummary s;
    s.rank = t.rank;
    s.dialect = t.dialect;
    s.events = t.size();
    for (const auto& l : t.lanes)
        (l.kind == LaneKind::DeviceStream ? s.deviceLanes : s.hostLanes)++;
    std::vector<Interval> all, compute, comm;
    int64_t first = INT64_MAX, last = INT64_MIN;
    for (size_t i = 0; i < t.size(); ++i) {
        // GPU activity only (kernels, memcpy, memset): host ranges and GPU user annotations
        // projected onto a stream are not device work.
        if (t.cls[i] == EventClass::Cpu ||
            t.lanes[static_cast<size_t>(t.lane[i])].kind != LaneKind::DeviceStream)
            continue;
        const Interval iv{t.start[i], t.start[i] + t.dur[i]};
        first = std::min(first, iv.first);
        last = std::max(last, iv.second);
        all.push_back(iv);
        if (t.cls[i] == EventClass::Computation) compute.push_back(iv);
        if (t.cls[i] == EventClass::Communication) comm.push_back(iv);
    }
    if (!all.empty()) {
        s.kernelTimeNs = last - first;
        const auto allU = mergeIntervals(all), compU = mergeIntervals(compute),
                   commU = mergeIntervals(comm);
        s.idleNs = s.kernelTimeNs - totalLength(allU);
        s.computeNs = totalLength(compU);
        s.nonComputeNs = s.kernelTimeNs - s.computeNs - s.idleNs;
        s.commNs = totalLength(commU);
        s.overlapRatio = s.commNs > 0 ? static_cast<double>(intersectionLength(commU, compU)) /
                                            static_cast<double>(s.commNs)
                                      : 0;
    }
    if (s.kernelTimeNs == 0) {
        // A CPU run: collectives on Gloo's threads, compute on the thread that issued them
        // (the host thread with the most ops). Exposed: communication while it was idle.
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
            s.hostExposedNs = s.hostCommNs - intersectionLength(commU, hostBusy(t, main));
        }
    }
    for (const auto& m : t.hostMemory)
        s.hostPeakAllocated = std::max(s.hostPeakAllocated, m.allocated);
    for (const auto& c : t.collectives) {
        auto& st = s.collectives[c.name.empty() ? "unknown" : c.name];
        ++st.count;
        st.bytes += c.bytes;
        st.durationNs += t.dur[static_cast<size_t>(c.event)];
    }
    {
        // Size buckets of factor 16 from 64 KiB; per bucket the sums, then the ratios.
        static const int64_t edges[] = {0, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
        constexpr int kBuckets = 5;
        struct Sums {
            TraceSummary::Bandwidth bw;
            double busBytes = 0;  // S x the bus factor, summed
            bool busKnown = true;
        };
        std::map<std::pair<std::string, int>, Sums> buckets;
        for (const auto& c : t.collectives) {
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
