// SPDX-License-Identifier: Apache-2.0
#pragma once
// What `shardscope run` makes of its ranks' results: their summary, the document
// `--json`/`--output` write, the prediction beside them and the text it prints; and the
// worker command line it starts them with.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/args.h"
#include "engine/measure/run_trace.h"
#include "plans/cluster/cluster.h"
#include "plans/model/model_graph.h"
#include "plans/plan/plan.h"
#include "plans/plan/resolve.h"

namespace shardscope::cli {

// The ranks' results from the run folder, in rank order; none (said) when one is missing.
[[nodiscard]] std::optional<std::vector<nlohmann::json>> readRankResults(
    const std::filesystem::path& dir, int64_t nproc);

// The ranks' measurements together: the slowest rank's mean step (the measured step time),
// the largest peaks, whether every recorded rank ran the step program's op order, a row per
// rank, and rank 0's breakdown for the summary.
struct RankSummary {
    double stepNs = 0;
    int64_t peak = 0, peakReserved = 0;
    bool orderOk = true;
    nlohmann::json perRank = nlohmann::json::array();
    Breakdown b0;
};
[[nodiscard]] RankSummary summarizeRanks(const std::vector<nlohmann::json>& ranks);

// The worker's command line, the same for every rank (torchrun's environment tells them
// apart). `ints`: --nproc, --steps, --warmup, --batch, --seq, --timeout-s, --micro-batches,
// --threads as read.
[[nodiscard]] std::vector<std::string> workerCommand(
    const Args& a, const std::filesystem::path& engine, const Plan& plan,
    const std::vector<int64_t>& ints, int64_t timeoutS, int64_t threads, const std::string& device,
    const std::string& collectives);

// The run's summary document (`--json`, `--output`).
[[nodiscard]] nlohmann::json runSummary(const ResolvedPlan& r, const Plan& plan,
                                        const std::vector<nlohmann::json>& ranks,
                                        const RankSummary& x, const std::string& device,
                                        int64_t nproc, bool cuda);

// The same step simulated on the cluster, against what the ranks measured.
[[nodiscard]] nlohmann::json predictRun(const ModelGraph& g, const Plan& plan,
                                        const ClusterSpec& cluster, const std::string& planFile,
                                        int64_t nproc, const RankSummary& x);

// The run's summary as text: a row per rank, the losses and rates, and with a cluster the
// prediction against the measurement.
void printRun(const Args& a, const ResolvedPlan& r, const Plan& plan, int64_t nproc, bool cuda,
              const nlohmann::json& out, const RankSummary& x,
              const std::optional<ClusterSpec>& cluster, const nlohmann::json& predicted);

}  // namespace shardscope::cli
