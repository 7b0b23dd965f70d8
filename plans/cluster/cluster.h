// SPDX-License-Identifier: Apache-2.0
#pragma once
// The hardware a plan runs on ("format": "shardscope.cluster"): the device (memory, peak
// FLOP/s per dtype, HBM bandwidth), the node (devices per node, intra-node link), the
// network (per-device NIC bandwidth and latency) and the host link. Every figure the
// simulator uses lives here, with its source in "sources"; nothing is hidden in code.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "plans/core/dtype.h"
#include "plans/core/expected.h"

namespace shardscope {

inline constexpr const char* kClusterFormat = "shardscope.cluster";
inline constexpr int kClusterVersion = 1;

struct DeviceSpec {
    std::string name;
    std::string kind = "gpu";  // "gpu" or "cpu"
    int64_t memoryBytes = 0;
    std::map<DType, double> peakFlops;            // dense FLOP/s by dtype
    double hbmBandwidth = 0;                      // bytes/s
    [[nodiscard]] double peakFor(DType d) const;  // falls back to float32 when absent
};

struct NodeSpec {
    int64_t devicesPerNode = 1;
    double intraBandwidth = 0;  // bytes/s per device per direction
    int64_t intraLatencyNs = 0;
};

struct NetworkSpec {
    double nicBandwidth = 0;  // bytes/s per device (a 400 Gb/s NIC is 50e9)
    int64_t latencyNs = 0;
};

struct HostSpec {
    double linkBandwidth = 0;  // bytes/s host<->device (PCIe), per device
};

struct ClusterSpec {
    std::string name;
    int64_t nodes = 1;
    DeviceSpec device;
    NodeSpec node;
    NetworkSpec network;
    HostSpec host;
    std::map<std::string, std::string> sources;  // field pointer -> citation
    [[nodiscard]] int64_t worldSize() const { return nodes * node.devicesPerNode; }
};

[[nodiscard]] Expected<ClusterSpec> clusterFromJson(const nlohmann::json& j,
                                                    const std::string& file);
[[nodiscard]] Expected<ClusterSpec> loadClusterFile(const std::string& path);
[[nodiscard]] nlohmann::json clusterToJson(const ClusterSpec& c);

}  // namespace shardscope
