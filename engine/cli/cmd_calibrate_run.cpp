// SPDX-License-Identifier: Apache-2.0
// `shardscope calibrate --trace`: a measured run fitted op by op.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "engine/calibrate/calibrate.h"
#include "engine/calibrate/kernel_fit.h"
#include "engine/calibrate/kernel_report.h"
#include "engine/calibrate/kernel_samples.h"
#include "engine/cli/calibrate_cli.h"
#include "engine/cli/calibrate_report.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/fsdp_trace_cli.h"
#include "engine/cli/launch.h"
#include "engine/measure/step_trace.h"
#include "engine/measure/trace_diff.h"
#include "engine/schedule/step_program.h"
#include "engine/sim/cost_model.h"
#include "engine/sim/simulator.h"
#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "plans/plan/resolve.h"
#include "profiler/analysis/trace_loader.h"

namespace shardscope::cli {

// `calibrate --trace`: a measured run (a `shardscope run --trace` file, or a user's PyTorch
// FSDP traces joined to the plan that ran), fitted op by op.
// The calibration against the measured step, before and after, and what was fitted.
nlohmann::json opByOpJson(const Args& a, const TraceFile& measured, const SimResult& before,
                          const SimResult& after, const CalibrationFit& fit) {
    const double ms0 = measured.stepNs;
    const double pk = measured.peakAllocated;
    auto err = [](double pred, double meas) { return meas > 0 ? (pred - meas) / meas : 0.0; };
    return {{"trace", a.get("--trace")},
            {"cluster", a.get("--cluster")},
            {"output", a.get("--output")},
            {"measured_step_time_ns", ms0},
            {"measured_peak_allocated_bytes", static_cast<int64_t>(measured.peakAllocated)},
            {"before",
             {{"step_time_ns", before.stepNs},
              {"step_time_error", err(static_cast<double>(before.stepNs), ms0)},
              {"peak_allocated_bytes", before.peakAllocated},
              {"peak_allocated_error", err(static_cast<double>(before.peakAllocated), pk)}}},
            {"after",
             {{"step_time_ns", after.stepNs},
              {"step_time_error", err(static_cast<double>(after.stepNs), ms0)},
              {"peak_allocated_bytes", after.peakAllocated},
              {"peak_allocated_error", err(static_cast<double>(after.peakAllocated), pk)}}},
            {"fitted",
             {{"compute_efficiency", fit.cluster.sim.computeEfficiency},
              {"memory_efficiency", fit.cluster.sim.memoryEfficiency},
              {"overlap_slowdown", fit.cluster.sim.overlapSlowdown},
              {"cpu_issue_ns", fit.cluster.sim.cpuIssueNs},
              {"collective_latency_ns", fit.latencyNs},
              {"collective_bus_bandwidth_bytes_per_s", fit.busBandwidth},
              {"compute_ops", fit.computeOps},
              {"memory_ops", fit.memoryOps},
              {"collective_ops", fit.collectiveOps}}},
            {"notes", fit.notes}};
}

// The same as text: the fitted figures and the step before and after.
void printOpByOp(const Args& a, const TraceFile& measured, const SimResult& before,
                 const SimResult& after, const CalibrationFit& fit) {
    const double ms0 = measured.stepNs;
    const double pk = measured.peakAllocated;
    std::cout << "Calibrated " << a.get("--cluster") << " from " << a.get("--trace") << " ("
              << measured.ops.size() << " measured ops)\n\n"
              << "  compute efficiency  ";
    printCurve(fit.cluster.sim.computeEfficiency, "FLOP");
    char line[256];
    std::snprintf(line, sizeof line,
                  "\n  memory efficiency   %.3f\n  overlap slowdown    %.2f\n  CPU issue per op    "
                  "%.1f us\n  collectives         %.1f us + bytes / %.2f GB/s (bus)\n",
                  fit.cluster.sim.memoryEfficiency, fit.cluster.sim.overlapSlowdown,
                  fit.cluster.sim.cpuIssueNs * 1e-3, fit.latencyNs * 1e-3, fit.busBandwidth * 1e-9);
    std::cout << line;
    for (const auto& n : fit.notes)
        std::cout << "  note: " << n << "\n";
    std::cout << "\n";
    Table t({"", "MEASURED", "BEFORE", "ERROR", "AFTER", "ERROR"},
            {false, true, true, true, true, true});
    t.row({"step time", formatMs(ms0), formatMs(static_cast<double>(before.stepNs)),
           formatError(ms0, static_cast<double>(before.stepNs)),
           formatMs(static_cast<double>(after.stepNs)),
           formatError(ms0, static_cast<double>(after.stepNs))});
    t.row({"peak allocated", formatMiB(pk), formatMiB(static_cast<double>(before.peakAllocated)),
           formatError(pk, static_cast<double>(before.peakAllocated)),
           formatMiB(static_cast<double>(after.peakAllocated)),
           formatError(pk, static_cast<double>(after.peakAllocated))});
    t.print(std::cout);
    std::cout << "\nWrote " << a.get("--output") << "\n";
}

int runCalibrateOpByOp(const Args& a) {
    if (!a.positionals().empty()) {
        std::cerr << "error: more trace files (" << a.positionals().front()
                  << ") go with --from-trace; --trace takes one file or folder\n";
        return kExitUsage;
    }
    const std::string tracePath = a.get("--trace");
    auto pytorch = namesPyTorchTraces({tracePath});
    if (failed(pytorch)) return kExitUsage;
    std::vector<MeasuredOp> ops;
    std::optional<PyTorchRun> torchRun;
    std::optional<TraceFile> measured;
    std::optional<ModelGraph> model;
    std::optional<Plan> plan;
    std::optional<ClusterSpec> cluster;
    std::optional<ResolvedPlan> resolved;
    std::string planPath;
    if (*pytorch) {
        // A user's own PyTorch FSDP job: its traces joined to the program of the plan that
        // ran (given, or recovered from the traces).
        auto run = loadPyTorchRun(a, {tracePath});
        if (failed(run)) return kExitUsage;
        torchRun = std::move(*run);
        measured = torchRun->join->file;
        cluster = *torchRun->cluster;
        resolved = *torchRun->resolved;
        planPath = torchRun->planSource;
        if (!a.flag("--json"))
            std::cout << "joined " << torchRun->join->joined << " FSDP ops of "
                      << torchRun->traces.size() << " PyTorch rank trace"
                      << (torchRun->traces.size() > 1 ? "s" : "") << " to the program of the plan "
                      << planPath << "\n";
    } else {
        auto m = readTraceFile(tracePath);
        if (failed(m)) return kExitUsage;
        measured = std::move(*m);
        const auto& run = measured->run;
        auto fromRun = [&](const char* key) -> std::string {
            return run.is_object() && run.contains(key) && run[key].is_string()
                       ? run[key].get<std::string>()
                       : std::string();
        };
        const std::string modelPath = a.has("--model") ? a.get("--model") : fromRun("model");
        planPath = a.has("--plan") ? a.get("--plan") : fromRun("plan_file");
        if (modelPath.empty() || planPath.empty()) {
            std::cerr << "error: " << tracePath
                      << ":/metadata/run: no model and plan recorded (not written by `shardscope "
                         "run --trace`?); give --model and --plan\n";
            return kExitUsage;
        }
        HfLoadOptions ho;
        if (auto d = parseDType(fromRun("param_dtype")); d) ho.paramDtype = *d;
        if (auto d = parseDType(fromRun("activation_dtype")); d) ho.activationDtype = *d;
        auto g = loadModelFile(modelPath, ho);
        if (failed(g)) return kExitUsage;
        model = std::move(*g);
        auto p = loadPlanFile(planPath);
        if (failed(p)) return kExitUsage;
        plan = std::move(*p);
        auto c = loadClusterNamed(a.get("--cluster"));
        if (failed(c)) return kExitUsage;
        cluster = std::move(*c);
        if (run.is_object()) {
            plan->microBatchSize = run.value("micro_batch_size", plan->microBatchSize);
            plan->seqLen = run.value("seq_len", plan->seqLen);
            plan->seqLenDefaulted = false;
            plan->microBatches = run.value("micro_batches", plan->microBatches);
            if (plan->meshShape.empty()) plan->meshShape = {run.value("world_size", int64_t{2})};
        }
        resolved = resolvePlan(*model, *plan, &*cluster, planPath);
        if (reportPlanErrors(*resolved)) return kExitFailed;
    }
    const ResolvedPlan& r = *resolved;
    StepOptions so = stepOptionsFor(*plan, *cluster);
    so.recomputeEarlyStop = false;  // a ShardScope trace: the engine recomputes all of forward
    const StepProgram prog = torchRun ? *torchRun->program : buildStepProgram(r, so);
    bool byKey = false;
    const std::vector<int32_t> ids = programOpIdsOf(measured->ops, prog, r, byKey);
    if (byKey)
        std::cerr << "note: " << tracePath
                  << ": its op ids name other ops than this program's (recorded by an earlier "
                     "version of it?): joined by unit, phase, kind and order\n";
    for (size_t i = 0; i < measured->ops.size(); ++i) {
        const TraceOp& op = measured->ops[i];
        ops.push_back({ids[i], op.rank, op.step, op.startNs, op.endNs});
    }
    auto fit = calibrate(prog, *cluster, ops, tracePath);
    if (failed(fit)) return kExitFailed;
    fit->cluster.sources.erase("/sim");  // the estimates it described are replaced
    fit->cluster.name = cluster->name + ", calibrated on " +
                        std::filesystem::path(a.get("--trace")).filename().string();
    // What is written must load again (every fitted value within the format's ranges).
    if (auto check = clusterFromJson(clusterToJson(fit->cluster), a.get("--output")); !check) {
        std::cerr << "error: the calibrated cluster does not validate: " << check.error() << "\n";
        return kExitFailed;
    }
    const SimResult before = simulate(prog, *cluster, r.worldSize);
    const SimResult after = simulate(prog, fit->cluster, r.worldSize);
    if (Status st =
            writeFileAtomically(a.get("--output"), clusterToJson(fit->cluster).dump(2) + "\n");
        !st) {
        std::cerr << "error: " << st.error() << "\n";
        return kExitUsage;
    }
    const nlohmann::json out = opByOpJson(a, *measured, before, after, *fit);
    if (a.flag("--json")) return emitJson(out, "").ok() ? kExitOk : kExitUsage;
    printOpByOp(a, *measured, before, after, *fit);
    return kExitOk;
}

}  // namespace shardscope::cli
