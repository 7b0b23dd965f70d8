// SPDX-License-Identifier: Apache-2.0
#include "engine/measure/run_trace.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "engine/measure/step_trace.h"
#include "engine/schedule/step_program.h"
#include "plans/core/intervals.h"
#include "profiler/export/chrome_trace_writer.h"
#include "profiler/import/kineto_import.h"
#include "profiler/record/device_activity.h"

namespace shardscope {

namespace {

int64_t unionLength(std::vector<Interval> v) {
    return totalLength(mergeIntervals(std::move(v)));
}

Breakdown fromIntervals(std::vector<Interval> comp, std::vector<Interval> comm) {
    Breakdown b;
    b.computeNs = unionLength(comp);
    b.commNs = unionLength(comm);
    comp.insert(comp.end(), comm.begin(), comm.end());
    b.exposedNs = unionLength(std::move(comp)) - b.computeNs;
    return b;
}

// A CUDA rank with a CUPTI recording: from the GPU's own times in the last step, kernels
// classified as the trace importer classifies them (HTA's rules: NCCL and the like are
// communication; the rest of the kernels compute). Host-side op spans on a GPU are launch
// times, not execution.
Breakdown deviceBreakdown(const nlohmann::json& rank) {
    const auto a = record::deviceActivityFromJson(rank["device_activity"]);
    const auto& spans = rank["step_spans_ns"];
    const int64_t t0 = spans.back()[0].get<int64_t>(), t1 = spans.back()[1].get<int64_t>();
    std::vector<EventClass> classOf;  // by name index
    classOf.reserve(a.names.size());
    for (const auto& name : a.names)
        classOf.push_back(
            classifyDeviceEvent(name, record::kinetoCategory(record::DeviceOpKind::Kernel)));
    std::vector<Interval> comp, comm;
    for (const auto& op : a.ops) {
        if (op.kind != record::DeviceOpKind::Kernel || op.startNs < t0 || op.startNs > t1) continue;
        const EventClass c = classOf[static_cast<size_t>(op.name)];
        if (c == EventClass::Communication)
            comm.push_back({op.startNs, op.endNs});
        else if (c == EventClass::Computation)
            comp.push_back({op.startNs, op.endNs});
    }
    return fromIntervals(std::move(comp), std::move(comm));
}

}  // namespace

Breakdown measuredBreakdown(const nlohmann::json& rank) {
    if (rank.contains("device_activity") && rank.contains("step_spans_ns") &&
        !rank["step_spans_ns"].empty())
        return deviceBreakdown(rank);
    const int64_t last =
        rank["warmup_steps"].get<int64_t>() + static_cast<int64_t>(rank["step_time_ns"].size()) - 1;
    std::vector<Interval> comp, comm;
    for (const auto& op : rank["ops"]) {
        if (op["step"].get<int64_t>() != last) continue;
        const auto k = opKindFromName(op["kind"].get<std::string>());
        const Interval iv{op["start_ns"].get<int64_t>(), op["end_ns"].get<int64_t>()};
        if (k && isCollective(*k))
            comm.push_back(iv);
        else if (k && isComputeOp(*k))
            comp.push_back(iv);
    }
    return fromIntervals(std::move(comp), std::move(comm));
}

namespace {

// A rank's CUPTI recording in the PyTorch profiler's (Kineto's) terms, so every reader of
// those traces understands it: GPU ops on one lane per stream ("kernel", "gpu_memcpy",
// "gpu_memset", "cuda_sync"), the runtime and driver calls on one lane per host thread
// ("cuda_runtime", "cuda_driver"), launch-to-kernel flows by correlation id ("ac2g"), and
// the FSDP op that launched each in args. Device memory (what cudaMalloc reserved while
// recording) is a counter of its own.
constexpr int kDeviceLaneBase = 200;   // + the stream's index on the rank
constexpr int kHostApiLaneBase = 300;  // + the thread's index on the rank
constexpr int kDeviceMemoryLane = 102;

void appendDeviceActivity(ChromeTraceWriter& w, const nlohmann::json& r, int64_t t0) {
    const int rank = r["rank"].get<int>();
    const int pid = tracePid(rank);
    const record::DeviceActivity a = record::deviceActivityFromJson(r["device_activity"]);
    const auto& ops = r["ops"];
    const auto& units = r["units"];
    std::map<std::pair<bool, uint32_t>, int> lanes;  // (host side, stream or thread) -> lane
    int deviceLanes = 0, hostLanes = 0;
    auto laneOf = [&](const record::DeviceOp& op) {
        const bool hostSide = record::isHostSide(op.kind);
        const auto key = std::make_pair(hostSide, op.stream);
        if (auto it = lanes.find(key); it != lanes.end()) return it->second;
        int& count = hostSide ? hostLanes : deviceLanes;
        const int lane = (hostSide ? kHostApiLaneBase : kDeviceLaneBase) + std::min(count++, 99);
        lanes.emplace(key, lane);
        const std::string name =
            hostSide ? "CUDA API (thread " + std::to_string(op.stream) + ")"
                     : "GPU " + std::to_string(op.device) + " stream " + std::to_string(op.stream);
        w.lane(pid, traceTid(rank, lane), name, lane);
        return lane;
    };
    const auto at = [t0](int64_t ns) { return static_cast<double>(ns - t0); };
    // Flow ids unique across ranks: the rank in the high bits, CUPTI's correlation below.
    const auto flowId = [rank](uint32_t c) { return (static_cast<int64_t>(rank) << 32) | c; };
    // A flow needs both ends: a host-side call and the device work it queued.
    std::set<uint32_t> launched, onDevice;
    for (const auto& op : a.ops) {
        if (record::isHostSide(op.kind)) launched.insert(op.correlation);
        if (record::isDeviceWork(op.kind)) onDevice.insert(op.correlation);
    }
    // The op each launch belongs to. The engine records a compute op (a unit's forward or
    // backward segment) when it ends, so what its kernels were launched under is the op
    // before; a launch inside a compute op's host span, outside the op it was launched
    // under, is that compute op's (seen on an H200: every forward kernel was filed under
    // the all-gather before it).
    std::map<uint32_t, int64_t> launchAt;  // correlation -> host launch time
    for (const auto& op : a.ops)
        if (record::isHostSide(op.kind)) launchAt.emplace(op.correlation, op.startNs);
    std::vector<std::tuple<int64_t, int64_t, int64_t>> computeSpans;  // start, end, op index
    for (size_t i = 0; i < ops.size(); ++i) {
        const auto k = opKindFromName(ops[i]["kind"].get<std::string>());
        if (k && isComputeOp(*k))
            computeSpans.emplace_back(ops[i]["start_ns"].get<int64_t>(),
                                      ops[i]["end_ns"].get<int64_t>(), static_cast<int64_t>(i));
    }
    std::sort(computeSpans.begin(), computeSpans.end());
    auto launchedUnder = [&](const record::DeviceOp& op) -> int64_t {
        const auto at = launchAt.find(op.correlation);
        if (at == launchAt.end()) return op.external;
        const int64_t ts = at->second;
        if (op.external >= 0 && static_cast<size_t>(op.external) < ops.size()) {
            const auto& f = ops[static_cast<size_t>(op.external)];
            if (f["start_ns"].get<int64_t>() <= ts && ts <= f["end_ns"].get<int64_t>())
                return op.external;
        }
        auto it = std::upper_bound(computeSpans.begin(), computeSpans.end(),
                                   std::make_tuple(ts, INT64_MAX, INT64_MAX));
        if (it != computeSpans.begin() && std::get<1>(*std::prev(it)) >= ts)
            return std::get<2>(*std::prev(it));
        return op.external;
    };
    for (const auto& op : a.ops) {
        const bool hostSide = record::isHostSide(op.kind);
        const char* cat = record::kinetoCategory(op.kind);
        nlohmann::json args{{"device", op.device}, {"correlation", op.correlation}};
        if (hostSide)
            args["thread"] = op.stream;
        else
            args["stream"] = op.stream;
        if (op.bytes > 0) args["bytes"] = op.bytes;
        if (const int64_t under = launchedUnder(op);
            under >= 0 && static_cast<size_t>(under) < ops.size()) {
            const auto& fop = ops[static_cast<size_t>(under)];
            const std::string unit = units[fop["unit"].get<int>()].get<std::string>();
            args["fsdp_op_id"] = fop["op_id"];
            args["fsdp_step"] = fop["step"];
            args["fsdp_unit"] = unit == "<root>" ? std::string() : unit;
            args["fsdp_phase"] = fop["phase"];
            args["fsdp_op"] = fop["kind"];
        }
        const int tid = traceTid(rank, laneOf(op));
        w.span(pid, tid, a.nameOf(op), cat, at(op.startNs),
               static_cast<double>(op.endNs - op.startNs), std::move(args));
        // The end bound to the enclosing slice, as Kineto writes it.
        if (record::isDeviceWork(op.kind) && launched.count(op.correlation))
            w.flowEnd(pid, tid, "launch", "ac2g", flowId(op.correlation), at(op.startNs), true);
        else if (hostSide && onDevice.count(op.correlation))
            w.flowStart(pid, tid, "launch", "ac2g", flowId(op.correlation), at(op.startNs));
    }
    // What was allocated while recording (a free of older memory does not count).
    for (const auto& [ts, bytes] : record::deviceMemoryTimeline(a.memory))
        w.counter(pid, traceTid(rank, kDeviceMemoryLane),
                  "device memory (cudaMalloc while recording, bytes)", at(ts),
                  {{"reserved", bytes}});
}

}  // namespace

namespace {
// A rank's process and its streams' lanes, named and ordered.
void appendRankLanes(ChromeTraceWriter& w, int rank, int pid, bool hostOps) {
    w.processName(pid, "rank " + std::to_string(rank) + " (measured)");
    for (int st = 0; st < static_cast<int>(Stream::Count); ++st) {
        const std::string name = streamName(static_cast<Stream>(st));
        w.lane(pid, traceTid(rank, st), hostOps ? name + " (host launches)" : name, st);
    }
}

// Measured ops of one stream can overlap partly: a Gloo collective's span runs from
// its issue to its completion, so the next one issued before the previous finished
// overlaps it. Perfetto draws only nested slices right on one thread, so such an op
// goes to an overflow lane of its stream ("reduce_scatter ·2"), its times unchanged.
// Returns each op's lane; an overflow lane's name records go into `w`.
std::vector<int> overflowLanes(const nlohmann::json& ops, int rank, int pid, ChromeTraceWriter& w) {
    std::vector<int> laneOf(ops.size(), 0);
    std::set<int> named;  // overflow lanes that have their name record
    std::vector<size_t> order(ops.size());
    for (size_t i = 0; i < ops.size(); ++i)
        order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return ops[a]["start_ns"].get<int64_t>() < ops[b]["start_ns"].get<int64_t>();
    });
    std::map<int, std::vector<int64_t>> busyUntil;  // stream -> end per overflow level
    for (size_t i : order) {
        int st = 0;
        for (int k = 0; k < static_cast<int>(Stream::Count); ++k)
            if (ops[i]["stream"] == streamName(static_cast<Stream>(k))) st = k;
        auto& levels = busyUntil[st];
        const int64_t s = ops[i]["start_ns"].get<int64_t>();
        const int64_t e = std::max(s, ops[i]["end_ns"].get<int64_t>());
        size_t level = 0;
        while (level < levels.size() && levels[level] > s && level + 1 < kMaxOverflowLanes)
            ++level;
        if (level == levels.size()) levels.push_back(0);
        levels[level] = e;
        const int lane = st + kOverflowLaneStride * static_cast<int>(level);
        laneOf[i] = lane;
        if (level > 0 && !named.count(lane)) {
            named.insert(lane);
            w.lane(pid, traceTid(rank, lane),
                   std::string(streamName(static_cast<Stream>(st))) + " \u00b7" +
                       std::to_string(level + 1),
                   lane);
        }
    }
    return laneOf;
}

}  // namespace

