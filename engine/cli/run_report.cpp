// SPDX-License-Identifier: Apache-2.0
#include "engine/cli/run_report.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "engine/cli/common.h"
#include "engine/schedule/step_program.h"
#include "engine/sim/simulator.h"

namespace shardscope::cli {

namespace fs = std::filesystem;

// The ranks' results from the run folder, in rank order.
std::optional<std::vector<nlohmann::json>> readRankResults(const fs::path& dir, int64_t nproc) {
    std::vector<nlohmann::json> ranks;
    for (int64_t rk = 0; rk < nproc; ++rk) {
        std::ifstream in(dir / ("rank" + std::to_string(rk) + ".json"));
        auto j = nlohmann::json::parse(in, nullptr, false);
        if (j.is_discarded()) {
            std::cerr << "error: rank " << rk << " wrote no readable result ("
                      << (dir / ("rank" + std::to_string(rk) + ".json")).string() << ")\n";
            return std::nullopt;
        }
        ranks.push_back(std::move(j));
    }
    return ranks;
}

RankSummary summarizeRanks(const std::vector<nlohmann::json>& ranks) {
    RankSummary x;
    for (const auto& rk : ranks) {
        double sum = 0;
        for (const auto& t : rk["step_time_ns"])
            sum += t.get<double>();
        const double mean = sum / static_cast<double>(rk["step_time_ns"].size());
        x.stepNs = std::max(x.stepNs, mean);
        x.peak = std::max(x.peak, rk["peak_allocated_bytes"].get<int64_t>());
        if (rk.contains("peak_reserved_bytes"))
            x.peakReserved = std::max(x.peakReserved, rk["peak_reserved_bytes"].get<int64_t>());
        if (rk.contains("device_trace_note"))
            std::cerr << "rank " << rk["rank"]
                      << ": no device trace: " << rk["device_trace_note"].get<std::string>()
                      << "\n";
        if (rk.value("recorded", true))
            x.orderOk = x.orderOk && rk["op_order_matches_program"].get<bool>();
        const Breakdown b = measuredBreakdown(rk);
        if (x.perRank.empty()) x.b0 = b;
        x.perRank.push_back(
            {{"rank", rk["rank"]},
             {"step_time_ns", mean},
             {"peak_allocated_bytes", rk["peak_allocated_bytes"]},
             {"peak_reserved_bytes", rk.value("peak_reserved_bytes", nlohmann::json())},
             {"last_step_peak_allocated_bytes", rk["last_step_peak_allocated_bytes"]},
             {"allocations_per_step", rk.value("allocations_per_step", 0.0)},
             {"recorded_ops_per_step", rk.value("recorded_ops_per_step", 0.0)},
             {"last_step_start_allocated_bytes", rk["last_step_start_allocated_bytes"]},
             {"step_times_ns", rk["step_time_ns"]},
             {"compute_ns", b.computeNs},
             {"comm_ns", b.commNs},
             {"exposed_comm_ns", b.exposedNs}});
    }
    return x;
}

// The worker's command line, the same for every rank (torchrun's environment tells them
// apart).
std::vector<std::string> workerCommand(const Args& a, const fs::path& engine, const Plan& plan,
                                       const std::vector<int64_t>& ints, int64_t timeoutS,
                                       int64_t threads, const std::string& device,
                                       const std::string& collectives) {
    std::vector<std::string> common = {
        engine.string(),   "worker",
        "--model",         a.get("--model"),
        "--plan",          a.get("--plan"),
        "--steps",         std::to_string(ints[1] ? ints[1] : 3),
        "--warmup",        std::to_string(a.has("--warmup") ? ints[2] : 1),
        "--batch",         std::to_string(plan.microBatchSize),
        "--seq",           std::to_string(plan.seqLen),
        "--micro-batches", std::to_string(plan.microBatches),
        "--timeout-s",     std::to_string(timeoutS),
        "--threads",       std::to_string(threads)};
    if (a.flag("--no-record")) common.push_back("--no-record");
    common.push_back("--device");
    common.push_back(device);
    common.push_back("--collectives");
    common.push_back(collectives);
    if (a.flag("--no-device-trace")) common.push_back("--no-device-trace");
    if (a.has("--dump-params")) {
        common.push_back("--dump-params");
        common.push_back(a.get("--dump-params"));
    }
    return common;
}

// The run's summary document (`--json`, `--output`).
nlohmann::json runSummary(const ResolvedPlan& r, const Plan& plan,
                          const std::vector<nlohmann::json>& ranks, const RankSummary& x,
                          const std::string& device, int64_t nproc, bool cuda) {
    const double tokens =
        static_cast<double>(plan.microBatchSize * plan.seqLen * plan.microBatches * nproc);
    return {{"plan", r.plan.name},
            {"device", device},
            {"model_kind", ranks[0].value("model_kind", "")},
            {"world_size", nproc},
            {"micro_batch_size", plan.microBatchSize},
            {"seq_len", plan.seqLen},
            {"micro_batches", plan.microBatches},
            {"steps", ranks[0]["step_time_ns"].size()},
            {"step_time_ns", static_cast<int64_t>(x.stepNs)},
            {"compute_ns", x.b0.computeNs},
            {"comm_ns", x.b0.commNs},
            {"exposed_comm_ns", x.b0.exposedNs},
            {"peak_allocated_bytes", x.peak},
            {"peak_reserved_bytes", cuda ? nlohmann::json(x.peakReserved) : nlohmann::json()},
            {"tokens_per_s", tokens / (x.stepNs * 1e-9)},
            {"losses", ranks[0]["losses"]},
            {"op_order_matches_program", x.orderOk},
            {"op_order", ranks[0]["op_order"]},
            {"ranks", x.perRank}};
}

// The same step simulated on the cluster, against what the ranks measured.
nlohmann::json predictRun(const ModelGraph& g, const Plan& plan, const ClusterSpec& cluster,
                          const std::string& planFile, int64_t nproc, const RankSummary& x) {
    const ResolvedPlan rc = resolvePlan(g, plan, &cluster, planFile);
    StepOptions so = stepOptionsFor(plan, cluster);
    so.recomputeEarlyStop = false;  // the engine's checkpoint recomputes all of forward
    const StepProgram prog = buildStepProgram(rc, so);
    const SimResult s = simulate(prog, cluster, nproc);
    return {{"cluster", cluster.name},
            {"step_time_ns", s.stepNs},
            {"exposed_comm_ns", s.exposedCommNs},
            {"peak_allocated_bytes", s.peakAllocated},
            {"step_time_error", (static_cast<double>(s.stepNs) - x.stepNs) / x.stepNs},
            {"peak_allocated_error",
             (static_cast<double>(s.peakAllocated) - static_cast<double>(x.peak)) /
                 static_cast<double>(x.peak)}};
}

// The run's summary as text: a row per rank, the losses and rates, and with a cluster the
// prediction against the measurement.
void printRun(const Args& a, const ResolvedPlan& r, const Plan& plan, int64_t nproc, bool cuda,
              const nlohmann::json& out, const RankSummary& x,
              const std::optional<ClusterSpec>& cluster, const nlohmann::json& predicted) {
    std::cout << "Measured " << out["steps"] << " step" << (out["steps"] == 1 ? "" : "s")
              << " of plan " << (r.plan.name.empty() ? a.get("--plan") : r.plan.name) << " on "
              << nproc << (cuda ? " GPU rank" : " CPU rank") << (nproc > 1 ? "s" : "")
              << (cuda ? " (NCCL)" : " (Gloo)") << ", micro-batch " << plan.microBatchSize << " x "
              << plan.seqLen
              << (plan.microBatches > 1
                      ? " x " + std::to_string(plan.microBatches) + " micro-batches"
                      : "")
              << "\n\n";
    Table t({"RANK", "STEP TIME", "COMPUTE", "COMM", "EXPOSED COMM", "PEAK ALLOCATED"},
            {false, true, true, true, true, true});
    for (const auto& pr : x.perRank)
        t.row({std::to_string(pr["rank"].get<int>()), formatMs(pr["step_time_ns"].get<double>()),
               formatMs(static_cast<double>(pr["compute_ns"].get<int64_t>())),
               formatMs(static_cast<double>(pr["comm_ns"].get<int64_t>())),
               formatMs(static_cast<double>(pr["exposed_comm_ns"].get<int64_t>())),
               formatMiB(static_cast<double>(pr["peak_allocated_bytes"].get<int64_t>()))});
    t.print(std::cout);
    std::cout << "\n  losses       ";
    for (const auto& l : out["losses"]) {
        char b[32];
        std::snprintf(b, sizeof b, "%.4f ", l.get<double>());
        std::cout << b;
    }
    // Whole tokens a second, or three significant digits below 100 (a CPU run of a large
    // model at a short sequence does less than one a second).
    const double tps = out["tokens_per_s"].get<double>();
    char tpsText[32];
    std::snprintf(tpsText, sizeof tpsText, tps >= 100 ? "%.0f" : "%.3g", tps);
    std::cout << "(warm-up included)\n  tokens/s     " << tpsText << "\n  reserved     "
              << (cuda ? formatMiB(static_cast<double>(x.peakReserved)) +
                             " x.peak (the CUDA caching allocator)"
                       : std::string("n/a on CPU (no caching allocator; allocated is what the "
                                     "CPU allocator handed out)"))
              << "\n  op order     "
              << (a.flag("--no-record") ? std::string("not recorded (--no-record)")
                  : x.orderOk           ? "equals the step program's, every step and rank"
                              : "DIFFERS from the step program: " + out["op_order"].dump())
              << "\n";
    if (cluster) {
        std::cout << "\nPredicted (" << cluster->name << ") against measured:\n";
        Table c({"", "PREDICTED", "MEASURED", "ERROR"}, {false, true, true, true});
        const auto pred = [&](const char* key) {
            return static_cast<double>(predicted[key].get<int64_t>());
        };
        const double exposed = static_cast<double>(x.b0.exposedNs),
                     pk = static_cast<double>(x.peak);
        c.row({"step time", formatMs(pred("step_time_ns")), formatMs(x.stepNs),
               formatError(x.stepNs, pred("step_time_ns"))});
        c.row({"exposed comm", formatMs(pred("exposed_comm_ns")), formatMs(exposed),
               formatError(exposed, pred("exposed_comm_ns"))});
        c.row({"peak allocated", formatMiB(pred("peak_allocated_bytes")), formatMiB(pk),
               formatError(pk, pred("peak_allocated_bytes"))});
        c.print(std::cout);
    }
    std::cout.flush();
}

}  // namespace shardscope::cli
