// SPDX-License-Identifier: Apache-2.0
#include "plans/cluster/cluster.h"

#include <cmath>
#include <cstdio>

#include "plans/core/json_reader.h"
#include "plans/core/strings.h"

namespace shardscope {

double DeviceSpec::peakFor(DType d) const {
    if (auto it = peakFlops.find(d); it != peakFlops.end()) return it->second;
    if (auto it = peakFlops.find(DType::Float32); it != peakFlops.end()) return it->second;
    return peakFlops.empty() ? 0.0 : peakFlops.begin()->second;
}

namespace {
// Piecewise linear in log10(x) through the points, flat outside.
double logInterpolate(const std::vector<std::pair<double, double>>& c, double x) {
    if (x <= c.front().first) return c.front().second;
    if (x >= c.back().first) return c.back().second;
    for (size_t i = 1; i < c.size(); ++i)
        if (x <= c[i].first) {
            const double x0 = std::log10(c[i - 1].first), x1 = std::log10(c[i].first);
            const double t = (std::log10(x) - x0) / (x1 - x0);
            return c[i - 1].second + t * (c[i].second - c[i - 1].second);
        }
    return c.back().second;
}
}  // namespace

double SimParams::memoryEfficiencyFor(double bytes) const {
    return memoryEfficiencyByBytes.empty() ? memoryEfficiency
                                           : logInterpolate(memoryEfficiencyByBytes, bytes);
}

double SimParams::memoryEfficiencyFor(double bytes, const std::string& op) const {
    if (!op.empty())
        if (auto it = memoryEfficiencyByOp.find(op); it != memoryEfficiencyByOp.end())
            return logInterpolate(it->second, bytes);
    return memoryEfficiencyFor(bytes);
}

double SimParams::attentionEfficiencyFor(double flops) const {
    return attentionEfficiency.empty() ? efficiencyFor(flops)
                                       : logInterpolate(attentionEfficiency, flops);
}

double SimParams::maskedAttentionEfficiencyFor(double flops) const {
    return maskedAttentionEfficiency.empty() ? 0.5 * attentionEfficiencyFor(flops)
                                             : logInterpolate(maskedAttentionEfficiency, flops);
}

double SimParams::gemmEfficiencyFor(double flops, int64_t m, int64_t n, int64_t k,
                                    DType dtype) const {
    if (m > 0 && n > 0 && k > 0)
        for (const GemmShapeEfficiency& g : gemmEfficiencyByShape)
            if (g.m == m && g.n == n && g.k == k && g.dtype == dtype) return g.efficiency;
    return efficiencyFor(flops);
}

double SimParams::efficiencyFor(double flops) const {
    const auto& c = computeEfficiency;
    if (c.empty()) return 1.0;
    return logInterpolate(c, flops);
}

namespace {

double fraction(const JsonReader& r) {
    const double v = r.asNumber();
    if (!(v > 0 && v <= 1)) r.fail("expected a fraction in (0, 1], got " + r.json().dump());
    return v;
}

// [[x, efficiency], ...] in increasing x, at least one point: x is "flops" ("FLOPs") or
// "bytes". `most` above 1: an efficiency against a FLOP count the kernel does not all do
// (causal attention does about half of what the count says).
std::vector<std::pair<double, double>> parseCurve(const JsonReader& c, const std::string& x,
                                                  const std::string& xs, double most = 1.0) {
    std::vector<std::pair<double, double>> curve;
    for (size_t i = 0; i < c.size(); ++i) {
        const JsonReader pt = c[i];
        if (pt.size() != 2) pt.failExpected("[" + x + ", efficiency]");
        const double v = pt[0].asPositiveNumber();
        if (!curve.empty() && v <= curve.back().first)
            pt[0].fail("points must be in increasing " + xs);
        if (most > 1.0) {
            const double e = pt[1].asNumber();
            if (!(e > 0 && e <= most))
                pt[1].fail("expected an efficiency in (0, " + std::to_string(most).substr(0, 3) +
                           "], got " + pt[1].json().dump());
            curve.emplace_back(v, e);
        } else {
            curve.emplace_back(v, fraction(pt[1]));
        }
    }
    if (curve.empty()) c.fail("give at least one [" + x + ", efficiency] point");
    return curve;
}

SimParams parseSim(const JsonReader& r) {
    r.allowOnly({"compute_efficiency",
                 "memory_efficiency",
                 "memory_efficiency_by_bytes",
                 "overlap_slowdown",
                 "intra_efficiency",
                 "network_efficiency",
                 "cpu_issue_ns",
                 "host_optimizer_bytes_per_s",
                 "protocols",
                 "attention_efficiency",
                 "masked_attention_efficiency",
                 "cpu_launch_ns",
                 "kernel_gap_ns",
                 "memory_efficiency_by_op",
                 "gemm_efficiency_by_shape",
                 "comm_overlap_slowdown",
                 "chunk_cat_host_ns_per_block",
                 "cpu_launch_forward_ns",
                 "cpu_launch_backward_ns",
                 "profiler_ns_per_event"});
    SimParams s;
    if (auto c = r.find("compute_efficiency"))
        s.computeEfficiency = parseCurve(*c, "flops", "FLOPs");
    if (auto list = r.find("gemm_efficiency_by_shape")) {
        for (size_t i = 0; i < list->size(); ++i) {
            const JsonReader g = (*list)[i];
            g.allowOnly({"m", "n", "k", "dtype", "efficiency"});
            GemmShapeEfficiency e;
            e.m = g.at("m").asIntAtLeast(1);
            e.n = g.at("n").asIntAtLeast(1);
            e.k = g.at("k").asIntAtLeast(1);
            const std::string dt = g.getString("dtype");
            const auto d = parseDType(dt);
            if (!d)
                g.at("dtype").fail("unknown dtype \"" + dt + "\"" + didYouMean(dt, dtypeNames()));
            e.dtype = *d;
            e.efficiency = fraction(g.at("efficiency"));
            for (const GemmShapeEfficiency& x : s.gemmEfficiencyByShape)
                if (x.m == e.m && x.n == e.n && x.k == e.k && x.dtype == e.dtype)
                    g.fail("this shape and dtype is listed twice");
            s.gemmEfficiencyByShape.push_back(e);
        }
    }
    if (auto x = r.find("memory_efficiency")) s.memoryEfficiency = fraction(*x);
    if (auto c = r.find("memory_efficiency_by_bytes"))
        s.memoryEfficiencyByBytes = parseCurve(*c, "bytes", "bytes");
    if (auto m = r.find("memory_efficiency_by_op")) {
        m->requireObject();
        for (const std::string& op : m->keys()) {
            if (op.empty()) m->fail("an operator name may not be empty");
            s.memoryEfficiencyByOp[op] = parseCurve(m->at(op), "bytes", "bytes");
        }
    }
    if (auto x = r.find("overlap_slowdown")) {
        s.overlapSlowdown = x->asNumber();
        if (s.overlapSlowdown < 0 || s.overlapSlowdown > 1)
            x->fail("expected a fraction in [0, 1]");
    }
    if (auto x = r.find("comm_overlap_slowdown")) {
        s.commOverlapSlowdown = x->asNumber();
        if (!(s.commOverlapSlowdown >= 0) || s.commOverlapSlowdown > 20)
            x->fail(
                "expected a number in [0, 20] (the fraction of the overlapped time a "
                "collective adds)");
    }
    if (auto x = r.find("intra_efficiency")) s.intraEfficiency = fraction(*x);
    if (auto x = r.find("network_efficiency")) s.networkEfficiency = fraction(*x);
    if (auto x = r.find("cpu_issue_ns")) s.cpuIssueNs = static_cast<double>(x->asIntAtLeast(0));
    if (auto c = r.find("attention_efficiency"))
        s.attentionEfficiency = parseCurve(*c, "flops", "FLOPs", 2.0);
    if (auto c = r.find("masked_attention_efficiency"))
        s.maskedAttentionEfficiency = parseCurve(*c, "flops", "FLOPs", 2.0);
    if (auto x = r.find("cpu_launch_ns")) {
        s.cpuLaunchNs = static_cast<double>(x->asIntAtLeast(0));
        if (s.cpuLaunchNs > 1e9) x->fail("implausibly large (more than a second per kernel)");
    }
    auto launchNs = [&](const char* key, double& field) {
        if (auto x = r.find(key)) {
            field = static_cast<double>(x->asIntAtLeast(0));
            if (field > 1e9) x->fail("implausibly large (more than a second per kernel)");
        }
    };
    launchNs("cpu_launch_forward_ns", s.cpuLaunchForwardNs);
    launchNs("cpu_launch_backward_ns", s.cpuLaunchBackwardNs);
    if (auto x = r.find("kernel_gap_ns")) {
        s.kernelGapNs = static_cast<double>(x->asIntAtLeast(0));
        if (s.kernelGapNs > 1e6) x->fail("implausibly large (more than a millisecond per kernel)");
    }
    // Host times per unit of work, in ns (fractions allowed): up to a millisecond.
    auto hostNs = [&](const char* key, double& field, const char* what) {
        if (auto x = r.find(key)) {
            field = x->asNumber();
            if (!(field >= 0) || field > 1e6)
                x->fail(std::string("expected nanoseconds in [0, 1000000] (") + what + ")");
        }
    };
    hostNs("chunk_cat_host_ns_per_block", s.chunkCatHostNsPerBlock,
           "CPU time per 2 KiB block of one chunk of FSDP2's reduce-scatter input");
    hostNs("profiler_ns_per_event", s.profilerNsPerEvent, "host time the profiler adds per event");
    if (auto x = r.find("host_optimizer_bytes_per_s"))
        s.hostOptimizerBytesPerS = x->asPositiveNumber();
    if (auto ps = r.find("protocols")) {
        s.protocols.clear();
        for (size_t i = 0; i < ps->size(); ++i) {
            const JsonReader p = (*ps)[i];
            p.allowOnly({"name", "base_ns", "intra_step_ns", "inter_step_ns", "bw_factor"});
            ProtocolSpec spec{p.getString("name"),
                              static_cast<double>(p.at("base_ns").asIntAtLeast(0)),
                              static_cast<double>(p.at("intra_step_ns").asIntAtLeast(0)),
                              static_cast<double>(p.at("inter_step_ns").asIntAtLeast(0)),
                              fraction(p.at("bw_factor"))};
            s.protocols.push_back(spec);
        }
        if (s.protocols.empty()) ps->fail("give at least one protocol");
    }
    return s;
}

nlohmann::json simJson(const SimParams& s) {
    nlohmann::json ce = nlohmann::json::array();
    for (const auto& [f, e] : s.computeEfficiency)
        ce.push_back({f, e});
    nlohmann::json ps = nlohmann::json::array();
    for (const auto& p : s.protocols)
        ps.push_back({{"name", p.name},
                      {"base_ns", static_cast<int64_t>(p.baseNs)},
                      {"intra_step_ns", static_cast<int64_t>(p.intraStepNs)},
                      {"inter_step_ns", static_cast<int64_t>(p.interStepNs)},
                      {"bw_factor", p.bwFactor}});
    nlohmann::json j{{"compute_efficiency", ce},
                     {"memory_efficiency", s.memoryEfficiency},
                     {"overlap_slowdown", s.overlapSlowdown},
                     {"intra_efficiency", s.intraEfficiency},
                     {"network_efficiency", s.networkEfficiency},
                     {"cpu_issue_ns", static_cast<int64_t>(s.cpuIssueNs)},
                     {"host_optimizer_bytes_per_s", s.hostOptimizerBytesPerS},
                     {"protocols", ps}};
    // Written only when set (calibrated), so clusters without it read as before.
    if (s.commOverlapSlowdown > 0) j["comm_overlap_slowdown"] = s.commOverlapSlowdown;
    if (!s.memoryEfficiencyByBytes.empty()) {
        nlohmann::json mb = nlohmann::json::array();
        for (const auto& [b, e] : s.memoryEfficiencyByBytes)
            mb.push_back({b, e});
        j["memory_efficiency_by_bytes"] = mb;
    }
    if (!s.memoryEfficiencyByOp.empty()) {
        nlohmann::json mo = nlohmann::json::object();
        for (const auto& [op, curve] : s.memoryEfficiencyByOp) {
            nlohmann::json pts = nlohmann::json::array();
            for (const auto& [b, e] : curve)
                pts.push_back({b, e});
            mo[op] = pts;
        }
        j["memory_efficiency_by_op"] = mo;
    }
    if (!s.attentionEfficiency.empty()) {
        nlohmann::json ae = nlohmann::json::array();
        for (const auto& [f, e] : s.attentionEfficiency)
            ae.push_back({f, e});
        j["attention_efficiency"] = ae;
    }
    if (!s.maskedAttentionEfficiency.empty()) {
        nlohmann::json ae = nlohmann::json::array();
        for (const auto& [f, e] : s.maskedAttentionEfficiency)
            ae.push_back({f, e});
        j["masked_attention_efficiency"] = ae;
    }
    if (s.cpuLaunchNs > 0) j["cpu_launch_ns"] = static_cast<int64_t>(s.cpuLaunchNs);
    if (s.cpuLaunchForwardNs > 0)
        j["cpu_launch_forward_ns"] = static_cast<int64_t>(s.cpuLaunchForwardNs);
    if (s.cpuLaunchBackwardNs > 0)
        j["cpu_launch_backward_ns"] = static_cast<int64_t>(s.cpuLaunchBackwardNs);
    if (s.kernelGapNs > 0) j["kernel_gap_ns"] = static_cast<int64_t>(s.kernelGapNs);
    if (s.chunkCatHostNsPerBlock > 0) j["chunk_cat_host_ns_per_block"] = s.chunkCatHostNsPerBlock;
    if (s.profilerNsPerEvent > 0) j["profiler_ns_per_event"] = s.profilerNsPerEvent;
    if (!s.gemmEfficiencyByShape.empty()) {
        nlohmann::json gs = nlohmann::json::array();
        for (const GemmShapeEfficiency& g : s.gemmEfficiencyByShape)
            gs.push_back({{"m", g.m},
                          {"n", g.n},
                          {"k", g.k},
                          {"dtype", std::string(dtypeName(g.dtype))},
                          {"efficiency", g.efficiency}});
        j["gemm_efficiency_by_shape"] = gs;
    }
    return j;
}

NcclSpec parseNccl(const JsonReader& r) {
    r.allowOnly({"version", "compute_capability", "nvlinks", "nvls", "nics_per_node",
                 "gpu_nic_bandwidth_bytes_per_s", "cpu_vendor", "net_latency_us", "launch_us",
                 "nvlink_efficiency", "net_efficiency", "nvls_efficiency", "fill_slices", "sms"});
    NcclSpec s;
    if (auto v = r.find("version")) {
        s.version = v->asString();
        int major = 0, minor = 0;
        if (std::sscanf(s.version.c_str(), "%d.%d", &major, &minor) != 2 || major != 2 ||
            minor < 18)
            v->fail("expected an NCCL version 2.18 or later such as \"2.28.9\", got \"" +
                    s.version + "\"");
    }
    if (auto x = r.find("compute_capability")) {
        const int64_t cc = x->asInt();
        if (cc < 70 || cc > 120)
            x->fail(
                "expected a compute capability such as 80 (A100), 90 (H100, H200) or 100 "
                "(B200), got " +
                std::to_string(cc));
        s.computeCapability = static_cast<int>(cc);
    }
    if (auto x = r.find("nvlinks")) {
        const int64_t n = x->asIntAtLeast(0);
        if (n > 36) x->fail("expected at most 36 NVLink links per GPU");
        s.nvlinks = static_cast<int>(n);
    }
    if (auto x = r.find("nvls")) s.nvls = x->asBool();
    if (auto x = r.find("sms")) {
        const int64_t n = x->asIntAtLeast(1);
        if (n > 1024) x->fail("expected the GPU's SM count, at most 1024");
        s.sms = static_cast<int>(n);
    }
    if (auto x = r.find("nics_per_node")) {
        const int64_t n = x->asIntAtLeast(1);
        if (n > 64) x->fail("expected at most 64 NICs per node");
        s.nicsPerNode = static_cast<int>(n);
    }
    if (auto x = r.find("gpu_nic_bandwidth_bytes_per_s")) s.gpuNicBandwidth = x->asPositiveNumber();
    if (auto x = r.find("cpu_vendor")) {
        s.cpuVendor = x->asString();
        if (s.cpuVendor != "intel" && s.cpuVendor != "amd" && s.cpuVendor != "arm")
            x->fail("expected \"intel\", \"amd\" or \"arm\", got \"" + s.cpuVendor + "\"");
    }
    auto micros = [&](const char* key, double& field) {
        if (auto x = r.find(key)) {
            field = x->asNumber();
            if (!(field >= 0) || field > 1e5) x->fail("expected microseconds in [0, 100000]");
        }
    };
    micros("net_latency_us", s.netLatencyUs);
    micros("launch_us", s.launchUs);
    auto efficiency = [&](const char* key, double& field) {
        if (auto x = r.find(key)) {
            field = x->asNumber();
            if (!(field > 0) || field > 1.5)
                x->fail("expected the achieved fraction of NCCL's modelled bandwidth, in (0, 1.5]");
        }
    };
    efficiency("nvlink_efficiency", s.nvlinkEfficiency);
    efficiency("net_efficiency", s.netEfficiency);
    efficiency("nvls_efficiency", s.nvlsEfficiency);
    if (auto x = r.find("fill_slices")) {
        s.fillSlices = x->asNumber();
        if (!(s.fillSlices >= 0) || s.fillSlices > 64)
            x->fail(
                "expected the pipeline slices a collective fills before running at speed, in [0, "
                "64]");
    }
    return s;
}

nlohmann::json ncclJson(const NcclSpec& s) {
    nlohmann::json j = {{"version", s.version},
                        {"compute_capability", s.computeCapability},
                        {"nvlinks", s.nvlinks},
                        {"nvls", s.nvls},
                        {"nics_per_node", s.nicsPerNode},
                        {"gpu_nic_bandwidth_bytes_per_s", s.gpuNicBandwidth},
                        {"cpu_vendor", s.cpuVendor},
                        {"net_latency_us", s.netLatencyUs},
                        {"launch_us", s.launchUs},
                        {"nvlink_efficiency", s.nvlinkEfficiency},
                        {"net_efficiency", s.netEfficiency},
                        {"nvls_efficiency", s.nvlsEfficiency},
                        {"fill_slices", s.fillSlices}};
    if (s.sms > 0) j["sms"] = s.sms;
    return j;
}

ClusterSpec parseCluster(const JsonReader& r) {
    r.checkFormat(kClusterFormat, kClusterVersion);
    r.allowOnly({"format", "version", "name", "nodes", "device", "node", "network", "host", "sim",
                 "nccl", "sources", "notes"});
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

    if (auto sim = r.find("sim")) {
        c.sim = parseSim(*sim);
        c.simDefaulted = false;
    }
    if (auto nc = r.find("nccl")) {
        if (c.device.isHost()) nc->fail("a CPU cluster's collectives run on Gloo, not NCCL");
        c.nccl = parseNccl(*nc);
        if (c.nccl->nicsPerNode > c.node.devicesPerNode * 4)
            nc->at("nics_per_node").fail("more than four NICs per GPU of the node");
    }
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

namespace {
// A cluster file may name another as its base ("extends": "h100-sxm-80gb.json", relative to
// its folder): the base is read first and this file's members are merged over it (RFC 7386
// merge patch: objects merge member by member, anything else replaces), so a fabric's
// profile states only what differs from its device's.
Expected<nlohmann::json> readClusterJson(const std::string& path, int depth) {
    auto j = readJsonFile(path);
    if (!j) return Error{j.error()};
    if (!j->is_object() || !j->contains("extends")) return j;
    const nlohmann::json& ext = (*j)["extends"];
    if (!ext.is_string() || ext.get<std::string>().empty())
        return Error{path + ":/extends: expected the file name of a base cluster, got " +
                     describeJson(ext)};
    if (depth >= 8) return Error{path + ":/extends: more than 8 bases deep (a cycle?)"};
    std::string base = ext.get<std::string>();
    if (base[0] != '/') {
        const auto slash = path.find_last_of('/');
        if (slash != std::string::npos) base = path.substr(0, slash + 1) + base;
    }
    auto b = readClusterJson(base, depth + 1);
    if (!b) return Error{path + ":/extends: " + b.error()};
    nlohmann::json patch = *j;
    patch.erase("extends");
    nlohmann::json merged = *b;
    merged.merge_patch(patch);
    return merged;
}
}  // namespace

Expected<ClusterSpec> loadClusterFile(const std::string& path) {
    auto j = readClusterJson(path, 0);
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
    j["sim"] = simJson(c.sim);
    if (c.nccl) j["nccl"] = ncclJson(*c.nccl);
    if (!c.sources.empty()) j["sources"] = c.sources;
    return j;
}

}  // namespace shardscope
