// SPDX-License-Identifier: Apache-2.0
#include "plans/cluster/cluster.h"

#include "plans/core/json_reader.h"
#include "plans/core/strings.h"

namespace shardscope {

double DeviceSpec::peakFor(DType d) const {
    if (auto it = peakFlops.find(d); it != peakFlops.end()) return it->second;
    if (auto it = peakFlops.find(DType::Float32); it != peakFlops.end()) return it->second;
    return peakFlops.empty() ? 0.0 : peakFlops.begin()->second;
}

namespace {

ClusterSpec parseCluster(const JsonReader& r) {
    r.checkFormat(kClusterFormat, kClusterVersion);
    r.allowOnly({"format", "version", "name", "nodes", "device", "node", "network", "host",
                 "sources", "notes"});
    ClusterSpec c;
    c.name = r.getString("name");
    c.nodes = r.at("nodes").asIntAtLeast(1);

    const JsonReader d = r.at("device");
    d.allowOnly({"name", "kind", "memory_bytes", "peak_flops", "hbm_bandwidth_bytes_per_s"});
    c.device.name = d.getString("name");
    c.device.kind = d.optString("kind").value_or("gpu");
    if (c.device.kind != "gpu" && c.device.kind != "cpu")
        d.at("kind").fail("expected \"gpu\" or \"cpu\", got \"" + c.device.kind + "\"");
    c.device.memoryBytes = d.at("memory_bytes").asIntAtLeast(1);
    const JsonReader pf = d.at("peak_flops");
    for (const auto& key : pf.keys()) {
        auto dt = parseDType(key);
        if (!dt) pf.at(key).fail("unknown dtype \"" + key + "\"" + didYouMean(key, dtypeNames()));
        c.device.peakFlops[*dt] = pf.at(key).asPositiveNumber();
    }
    if (c.device.peakFlops.empty()) pf.fail("give the peak FLOP/s of at least one dtype");
    c.device.hbmBandwidth = d.at("hbm_bandwidth_bytes_per_s").asPositiveNumber();

    const JsonReader n = r.at("node");
    n.allowOnly({"devices_per_node", "intra_bandwidth_bytes_per_s", "intra_latency_ns"});
    c.node.devicesPerNode = n.at("devices_per_node").asIntAtLeast(1);
    c.node.intraBandwidth = n.at("intra_bandwidth_bytes_per_s").asPositiveNumber();
    c.node.intraLatencyNs = n.at("intra_latency_ns").asIntAtLeast(0);

    const JsonReader w = r.at("network");
    w.allowOnly({"nic_bandwidth_bytes_per_s", "latency_ns"});
    c.network.nicBandwidth = w.at("nic_bandwidth_bytes_per_s").asPositiveNumber();
    c.network.latencyNs = w.at("latency_ns").asIntAtLeast(0);

    const JsonReader h = r.at("host");
    h.allowOnly({"link_bandwidth_bytes_per_s"});
    c.host.linkBandwidth = h.at("link_bandwidth_bytes_per_s").asPositiveNumber();

    if (auto s = r.find("sources"))
        for (const auto& key : s->keys())
            c.sources[key] = s->at(key).asString();
    if (c.nodes > (int64_t{1} << 24) / c.node.devicesPerNode)
        r.at("nodes").fail("more than 16,777,216 devices in total");
    return c;
}

}  // namespace

Expected<ClusterSpec> clusterFromJson(const nlohmann::json& j, const std::string& file) {
    return catchJsonErrors<ClusterSpec>([&] { return parseCluster(JsonReader(j, file)); });
}

Expected<ClusterSpec> loadClusterFile(const std::string& path) {
    auto j = readJsonFile(path);
    if (!j) return Error{j.error()};
    return clusterFromJson(*j, path);
}

nlohmann::json clusterToJson(const ClusterSpec& c) {
    nlohmann::json pf = nlohmann::json::object();
    for (const auto& [d, v] : c.device.peakFlops)
        pf[std::string(dtypeName(d))] = v;
    nlohmann::json j = {
        {"format", kClusterFormat},
        {"version", kClusterVersion},
        {"name", c.name},
        {"nodes", c.nodes},
        {"device",
         {{"name", c.device.name},
          {"kind", c.device.kind},
          {"memory_bytes", c.device.memoryBytes},
          {"peak_flops", pf},
          {"hbm_bandwidth_bytes_per_s", c.device.hbmBandwidth}}},
        {"node",
         {{"devices_per_node", c.node.devicesPerNode},
          {"intra_bandwidth_bytes_per_s", c.node.intraBandwidth},
          {"intra_latency_ns", c.node.intraLatencyNs}}},
        {"network",
         {{"nic_bandwidth_bytes_per_s", c.network.nicBandwidth},
          {"latency_ns", c.network.latencyNs}}},
        {"host", {{"link_bandwidth_bytes_per_s", c.host.linkBandwidth}}},
    };
    if (!c.sources.empty()) j["sources"] = c.sources;
    return j;
}

}  // namespace shardscope
