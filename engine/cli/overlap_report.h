// SPDX-License-Identifier: Apache-2.0
#pragma once
// `trace overlap` of a user's PyTorch FSDP traces, reported: the units' rows summed over
// ranks, the JSON document and the text table.
#include <climits>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/args.h"
#include "profiler/analysis/fsdp_trace.h"

namespace shardscope::cli {

// One rank's trace and its analysis.
struct RankAnalysis {
    std::string path;
    int64_t rank = 0;
    FsdpTraceAnalysis a;
};

// Per unit, averaged over ranks (units matched by name).
struct UnitRow {
    const FsdpUnit* first = nullptr;
    double fwdAg = 0, fwdAgExp = 0, bwdAg = 0, bwdAgExp = 0, rs = 0, rsExp = 0, ar = 0, arExp = 0;
    double fwdWait = 0, bwdWait = 0;  // waiting for a peer (fillPeerWaits)
    int64_t fwdAgs = 0, bwdAgs = 0, rss = 0, ars = 0;
    int32_t fwdMin = INT32_MAX, fwdMax = INT32_MIN, bwdMin = INT32_MAX, bwdMax = INT32_MIN;
};

// One rank's unit into its row (units by name across ranks): the sums over ranks.
void addUnit(const FsdpUnit& u, std::vector<UnitRow>& rows, std::map<std::string, size_t>& rowOf);

// `trace overlap --json` of PyTorch traces: the units averaged over ranks, each rank's own.
[[nodiscard]] nlohmann::json overlapJson(const Args& a, const std::vector<RankAnalysis>& ranks,
                                         const std::vector<UnitRow>& rows, const PeerWaitFit& fit,
                                         bool waits, double stepNs, double comm, double exposed,
                                         double peerWait);

// The units' table: per step, averaged over ranks.
void printUnitRows(const std::vector<UnitRow>& rows, double n, bool waits);

// A duration in ms, or "-" when there was none.
[[nodiscard]] std::string msOrDash(double ns, bool any);

}  // namespace shardscope::cli
