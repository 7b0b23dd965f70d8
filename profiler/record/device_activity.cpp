// SPDX-License-Identifier: Apache-2.0
#include "profiler/record/device_activity.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <iterator>
#include <map>
#include <stdexcept>

namespace shardscope::record {

namespace {

// Each kind's name in the rank result and its Kineto category, in enum order.
struct KindNames {
    const char* name;
    const char* category;
};
constexpr KindNames kKinds[] = {
    {"kernel", "kernel"},
    {"memcpy", "gpu_memcpy"},
    {"memset", "gpu_memset"},
    {"synchronization", "cuda_sync"},
    {"cuda_runtime", "cuda_runtime"},
    {"cuda_driver", "cuda_driver"},
};

const KindNames& namesOf(DeviceOpKind k) {
    return kKinds[static_cast<size_t>(k)];
}

}  // namespace

const char* deviceOpKindName(DeviceOpKind k) {
    return namesOf(k).name;
}

bool isHostSide(DeviceOpKind k) {
    return k == DeviceOpKind::RuntimeApi || k == DeviceOpKind::DriverApi;
}

bool isDeviceWork(DeviceOpKind k) {
    return k == DeviceOpKind::Kernel || k == DeviceOpKind::Memcpy || k == DeviceOpKind::Memset;
}

const char* kinetoCategory(DeviceOpKind k) {
    return namesOf(k).category;
}

bool isDeviceWorkCategory(std::string_view category) {
    return category == "kernel" || category == "gpu_memcpy" || category == "gpu_memset";
}

std::vector<std::pair<int64_t, int64_t>> deviceMemoryTimeline(
    const std::vector<DeviceMemoryEvent>& events) {
    std::vector<std::pair<int64_t, int64_t>> out;
    std::map<std::pair<uint32_t, uint64_t>, int64_t> live;  // (device, address) -> bytes
    int64_t cur = 0;
    for (const auto& m : events) {
        const auto key = std::make_pair(m.device, m.address);
        if (m.bytes > 0) {
            live[key] += m.bytes;
            cur += m.bytes;
        } else if (auto it = live.find(key); it != live.end()) {
            cur -= it->second;
            live.erase(it);
        } else {
            continue;
        }
        out.emplace_back(m.ts, cur);
    }
    return out;
}

int64_t ClockFit::toCpu(uint64_t deviceNs) const {
    return static_cast<int64_t>(std::llround(offsetNs + slope * static_cast<double>(deviceNs)));
}

ClockFit ClockFit::fromSamples(int64_t cpu0, uint64_t dev0, int64_t cpu1, uint64_t dev1) {
    ClockFit f;
    // Less than a millisecond apart, a slope is mostly sampling noise: keep it at 1.
    if (dev1 > dev0 + 1'000'000 && cpu1 > cpu0)
        f.slope = static_cast<double>(cpu1 - cpu0) / static_cast<double>(dev1 - dev0);
    f.offsetNs = static_cast<double>(cpu0) - f.slope * static_cast<double>(dev0);
    return f;
}

nlohmann::json toJson(const DeviceActivity& a) {
    nlohmann::json ops = nlohmann::json::array();
    for (const auto& op : a.ops)
        ops.push_back({deviceOpKindName(op.kind), op.name, op.startNs, op.endNs, op.device,
                       op.stream, op.correlation, op.bytes, op.external});
    nlohmann::json mem = nlohmann::json::array();
    for (const auto& m : a.memory)
        mem.push_back({m.ts, m.bytes, m.address, m.device});
    return {{"names", a.names},
            {"op_columns",
             {"kind", "name", "start_ns", "end_ns", "device", "stream_or_thread", "correlation",
              "bytes", "fsdp_op"}},
            {"ops", std::move(ops)},
            {"memory_columns", {"ts_ns", "bytes", "address", "device"}},
            {"memory", std::move(mem)},
            {"dropped_records", a.droppedRecords},
            {"other_records", a.otherRecords},
            {"peak_device_bytes", a.peakDeviceBytes}};
}

namespace {

DeviceOpKind kindFromName(const std::string& s, const std::string& where) {
    for (size_t i = 0; i < std::size(kKinds); ++i)
        if (s == kKinds[i].name) return static_cast<DeviceOpKind>(i);
    throw std::runtime_error(where + ": unknown device op kind \"" + s + "\"");
}

}  // namespace

DeviceActivity deviceActivityFromJson(const nlohmann::json& j) {
    DeviceActivity a;
    if (!j.is_object()) throw std::runtime_error("device_activity: expected an object");
    try {
        a.names = j.at("names").get<std::vector<std::string>>();
        const auto& ops = j.at("ops");
        for (size_t i = 0; i < ops.size(); ++i) {
            const auto& r = ops[i];
            const std::string where = "device_activity/ops/" + std::to_string(i);
            if (!r.is_array() || r.size() != 9)
                throw std::runtime_error(where + ": expected an array of 9 columns");
            DeviceOp op;
            op.kind = kindFromName(r[0].get<std::string>(), where);
            op.name = r[1].get<int32_t>();
            if (op.name < 0 || static_cast<size_t>(op.name) >= a.names.size())
                throw std::runtime_error(where + "/1: name index out of range");
            op.startNs = r[2].get<int64_t>();
            op.endNs = r[3].get<int64_t>();
            op.device = r[4].get<uint32_t>();
            op.stream = r[5].get<uint32_t>();
            op.correlation = r[6].get<uint32_t>();
            op.bytes = r[7].get<int64_t>();
            op.external = r[8].get<int64_t>();
            a.ops.push_back(op);
        }
        for (const auto& r : j.at("memory"))
            a.memory.push_back({r.at(0).get<int64_t>(), r.at(1).get<int64_t>(),
                                r.at(2).get<uint64_t>(), r.at(3).get<uint32_t>()});
        a.droppedRecords = j.at("dropped_records").get<uint64_t>();
        a.otherRecords = j.value("other_records", uint64_t{0});
        a.peakDeviceBytes = j.value("peak_device_bytes", int64_t{0});
    } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(std::string("device_activity: ") + e.what());
    }
    return a;
}

}  // namespace shardscope::record
