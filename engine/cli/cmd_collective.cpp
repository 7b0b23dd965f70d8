// SPDX-License-Identifier: Apache-2.0
// `shardscope collective`: the simulator's collective model on its own, one call or a
// sweep as nccl-tests prints it, and the published sweeps it is checked against.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "engine/calibrate/nccl_sweeps.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/sim/nccl_model.h"
#include "plans/core/strings.h"

namespace shardscope::cli {

namespace {

// "16M", "1G", "1GiB", "512KiB", "8589934592": binary multiples (as nccl-tests reads -b/-e).
Expected<int64_t> parseBytes(const std::string& text, const std::string& option) {
    size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
        ++i;
    std::string num = text.substr(0, i);
    std::string unit = toLower(text.substr(i));
    if (!unit.empty() && unit.back() == 'b') unit.pop_back();
    if (unit.size() == 2 && unit[1] == 'i') unit.pop_back();
    double mult = 1;
    if (unit == "k")
        mult = 1024.0;
    else if (unit == "m")
        mult = 1024.0 * 1024;
    else if (unit == "g")
        mult = 1024.0 * 1024 * 1024;
    else if (unit == "t")
        mult = 1024.0 * 1024 * 1024 * 1024;
    else if (!unit.empty())
        num.clear();
    double v = 0;
    try {
        v = num.empty() ? -1 : std::stod(num);
    } catch (...) {
        v = -1;
    }
    const double b = v * mult;
    if (!(b >= 1) || b > 1e15)
        return Error{option + " " + text +
                     ": expected a size in bytes from 1 to 1e15, as nccl-tests takes it: "
                     "8388608, 8M, 1G or 1GiB (K, M, G, T are binary)"};
    return static_cast<int64_t>(std::llround(b));
}

const char* collName(OpKind k) {
    return k == OpKind::AllGather       ? "all_gather"
           : k == OpKind::ReduceScatter ? "reduce_scatter"
                                        : "all_reduce";
}

double busFactor(OpKind k, int n) {
    const double f = static_cast<double>(n - 1) / n;
    return k == OpKind::AllReduce ? 2 * f : f;
}

std::string fmt(const char* f, double v) {
    char b[64];
    std::snprintf(b, sizeof b, f, v);
    return b;
}

std::string usText(double us) {
    if (us >= 1000) return fmt("%.2f ms", us / 1000);
    return fmt("%.1f us", us);
}

nlohmann::json estimateJson(const NcclEstimate& e, OpKind kind, int64_t bytes, int ranks) {
    const double algbw = static_cast<double>(bytes) / (e.us * 1e-6);
    return {{"time_ns", static_cast<int64_t>(std::llround(e.us * 1000))},
            {"algbw_bytes_per_s", algbw},
            {"busbw_bytes_per_s", algbw * busFactor(kind, ranks)},
            {"algorithm", ncclAlgoName(e.algo)},
            {"protocol", ncclProtoName(e.proto)},
            {"channels", e.channels},
            {"nodes", e.nodes},
            {"ranks_per_node", e.ppn},
            {"nccl_estimate_ns", static_cast<int64_t>(std::llround(e.ncclUs * 1000))},
            {"nccl_latency_ns", static_cast<int64_t>(std::llround(e.latencyUs * 1000))},
            {"nccl_algbw_bytes_per_s", e.algbwGBps * 1e9},
            {"corrections",
             {{"launch_ns", static_cast<int64_t>(std::llround(e.launchUs * 1000))},
              {"bandwidth_efficiency", e.efficiency},
              {"pipeline_fill_ns", static_cast<int64_t>(std::llround(e.fillUs * 1000))}}}};
}

int runSweeps(const Args& a) {
    const std::string file = a.get("--sweeps");
    std::string dir = a.get("--cluster-dir");
    if (dir.empty()) {
        const auto slash = file.find_last_of('/');
        dir = (slash == std::string::npos ? std::string(".") : file.substr(0, slash)) +
              "/../clusters";
    }
    auto sweeps = loadNcclSweeps(file, dir);
    if (failed(sweeps)) return kExitUsage;
    nlohmann::json out = nlohmann::json::array();
    const bool json = a.flag("--json");
    nlohmann::json fitJson;
    if (a.flag("--fit")) {
        const NcclSweepFit fit = fitNcclCorrections(*sweeps);
        fitJson = {{"fill_slices", fit.fillSlices}, {"profiles", nlohmann::json::array()}};
        Table t({"profile", "points", "launch_us", "nvlink_efficiency", "net_efficiency",
                 "nvls_efficiency", "net_latency_us", "median |error| before", "after"},
                {false, true, true, true, true, true, true, true, true});
        for (const NcclProfileFit& p : fit.profiles) {
            fitJson["profiles"].push_back({{"cluster", p.clusterName},
                                           {"points", p.points},
                                           {"launch_us", p.launchUs},
                                           {"nvlink_efficiency", p.nvlinkEfficiency},
                                           {"net_efficiency", p.netEfficiency},
                                           {"net_latency_us", p.netLatencyUs},
                                           {"nvls_efficiency", p.nvlsEfficiency},
                                           {"median_abs_error_before", p.medianAbsErrorBefore},
                                           {"median_abs_error_after", p.medianAbsErrorAfter}});
            t.row({p.clusterName, std::to_string(p.points), fmt("%.1f", p.launchUs),
                   p.nodePoints ? fmt("%.3f", p.nvlinkEfficiency) : "-",
                   p.netPoints ? fmt("%.3f", p.netEfficiency) : "-",
                   p.nvlsPoints ? fmt("%.3f", p.nvlsEfficiency) : "-",
                   p.netPoints + p.nvlsPoints > 0 && p.netLatencyUs > 0
                       ? fmt("%.1f", p.netLatencyUs)
                       : "-",
                   fmt("%.1f%%", p.medianAbsErrorBefore * 100),
                   fmt("%.1f%%", p.medianAbsErrorAfter * 100)});
        }
        if (!json) {
            std::cout << "Fitted to every point of the sweeps (docs/collectives.md): fill_slices "
                      << fmt("%.2f", fit.fillSlices) << "\n";
            t.print(std::cout);
            std::cout << "\n";
        }
    }
    for (const Sweep& s : sweeps->sweeps) {
        const auto results = evaluateSweep(s);
        nlohmann::json pts = nlohmann::json::array();
        if (!json) {
            std::cout << s.id << "  (" << s.clusterName << ", " << s.tool
                      << (s.tuner.empty() ? "" : ", tuner " + s.tuner)
                      << (s.heldOut ? ", held out of the fit" : "") << ")\n";
            Table t({"collective", "bytes", "ranks", "measured", "predicted", "error", "NCCL picks",
                     "env"},
                    {false, true, true, true, true, true, false, false});
            for (const auto& r : results)
                t.row({collName(r.point.kind), formatBytes(r.point.bytes),
                       std::to_string(r.point.ranks), usText(r.point.measuredUs),
                       usText(r.predictedUs), fmt("%+.1f%%", r.error * 100),
                       std::string(ncclAlgoName(r.estimate.algo)) + "/" +
                           ncclProtoName(r.estimate.proto),
                       r.point.envText});
            t.print(std::cout);
        }
        nlohmann::json bands = nlohmann::json::object();
        std::string line;
        for (SweepBand b : {SweepBand::Small, SweepBand::Middle, SweepBand::Large}) {
            const BandSummary m = summarize(results, b);
            if (m.points == 0) continue;
            bands[sweepBandName(b)] = {{"points", m.points},
                                       {"median_abs_error", m.medianAbsError},
                                       {"max_abs_error", m.maxAbsError}};
            line += std::string("  ") + sweepBandName(b) + ": median |error| " +
                    fmt("%.1f%%", m.medianAbsError * 100) + ", max " +
                    fmt("%.1f%%", m.maxAbsError * 100) + " (" + std::to_string(m.points) + ")";
        }
        if (!json) std::cout << line << "\n\n";
        for (const auto& r : results)
            pts.push_back({{"collective", collName(r.point.kind)},
                           {"bytes", r.point.bytes},
                           {"ranks", r.point.ranks},
                           {"measured_us", r.point.measuredUs},
                           {"predicted_us", r.predictedUs},
                           {"error", r.error},
                           {"algorithm", ncclAlgoName(r.estimate.algo)},
                           {"protocol", ncclProtoName(r.estimate.proto)},
                           {"nccl_estimate_us", r.estimate.ncclUs},
                           {"env", r.point.envText}});
        out.push_back({{"id", s.id},
                       {"cluster", s.clusterName},
                       {"tool", s.tool},
                       {"blocking", s.blocking},
                       {"tuner", s.tuner},
                       {"held_out", s.heldOut},
                       {"nccl_version", s.cluster.nccl->version},
                       {"source", s.source},
                       {"bands", bands},
                       {"points", pts}});
    }
    if (json) {
        nlohmann::json doc{{"sweeps", out}};
        if (!fitJson.is_null()) doc["fit"] = fitJson;
        return emitJson(doc, "").ok() ? kExitOk : kExitUsage;
    }
    std::cout << "Blocking tools (each call waited for) time the host's launch and wait too: "
                 "the profiles fitted on them carry it in launch_us (docs/collectives.md).\n";
    return kExitOk;
}

int runCollective(const Args& a) {
    if (a.has("--sweeps")) return runSweeps(a);
    if (a.positionals().size() != 1) {
        std::cerr << "error: name one collective: all_gather, reduce_scatter or all_reduce "
                     "(or evaluate published sweeps with --sweeps FILE)\n";
        return kExitUsage;
    }
    const std::string name = a.positionals()[0];
    OpKind kind;
    if (name == "all_gather" || name == "allgather")
        kind = OpKind::AllGather;
    else if (name == "reduce_scatter" || name == "reducescatter")
        kind = OpKind::ReduceScatter;
    else if (name == "all_reduce" || name == "allreduce")
        kind = OpKind::AllReduce;
    else {
        std::cerr << "error: unknown collective \"" << name << "\""
                  << didYouMean(name, {"all_gather", "reduce_scatter", "all_reduce"})
                  << ": expected all_gather, reduce_scatter or all_reduce\n";
        return kExitUsage;
    }
    for (const char* req : {"--bytes", "--ranks", "--cluster"})
        if (!a.has(req)) {
            std::cerr << "error: " << req << " is required (see shardscope collective --help)\n";
            return kExitUsage;
        }
    auto cluster = loadClusterArg(a);
    if (failed(cluster)) return kExitUsage;
    const ClusterSpec& c = **cluster;
    if (!c.nccl) {
        std::cerr << "error: " << a.get("--cluster")
                  << " has no nccl section, so the simulator prices its collectives with "
                     "the ring lines of sim.protocols, not NCCL's model; give a GPU profile "
                     "from samples/clusters (they all have one)\n";
        return kExitUsage;
    }
    auto ranks = a.getInt("--ranks", 2);
    if (failed(ranks)) return kExitUsage;
    if (*ranks > c.worldSize()) {
        std::cerr << "error: --ranks " << *ranks << ": " << a.get("--cluster") << " has "
                  << c.worldSize() << " GPUs (" << c.nodes << " nodes x " << c.node.devicesPerNode
                  << ")\n";
        return kExitUsage;
    }
    auto env = parseNcclEnv(a.get("--nccl-algo"), a.get("--nccl-proto"), a.get("--nccl-nvls"));
    if (failed(env)) return kExitUsage;
    // --bytes S or FROM:TO (doubling, as nccl-tests -b FROM -e TO -f 2).
    const std::string spec = a.get("--bytes");
    std::vector<int64_t> sizes;
    if (const auto colon = spec.find(':'); colon != std::string::npos) {
        auto lo = parseBytes(spec.substr(0, colon), "--bytes");
        auto hi = parseBytes(spec.substr(colon + 1), "--bytes");
        if (failed(lo) || failed(hi)) return kExitUsage;
        if (*hi < *lo) {
            std::cerr << "error: --bytes " << spec << ": the sweep ends below where it starts\n";
            return kExitUsage;
        }
        for (int64_t b = *lo; b <= *hi && sizes.size() < 64; b *= 2)
            sizes.push_back(b);
    } else {
        auto b = parseBytes(spec, "--bytes");
        if (failed(b)) return kExitUsage;
        sizes.push_back(*b);
    }
    const int n = static_cast<int>(*ranks);
    const RankPlacement at = placeRanks(c, n);
    const NcclSpec& s = *c.nccl;
    nlohmann::json results = nlohmann::json::array();
    const bool json = a.flag("--json");
    if (!json)
        std::cout << collName(kind) << " over " << n << " ranks (" << at.nodes << " node"
                  << (at.nodes > 1 ? "s" : "") << " x " << at.perNode << ") on " << c.name
                  << ": NCCL " << s.version << "'s model (its " << ncclTableFor(s.version)
                  << " tables)\n\n";
    Table t(
        {"bytes", "time", "algbw GB/s", "busbw GB/s", "NCCL picks", "channels", "NCCL's estimate"},
        {true, true, true, true, false, true, true});
    for (int64_t bytes : sizes) {
        auto all = ncclCandidates(c, s, kind, bytes, n, at.nodes, *env);
        if (all.empty()) {
            std::cerr << "error: no NCCL algorithm applies (NCCL_ALGO/NCCL_PROTO exclude every "
                         "one for "
                      << collName(kind) << ")\n";
            return kExitUsage;
        }
        const NcclEstimate& e = all.front();
        nlohmann::json j = estimateJson(e, kind, bytes, n);
        j["bytes"] = bytes;
        if (a.flag("--all")) {
            nlohmann::json cands = nlohmann::json::array();
            for (const auto& x : all)
                cands.push_back(estimateJson(x, kind, bytes, n));
            j["candidates"] = cands;
        }
        results.push_back(j);
        const double algbw = static_cast<double>(bytes) / (e.us * 1e3);
        t.row({formatBytes(bytes), usText(e.us), fmt("%.1f", algbw),
               fmt("%.1f", algbw * busFactor(kind, n)),
               std::string(ncclAlgoName(e.algo)) + "/" + ncclProtoName(e.proto),
               std::to_string(e.channels), usText(e.ncclUs)});
        if (!json && a.flag("--all") && sizes.size() == 1) {
            Table ct(
                {"algorithm", "protocol", "NCCL's estimate", "latency", "algbw GB/s", "corrected"},
                {false, false, true, true, true, true});
            for (const auto& x : all)
                ct.row({ncclAlgoName(x.algo), ncclProtoName(x.proto), usText(x.ncclUs),
                        usText(x.latencyUs), fmt("%.1f", x.algbwGBps), usText(x.us)});
            t.print(std::cout);
            std::cout << "\nEvery algorithm and protocol NCCL weighs, cheapest by its estimate "
                         "first:\n";
            ct.print(std::cout);
            return kExitOk;
        }
    }
    if (json) {
        nlohmann::json out{{"collective", collName(kind)},
                           {"ranks", n},
                           {"nodes", at.nodes},
                           {"ranks_per_node", at.perNode},
                           {"cluster", c.name},
                           {"nccl_version", s.version},
                           {"results", results}};
        if (results.size() == 1) out.update(results[0]);
        return emitJson(out, "").ok() ? kExitOk : kExitUsage;
    }
    t.print(std::cout);
    std::cout << "\nbusbw as nccl-tests counts it. Time is NCCL's estimate corrected by what "
                 "published sweeps measured (docs/collectives.md): "
              << fmt("%.1f", s.launchUs) << " us a call, "
              << fmt("%.2f", at.nodes > 1 ? s.netEfficiency : s.nvlinkEfficiency)
              << " of its bandwidth " << (at.nodes > 1 ? "across nodes" : "within the node")
              << ", and a pipeline slice's fill.\n";
    return kExitOk;
}

}  // namespace

std::vector<Command> collectiveCommands() {
    CommandSpec s;
    s.name = "collective";
    s.summary = "Time one NCCL collective (or a sweep) with the simulator's model of NCCL.";
    s.positionalsMetavar = "all_gather|reduce_scatter|all_reduce";
    s.description =
        "Prices an all-gather, reduce-scatter or all-reduce as the step simulator does: NCCL's "
        "own cost model (its topology search's channels, tuning.cc's latency and bandwidth "
        "tables for the cluster's NCCL version) picks the algorithm and protocol NCCL would, "
        "and the time is NCCL's estimate corrected by what published sweeps measured on that "
        "hardware (docs/collectives.md).\n\n"
        "--bytes counts as nccl-tests does: the gathered output of an all-gather, the input of "
        "a reduce-scatter, the buffer of an all-reduce. Ranks fill a node before the next, as "
        "FSDP places them. busbw is nccl-tests' bus bandwidth, so the output reads against an "
        "nccl-tests log of your own cluster line by line.\n\n"
        "--sweeps FILE evaluates published sweeps (samples/published/nccl-sweeps.json): every "
        "point predicted from its cluster profile, with the error per point and the median "
        "and largest per size band.";
    s.options = {
        {"--bytes", "S|FROM:TO", "size in bytes (8M, 1G, 1GiB; binary units) or a doubling sweep"},
        {"--ranks", "N", "ranks in the communicator"},
        {"--cluster", "FILE", "cluster profile with an nccl section (samples/clusters)", "", false,
         "-c"},
        {"--nccl-algo", "LIST", "as NCCL_ALGO: ring,tree; ^nvls; allreduce:tree;allgather:ring"},
        {"--nccl-proto", "LIST", "as NCCL_PROTO: LL,LL128,Simple or ^LL"},
        {"--nccl-nvls", "0|1", "as NCCL_NVLS_ENABLE (0 keeps NVLink SHARP off)"},
        {"--all", "", "list every algorithm and protocol NCCL weighs"},
        {"--sweeps", "FILE", "evaluate the published sweeps of FILE"},
        {"--cluster-dir", "DIR", "where --sweeps finds its cluster profiles [FILE's ../clusters]"},
        {"--fit", "", "with --sweeps: fit each profile's corrections to its sweeps first"},
        {"--json", "", "print JSON"}};
    s.examples = {
        "shardscope collective all_gather --bytes 1G --ranks 64 -c "
        "samples/clusters/h100-sxm-80gb-ib.json",
        "shardscope collective all_reduce --bytes 8:8G --ranks 16 -c "
        "samples/clusters/h100-sxm-80gb-ib.json",
        "shardscope collective reduce_scatter --bytes 436M --ranks 1024 -c "
        "samples/clusters/h100-sxm-80gb-ib.json --all",
        "shardscope collective --sweeps samples/published/nccl-sweeps.json"};
    return {{s, runCollective}};
}

}  // namespace shardscope::cli
