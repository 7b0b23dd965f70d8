// SPDX-License-Identifier: Apache-2.0
#include "engine/cli/trace_file.h"

#include "profiler/record/device_activity.h"

#include <cmath>
#include <fstream>
#include <map>
#include <tuple>
#include <vector>

namespace shardscope::cli {

Expected<TraceFile> readTraceFile(const std::string& path) {
    std::ifstream in(path);
    if (!in) return Error{path + ": cannot open file"};
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") ||
        !j["traceEvents"].is_array())
        return Error{path + ":/traceEvents: expected a Chrome trace with a traceEvents array"};
    TraceFile t;
    t.path = path;
    int pidOffset = 0;
    if (j.contains("metadata") && j["metadata"].is_object()) {
        t.producer = j["metadata"].value("producer", "");
        pidOffset = j["metadata"].value("rank_pid_offset", 0);
        if (j["metadata"].contains("run")) t.run = j["metadata"]["run"];
    }
    std::map<int32_t, std::pair<double, int>> spans;  // rank -> (sum, count) of step spans
    int64_t lastEnd = 0;
    // A CUDA run (`shardscope run --device cuda`): its FSDP ops' spans are host launches, and
    // the GPU time of each is the span of the kernels, copies and memsets it launched.
    std::map<std::tuple<int32_t, int32_t, int32_t>, std::pair<int64_t, int64_t>> gpuSpan;
    std::vector<size_t> launchedOnHost;  // indices into t.ops
    for (const auto& e : j["traceEvents"]) {
        if (!e.is_object()) continue;
        const std::string ph = e.value("ph", "");
        if (ph == "C" && e.value("name", "") == "memory (bytes)" && e.contains("args") &&
            e["args"].is_object())
            t.peakAllocated = std::max(t.peakAllocated, e["args"].value("allocated", 0.0));
        if (ph != "X") continue;
        const auto rank = static_cast<int32_t>(e.value("pid", int64_t{0}) - pidOffset);
        const int64_t t0 = std::llround(e.value("ts", 0.0) * 1000.0);
        const int64_t t1 = t0 + std::llround(e.value("dur", 0.0) * 1000.0);
        if (e.value("cat", "") == "step") {
            spans[rank].first += static_cast<double>(t1 - t0);
            ++spans[rank].second;
            continue;
        }
        if (!e.contains("args") || !e["args"].is_object()) continue;
        const auto& a = e["args"];
        if (a.contains("fsdp_op_id")) {
            // Device work only: the launching calls (cuda_runtime, cuda_driver) and
            // synchronisation carry the label too but are not the op's GPU time.
            if (!record::isDeviceWorkCategory(e.value("cat", "")) ||
                !a["fsdp_op_id"].is_number_integer() || !a.contains("fsdp_step") ||
                !a["fsdp_step"].is_number_integer())
                continue;
            const auto key = std::make_tuple(rank, a["fsdp_step"].get<int32_t>(),
                                             a["fsdp_op_id"].get<int32_t>());
            auto [it, fresh] = gpuSpan.try_emplace(key, t0, t1);
            if (!fresh) {
                it->second.first = std::min(it->second.first, t0);
                it->second.second = std::max(it->second.second, t1);
            }
            continue;
        }
        if (!a.contains("op_id") || !a["op_id"].is_number_integer()) continue;
        TraceOp op;
        op.opId = a["op_id"].get<int32_t>();
        if (op.opId < 0) continue;
        op.rank = rank;
        op.step = a.value("step", 0);
        op.startNs = t0;
        op.endNs = t1;
        op.kind = opKindFromName(a.value("kind", ""));
        op.label = e.value("name", "");
        op.unit = a.value("unit", "");
        op.phase = a.value("phase", "");
        if (a.value("launched_on_host", false)) launchedOnHost.push_back(t.ops.size());
        t.ops.push_back(std::move(op));
        t.ranks = std::max(t.ranks, rank + 1);
        lastEnd = std::max(lastEnd, t1);
    }
    for (size_t i : launchedOnHost) {
        TraceOp& op = t.ops[i];
        if (auto it = gpuSpan.find({op.rank, op.step, op.opId}); it != gpuSpan.end()) {
            op.startNs = it->second.first;
            op.endNs = it->second.second;
        }
    }
    if (t.ops.empty())
        return Error{path +
                     ": no ops with a ShardScope op id (write it with `shardscope run "
                     "--trace` or `shardscope simulate --trace`)"};
    for (const auto& [_, s] : spans)
        t.stepNs = std::max(t.stepNs, s.first / std::max(1, s.second));
    if (spans.empty()) t.stepNs = static_cast<double>(lastEnd);
    return t;
}

}  // namespace shardscope::cli