nlohmann::json mergedTrace(const std::vector<nlohmann::json>& ranks, const std::string& plan,
                           nlohmann::json run) {
    int64_t t0 = INT64_MAX;
    for (const auto& r : ranks)
        t0 = std::min(t0, r["measured_start_ns"].get<int64_t>());
    ChromeTraceWriter w;
    for (const auto& r : ranks) {
        const int rank = r["rank"].get<int>();
        const int pid = tracePid(rank);
        // On a GPU the FSDP ops' spans are their launches on the host; the kernels are the
        // device work (its own lanes, from the CUPTI recording).
        const bool hostOps = r.contains("device_activity");
        appendRankLanes(w, rank, pid, hostOps);
        const auto& units = r["units"];
        const auto& ops = r["ops"];
        const std::vector<int> laneOf = overflowLanes(ops, rank, pid, w);
        for (size_t i = 0; i < ops.size(); ++i) {
            const auto& op = ops[i];
            const int tid = laneOf[i];
            const std::string kind = op["kind"];
            const int unit = op["unit"];
            std::string label = kind == "optimizer" ? "optimizer step"
                                                    : units[unit].get<std::string>() + " " + kind;
            std::replace(label.begin(), label.end(), '_', ' ');
            const int64_t s = op["start_ns"].get<int64_t>(), e = op["end_ns"].get<int64_t>();
            nlohmann::json args{{"op_id", op["op_id"]},
                                {"step", op["step"]},
                                {"unit", units[unit].get<std::string>() == "<root>"
                                             ? std::string()
                                             : units[unit].get<std::string>()},
                                {"phase", op["phase"]},
                                {"kind", kind},
                                {"micro_batch", op["micro_batch"]},
                                {"bytes", op.value("bytes", int64_t{0})},
                                {"group_size", static_cast<int64_t>(ranks.size())}};
            if (hostOps) args["launched_on_host"] = true;
            w.span(pid, traceTid(rank, tid), label, kind, static_cast<double>(s - t0),
                   static_cast<double>(std::max<int64_t>(0, e - s)), std::move(args));
        }
        // The measured steps on their own row: a step's span is what step_time_ns averages.
        w.threadName(pid, traceTid(rank, kStepsLane), "steps");
        int64_t stepIndex = r["warmup_steps"].get<int64_t>();
        for (const auto& sp : r.value("step_spans_ns", nlohmann::json::array())) {
            const int64_t a = sp[0].get<int64_t>(), b = sp[1].get<int64_t>();
            w.span(pid, traceTid(rank, kStepsLane), "step " + std::to_string(stepIndex++), "step",
                   static_cast<double>(a - t0), static_cast<double>(b - a));
        }
        // Every allocator sample (several at one instant keep the last), so the counter's
        // maximum is the reported peak.
        const auto& tl = r["memory_timeline"];
        for (size_t k = 0; k < tl.size(); ++k) {
            const int64_t t = tl[k][0].get<int64_t>();
            if (k + 1 < tl.size() && tl[k + 1][0].get<int64_t>() == t) {
                // A later sample at the same instant replaces this one unless this is higher.
                if (tl[k + 1][1].get<int64_t>() >= tl[k][1].get<int64_t>()) continue;
            }
            w.counter(pid, traceTid(rank, kCounterLane), "memory (bytes)",
                      static_cast<double>(t - t0), {{"allocated", tl[k][1]}});
        }
        if (r.contains("device_activity")) appendDeviceActivity(w, r, t0);
    }
    // A GPU rank's allocations are the caching allocator's, which the host recorder does
    // not see: its peak (torch.cuda.max_memory_allocated) rides in the metadata.
    nlohmann::json devicePeaks = nlohmann::json::array();
    for (const auto& r : ranks)
        if (r.contains("device_activity") && r.contains("peak_allocated_bytes"))
            devicePeaks.push_back(r["peak_allocated_bytes"]);
    if (!devicePeaks.empty()) run["device_peak_allocated_bytes"] = std::move(devicePeaks);
    return w.finish({{"producer", "shardscope run"},
                     {"rank_pid_offset", kRankPidOffset},
                     {"plan", plan},
                     {"world_size", ranks.size()},
                     {"run", std::move(run)}});
}

}  // namespace shardscope
