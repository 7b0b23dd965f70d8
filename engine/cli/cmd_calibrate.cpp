// SPDX-License-Identifier: Apache-2.0
// `shardscope calibrate`: fit a cluster's simulator parameters to a measured run and print
// the simulation error before and after.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/fsdp_trace_cli.h"
#include "engine/schedule/step_program.h"
#include "engine/sim/calibrate.h"
#include "engine/sim/simulator.h"
#include "plans/core/atomic_write.h"
#include "plans/plan/resolve.h"
#include "profiler/analysis/step_trace.h"

namespace shardscope::cli {

namespace {

int runCalibrate(const Args& a) {
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
        auto c = loadClusterFile(a.get("--cluster"));
        if (failed(c)) return kExitUsage;
        cluster = std::move(*c);
        if (run.is_object()) {
            plan->microBatchSize = run.value("micro_batch_size", plan->microBatchSize);
            plan->seqLen = run.value("seq_len", plan->seqLen);
            plan->microBatches = run.value("micro_batches", plan->microBatches);
            if (plan->meshShape.empty()) plan->meshShape = {run.value("world_size", int64_t{2})};
        }
        resolved = resolvePlan(*model, *plan, &*cluster, planPath);
        if (resolved->hasErrors()) {
            for (const auto& pr : resolved->problems)
                std::cerr << pr.toString() << "\n";
            std::cerr << "error: the plan has errors\n";
            return kExitFailed;
        }
    }
    for (const TraceOp& op : measured->ops)
        ops.push_back({op.opId, op.rank, op.step, op.startNs, op.endNs});
    const ResolvedPlan& r = *resolved;
    const StepProgram prog =
        torchRun ? *torchRun->program : buildStepProgram(r, stepOptionsFor(*plan, *cluster));
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
    const double ms0 = measured->stepNs;
    const double pk = measured->peakAllocated;
    auto err = [](double pred, double meas) { return meas > 0 ? (pred - meas) / meas : 0.0; };
    nlohmann::json out{
        {"trace", a.get("--trace")},
        {"cluster", a.get("--cluster")},
        {"output", a.get("--output")},
        {"measured_step_time_ns", ms0},
        {"measured_peak_allocated_bytes", static_cast<int64_t>(measured->peakAllocated)},
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
         {{"compute_efficiency", fit->cluster.sim.computeEfficiency},
          {"memory_efficiency", fit->cluster.sim.memoryEfficiency},
          {"overlap_slowdown", fit->cluster.sim.overlapSlowdown},
          {"cpu_issue_ns", fit->cluster.sim.cpuIssueNs},
          {"collective_latency_ns", fit->latencyNs},
          {"collective_bus_bandwidth_bytes_per_s", fit->busBandwidth},
          {"compute_ops", fit->computeOps},
          {"memory_ops", fit->memoryOps},
          {"collective_ops", fit->collectiveOps}}},
        {"notes", fit->notes}};
    if (a.flag("--json")) return emitJson(out, "").ok() ? kExitOk : kExitUsage;
    std::cout << "Calibrated " << a.get("--cluster") << " from " << a.get("--trace") << " ("
              << measured->ops.size() << " measured ops)\n\n"
              << "  compute efficiency  ";
    for (const auto& [f, e] : fit->cluster.sim.computeEfficiency) {
        char b[64];
        std::snprintf(b, sizeof b, "%.3g FLOP: %.3f  ", f, e);
        std::cout << b;
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "\n  memory efficiency   %.3f\n  overlap slowdown    %.2f\n  CPU issue per op    "
                  "%.1f us\n  collectives         %.1f us + bytes / %.2f GB/s (bus)\n",
                  fit->cluster.sim.memoryEfficiency, fit->cluster.sim.overlapSlowdown,
                  fit->cluster.sim.cpuIssueNs * 1e-3, fit->latencyNs * 1e-3,
                  fit->busBandwidth * 1e-9);
    std::cout << line;
    for (const auto& n : fit->notes)
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
    return kExitOk;
}

}  // namespace

std::vector<Command> calibrateCommands() {
    CommandSpec s;
    s.name = "calibrate";
    s.summary =
        "Fit a cluster's simulator parameters to a measured run; print the error before and after.";
    s.description =
        "Reads a `shardscope run --trace` file, rebuilds the run's step program (model, plan and\n"
        "micro-batch come from the trace's metadata unless --model/--plan are given), joins\n"
        "the measured ops to it by op id, and fits: compute efficiency by FLOPs per kernel\n"
        "(from compute ops no collective overlapped), memory efficiency (copies and the\n"
        "optimizer), the slowdown of overlapped compute, collective latency and bus bandwidth\n"
        "(least squares), and the CPU's cost to issue an op. Writes the cluster with the\n"
        "fitted values (each named in \"sources\") and prints the simulated step time and\n"
        "peak allocated memory against the measured ones, before and after.\n\n"
        "PyTorch profiler traces of a user's FSDP2 job work the same way: the plan that ran\n"
        "(--plan, or recovered from the traces as `plan recover` does) gives the program, and\n"
        "the traces' collectives, copies, per-unit compute and optimizer step join its ops by\n"
        "unit, phase, kind, micro-batch and order (`trace diff` shows that join).";
    s.options = {
        {"--trace", "FILE|DIR",
         "measured trace from `shardscope run --trace`, or PyTorch profiler traces of an FSDP2 "
         "job (a file per rank or their folder; with --model)",
         "", true, "-t"},
        {"--cluster", "FILE", "cluster JSON to start from", "", true, "-c"},
        {"--output", "FILE", "where to write the calibrated cluster JSON", "", true, "-o"},
        {"--model", "FILE",
         "model (default: the one the trace records; required for PyTorch traces)", "", false,
         "-m"},
        {"--param-dtype", "DTYPE", "PyTorch traces: parameter dtype for Hugging Face configs",
         "float32"},
        {"--activation-dtype", "DTYPE", "PyTorch traces: activation dtype for Hugging Face configs",
         "float32"},
        {"--plan", "FILE",
         "plan (default: the one the trace records, or recovered from PyTorch traces)", "", false,
         "-p"},
        {"--json", "", "print a machine summary"}};
    s.examples = {
        "shardscope run -m samples/models/tiny-llama/config.json -p "
        "samples/plans/tiny-llama-2rank.json --trace measured.json",
        "shardscope calibrate -t measured.json -c samples/clusters/cpu-2core.json -o "
        "cpu-calibrated.json"};
    return {{s, runCalibrate}};
}

}  // namespace shardscope::cli
