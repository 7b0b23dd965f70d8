// SPDX-License-Identifier: Apache-2.0
#include "profiler/record/device_activity.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <stdexcept>

namespace shardscope::record {

const char* deviceOpKindName(DeviceOpKind k) {
    switch (k) {
        case DeviceOpKind::Kernel:
            return "kernel";
        case DeviceOpKind::Memcpy:
            return "memcpy";
        case DeviceOpKind::Memset:
            return "memset";
        case DeviceOpKind::Synchronization:
            return "synchronization";
        case DeviceOpKind::RuntimeApi:
            return "cuda_runtime";
        case DeviceOpKind::DriverApi:
            return "cuda_driver";
    }
    return "kernel";
}

bool isHostSide(DeviceOpKind k) {
    return k == DeviceOpKind::RuntimeApi || k == DeviceOpKind::DriverApi;
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
    for (auto k :
         {DeviceOpKind::Kernel, DeviceOpKind::Memcpy, DeviceOpKind::Memset,
          DeviceOpKind::Synchronization, DeviceOpKind::RuntimeApi, DeviceOpKind::DriverApi})
        if (s == deviceOpKindName(k)) return k;
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
