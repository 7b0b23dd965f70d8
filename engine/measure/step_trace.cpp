// SPDX-License-Identifier: Apache-2.0
#include "engine/measure/step_trace.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "profiler/import/kineto_import.h"
#include "profiler/record/device_activity.h"

namespace shardscope {

Expected<TraceFile> stepTraceOf(const Trace& t, const std::string& path) {
    TraceFile f;
    f.path = path;
    int64_t pidOffset = 0;
    if (!t.metadata.empty()) {
        const auto m = nlohmann::json::parse(t.metadata, nullptr, false);
        if (m.is_object()) {
            if (m.contains("producer") && m["producer"].is_string())
                f.producer = m["producer"].get<std::string>();
            if (m.contains("rank_pid_offset") && m["rank_pid_offset"].is_number_integer())
                pidOffset = m["rank_pid_offset"].get<int64_t>();
            if (m.contains("run")) f.run = m["run"];
        }
    }
    // A rank is its process: pid - metadata.rank_pid_offset (kept in int32 range).
    auto rankOf = [&](size_t e) {
        int64_t r = 0;
        if (__builtin_sub_overflow(t.lanes[static_cast<size_t>(t.lane[e])].pid, pidOffset, &r))
            r = -1;
        return static_cast<int32_t>(std::clamp<int64_t>(r, 0, 1 << 20));
    };
    std::map<int32_t, std::pair<double, int>> spans;  // rank -> (sum, count) of step spans
    int64_t lastEnd = 0;
    // A CUDA run (`shardscope run --device cuda`): its FSDP ops' spans are host launches, and
    // the GPU time of each is the span of the kernels, copies and memsets it launched.
    std::map<std::tuple<int32_t, int32_t, int32_t>, std::pair<int64_t, int64_t>> gpuSpan;
    std::vector<size_t> launchedOnHost;            // indices into f.ops
    std::unordered_map<int32_t, int32_t> groupOf;  // event -> its collective's group size
    for (const Collective& c : t.collectives)
        if (c.groupSize > 0) groupOf[c.event] = c.groupSize;
    for (size_t e = 0; e < t.size(); ++e) {
        const std::string& cat = t.strings.at(t.category[e]);
        const int64_t t0 = t.start[e], t1 = t.start[e] + t.dur[e];
        if (cat == "step") {
            auto& s = spans[rankOf(e)];
            s.first += static_cast<double>(t1 - t0);
            ++s.second;
            continue;
        }
        if (t.opId[e] < 0) continue;
        const auto stepIt = t.opStep.find(static_cast<int32_t>(e));
        const int32_t step = stepIt != t.opStep.end() ? stepIt->second : 0;
        const auto kind = opKindFromName(cat);
        if (!kind) {
            // The GPU work of a CUDA run names the op that launched it (fsdp_op_id).
            if (!record::isDeviceWorkCategory(cat)) continue;
            const auto key = std::make_tuple(rankOf(e), step, t.opId[e]);
            auto [it, fresh] = gpuSpan.try_emplace(key, t0, t1);
            if (!fresh) {
                it->second.first = std::min(it->second.first, t0);
                it->second.second = std::max(it->second.second, t1);
            }
            continue;
        }
        TraceOp op;
        op.opId = t.opId[e];
        op.rank = rankOf(e);
        op.step = step;
        op.startNs = t0;
        op.endNs = t1;
        op.kind = kind;
        op.label = t.strings.at(t.name[e]);
        if (t.unit[e] >= 0) op.unit = t.strings.at(t.unit[e]);
        if (t.phase[e] >= 0) op.phase = t.strings.at(t.phase[e]);
        if (auto g = groupOf.find(static_cast<int32_t>(e)); g != groupOf.end())
            op.groupSize = g->second;
        // A ShardScope op on a host row is a CUDA run's launch (launched_on_host).
        if (t.lanes[static_cast<size_t>(t.lane[e])].kind == LaneKind::HostThread)
            launchedOnHost.push_back(f.ops.size());
        f.ops.push_back(std::move(op));
        f.ranks = std::max(f.ranks, f.ops.back().rank + 1);
        lastEnd = std::max(lastEnd, t1);
    }
    for (size_t i : launchedOnHost) {
        TraceOp& op = f.ops[i];
        if (auto it = gpuSpan.find({op.rank, op.step, op.opId}); it != gpuSpan.end()) {
            op.startNs = it->second.first;
            op.endNs = it->second.second;
        }
    }
    if (f.ops.empty())
        return Error{path +
                     ": no ops with a ShardScope op id: not written by `shardscope run --trace` "
                     "or `shardscope simulate --trace` (a PyTorch profiler trace? `trace "
                     "overlap`, `trace diff` and `calibrate` read those from FSDP's labels)"};
    f.peakAllocated = static_cast<double>(t.counterPeakAllocated);
    // A CUDA run's device peaks (the host counter sees none of the GPU's allocations).
    if (f.run.is_object() && f.run.contains("device_peak_allocated_bytes") &&
        f.run["device_peak_allocated_bytes"].is_array())
        for (const auto& v : f.run["device_peak_allocated_bytes"])
            if (v.is_number()) f.peakAllocated = std::max(f.peakAllocated, v.get<double>());
    for (const auto& [_, s] : spans)
        f.stepNs = std::max(f.stepNs, s.first / std::max(1, s.second));
    // A simulated step starts at the file's time 0 (its first op may start later).
    if (spans.empty()) f.stepNs = static_cast<double>(lastEnd + t.timeOriginNs);
    return f;
}

Expected<TraceFile> readTraceFile(const std::string& path) {
    auto t = importKinetoFile(path);
    if (!t) return Error{t.error()};
    return stepTraceOf(*t, path);
}

}  // namespace shardscope
