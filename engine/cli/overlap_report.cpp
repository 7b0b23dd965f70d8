// SPDX-License-Identifier: Apache-2.0
#include "engine/cli/overlap_report.h"

#include <algorithm>
#include <iostream>

#include "engine/cli/common.h"

namespace shardscope::cli {

std::string msOrDash(double ns, bool any) {
    return any ? formatMs(ns) : "-";
}

// One rank's unit into its row (units by name across ranks): the sums over ranks.
void addUnit(const FsdpUnit& u, std::vector<UnitRow>& rows, std::map<std::string, size_t>& rowOf) {
    auto [it, fresh] = rowOf.try_emplace(u.name, rows.size());
    if (fresh) rows.push_back({&u});
    UnitRow& x = rows[it->second];
    x.fwdAg += static_cast<double>(u.forward.allGatherNs);
    x.fwdAgExp += static_cast<double>(u.forward.allGatherExposedNs);
    x.bwdAg += static_cast<double>(u.backward.allGatherNs);
    x.bwdAgExp += static_cast<double>(u.backward.allGatherExposedNs);
    x.rs += static_cast<double>(u.backward.reduceScatterNs);
    x.rsExp += static_cast<double>(u.backward.reduceScatterExposedNs);
    x.ar += static_cast<double>(u.backward.allReduceNs);
    x.arExp += static_cast<double>(u.backward.allReduceExposedNs);
    x.fwdWait += static_cast<double>(u.forward.peerWaitNs);
    x.bwdWait += static_cast<double>(u.backward.peerWaitNs);
    x.fwdAgs += u.forward.allGathers;
    x.bwdAgs += u.backward.allGathers;
    x.rss += u.backward.reduceScatters;
    x.ars += u.backward.allReduces;
    if (u.forward.sawAllGather) {
        x.fwdMin = std::min(x.fwdMin, u.forward.minDistance);
        x.fwdMax = std::max(x.fwdMax, u.forward.maxDistance);
    }
    if (u.backward.sawAllGather) {
        x.bwdMin = std::min(x.bwdMin, u.backward.minDistance);
        x.bwdMax = std::max(x.bwdMax, u.backward.maxDistance);
    }
}

// `trace overlap --json` of PyTorch traces: the units averaged over ranks, each rank's own.
nlohmann::json overlapJson(const Args& a, const std::vector<RankAnalysis>& ranks,
                           const std::vector<UnitRow>& rows, const PeerWaitFit& fit, bool waits,
                           double stepNs, double comm, double exposed, double peerWait) {
    const auto n = static_cast<double>(ranks.size());
    const auto& first = ranks.front().a;
    nlohmann::json per = nlohmann::json::array();
    for (const auto& r : ranks) {
        nlohmann::json j = fsdpAnalysisToJson(r.a);
        j["file"] = r.path;
        j["rank"] = r.rank;
        if (!a.flag("--collectives")) j.erase("collectives");
        per.push_back(std::move(j));
    }
    nlohmann::json units = nlohmann::json::array();
    for (const auto& x : rows) {
        auto phase = [&](double ag, double agExp, int64_t ags, int32_t lo, int32_t hi) {
            nlohmann::json j = {{"all_gathers", static_cast<double>(ags) / n},
                                {"all_gather_ns", ag / n},
                                {"all_gather_exposed_ns", agExp / n}};
            if (ags > 0) j["prefetch_distance"] = {{"min", lo}, {"max", hi}};
            return j;
        };
        nlohmann::json fwd = phase(x.fwdAg, x.fwdAgExp, x.fwdAgs, x.fwdMin, x.fwdMax);
        nlohmann::json bwd = phase(x.bwdAg, x.bwdAgExp, x.bwdAgs, x.bwdMin, x.bwdMax);
        bwd["reduce_scatters"] = static_cast<double>(x.rss) / n;
        bwd["reduce_scatter_ns"] = x.rs / n;
        bwd["reduce_scatter_exposed_ns"] = x.rsExp / n;
        bwd["all_reduces"] = static_cast<double>(x.ars) / n;
        bwd["all_reduce_ns"] = x.ar / n;
        bwd["all_reduce_exposed_ns"] = x.arExp / n;
        if (waits) {
            fwd["peer_wait_ns"] = x.fwdWait / n;
            bwd["peer_wait_ns"] = x.bwdWait / n;
        }
        units.push_back({{"unit", x.first->name},
                         {"modules", x.first->modules},
                         {"forward", fwd},
                         {"backward", bwd}});
    }
    return {
        {"format", "shardscope.trace_overlap"},
        {"source", "pytorch"},
        {"api", first.api},
        {"ranks", ranks.size()},
        {"steps", first.steps},
        {"micro_batches", first.microBatches},
        {"step_ns", stepNs / n},
        {"comm_ns_per_step", comm / n},
        {"exposed_ns_per_step", exposed / n},
        {"peer_wait_ns_per_step", waits ? nlohmann::json(peerWait / n) : nlohmann::json(nullptr)},
        {"clock_offsets_ns", fit.clockOffsetNs},
        {"units", units},
        {"per_rank", per}};
}

// The units' table: per step, averaged over ranks.
void printUnitRows(const std::vector<UnitRow>& rows, double n, bool waits) {
    bool anyAr = false;
    for (const auto& x : rows)
        anyAr = anyAr || x.ars > 0;
    std::vector<std::string> head = {"UNIT",    "FWD AG", "EXPOSED", "DIST",   "BWD AG",
                                     "EXPOSED", "DIST",   "RS",      "EXPOSED"};
    std::vector<bool> right = {false, true, true, true, true, true, true, true, true};
    if (anyAr) {
        head.insert(head.end(), {"AR", "EXPOSED"});
        right.insert(right.end(), {true, true});
    }
    if (waits) {
        head.emplace_back("PEER WAIT");
        right.push_back(true);
    }
    Table t(head, right);
    auto dist = [](int32_t lo, int32_t hi) {
        if (lo == INT32_MAX) return std::string("-");
        return lo == hi ? std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi);
    };
    for (const auto& x : rows) {
        std::vector<std::string> cells = {x.first->displayName(),
                                          msOrDash(x.fwdAg / n, x.fwdAgs > 0),
                                          msOrDash(x.fwdAgExp / n, x.fwdAgs > 0),
                                          dist(x.fwdMin, x.fwdMax),
                                          msOrDash(x.bwdAg / n, x.bwdAgs > 0),
                                          msOrDash(x.bwdAgExp / n, x.bwdAgs > 0),
                                          dist(x.bwdMin, x.bwdMax),
                                          msOrDash(x.rs / n, x.rss > 0),
                                          msOrDash(x.rsExp / n, x.rss > 0)};
        if (anyAr) {
            cells.push_back(msOrDash(x.ar / n, x.ars > 0));
            cells.push_back(msOrDash(x.arExp / n, x.ars > 0));
        }
        if (waits) cells.push_back(formatMs((x.fwdWait + x.bwdWait) / n));
        t.row(cells);
    }
    t.print(std::cout);
}

}  // namespace shardscope::cli
