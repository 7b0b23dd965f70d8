// SPDX-License-Identifier: Apache-2.0
// `shardscope calibrate`: fit a cluster's simulator parameters to a measured run and print
// the simulation error before and after.
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

// Fits, writes the cluster (and --samples), and prints the held-back table (or --json).
int finishKernelCalibration(const Args& a, const KernelSamples& samples, const ClusterSpec& base,
                            const KernelFitInputs& in) {
    auto fit = fitKernels(samples, base, in.source);
    if (!fit) {
        std::cerr << "error: " << fit.error() << "\n";
        for (const auto& [why, n] : samples.skipped)
            std::cerr << "  skipped " << n << ": " << why << "\n";
        return kExitFailed;
    }
    ProfilerFit pf;
    if (in.targetStepNs > 0 && in.simulatedStepNs) {
        pf = fitProfilerOverhead(*fit, in.targetStepNs, in.simulatedStepNs);
        if (!pf.note.empty()) fit->notes.push_back(pf.note);
    }
    fit->cluster.sources.erase("/sim");
    fit->cluster.name = in.clusterName;
    if (auto check = clusterFromJson(clusterToJson(fit->cluster), a.get("--output")); !check) {
        std::cerr << "error: the calibrated cluster does not validate: " << check.error() << "\n";
        return kExitFailed;
    }
    if (Status w =
            writeFileAtomically(a.get("--output"), clusterToJson(fit->cluster).dump(2) + "\n");
        !w) {
        std::cerr << "error: " << w.error() << "\n";
        return kExitUsage;
    }
    if (a.has("--samples"))
        if (Status w =
                writeFileAtomically(a.get("--samples"), kernelSamplesCsv(samples, *fit, base));
            !w) {
            std::cerr << "error: " << w.error() << "\n";
            return kExitUsage;
        }
    if (a.flag("--json")) {
        const nlohmann::json out = kernelFitJson(
            *fit, samples, pf, {in.inputs, in.baseLabel, a.get("--output"), in.targetStepNs});
        return emitJson(out, "").ok() ? kExitOk : kExitUsage;
    }
    printKernelFit(*fit, samples, pf, in.headline, in.baseLabel, in.targetStepNs);
    std::cout << "\nWrote " << a.get("--output") << "\n";
    return kExitOk;
}

// Whether the resolved plan has errors; they are printed, then the verdict.
bool reportPlanErrors(const ResolvedPlan& r) {
    if (!r.hasErrors()) return false;
    for (const auto& pr : r.problems)
        std::cerr << pr.toString() << "\n";
    std::cerr << "error: the plan has errors\n";
    return true;
}

namespace {

// `calibrate --from-trace`: the cluster fitted to the kernels of real profiler traces.
int runCalibrateFromTrace(const Args& a) {
    std::vector<std::string> traces{a.get("--from-trace")};
    for (const auto& p : a.positionals())
        traces.push_back(p);
    auto c = loadClusterNamed(a.get("--cluster"));
    if (failed(c)) return kExitUsage;
    const ClusterSpec base = std::move(*c);
    KinetoImportOptions o = traceImportOptions();
    o.keepAllOpInputs = true;
    // With the model and the plan that ran, the optimizer's foreach kernels are sized by the
    // parameters each rank's AdamW steps (a trace does not size them: record_shapes gives a
    // TensorList's dims as []) and get a curve of their own.
    KernelSampleOptions so;
    double targetStepNs = 0;
    if (a.has("--step-ms")) {
        const std::string v = a.get("--step-ms");
        try {
            size_t used = 0;
            targetStepNs = std::stod(v, &used) * 1e6;
            if (used != v.size() || !(targetStepNs > 0) || targetStepNs > 1e13)
                throw std::invalid_argument("range");
        } catch (const std::exception&) {
            std::cerr << "error: --step-ms: expected the step's milliseconds (a positive number), "
                         "got \""
                      << v << "\"\n";
            return kExitUsage;
        }
        if (!a.has("--model") || !a.has("--plan")) {
            std::cerr << "error: --step-ms needs --model and --plan: the run's step is simulated "
                         "to fit the profiler's share of the host's time\n";
            return kExitUsage;
        }
    }
    std::shared_ptr<const ModelGraph> stepModel;
    std::optional<Plan> stepPlan;
    if (a.has("--model") != a.has("--plan")) {
        std::cerr << "error: --from-trace takes --model and --plan together (the model and plan "
                     "that ran size the optimizer's foreach kernels)\n";
        return kExitUsage;
    }
    if (a.has("--model")) {
        auto model = loadModelArg(a);
        if (failed(model)) return kExitUsage;
        auto plan = loadPlanFile(a.get("--plan"));
        if (failed(plan)) return kExitUsage;
        const ResolvedPlan r = resolvePlan(*model, *plan, &base, a.get("--plan"));
        if (reportPlanErrors(r)) return kExitFailed;
        so.optimizerParamBytes = static_cast<double>(r.optimizerForeach.bytes);
        if (!a.flag("--json"))
            std::cerr << "optimizer: AdamW's foreach kernels sized by "
                      << formatBytes(r.optimizerForeach.bytes) << " of parameters a rank ("
                      << a.get("--model") << ", " << a.get("--plan") << ")\n";
        // For --step-ms (r points into the model: nothing of r is used past here).
        stepModel = std::make_shared<const ModelGraph>(std::move(*model));
        stepPlan = std::move(*plan);
    }
    KernelSamples samples;
    std::vector<std::string> names, skippedFiles;
    int32_t index = 0;
    const bool json = a.flag("--json");
    const Status st = forEachTrace(
        traces, o,
        [&](const std::string& path, Trace&& t) -> Status {
            const size_t before = samples.samples.size();
            collectKernelSamples(t, index++, samples, so);
            names.push_back(path);
            if (!json)
                std::cerr << "read " << path << ": rank " << t.rank << ", "
                          << (samples.samples.size() - before) << " kernels priced\n";
            return {};
        },
        &skippedFiles);
    if (!st) {
        std::cerr << "error: " << st.error() << "\n";
        return kExitUsage;
    }
    for (const auto& s : skippedFiles)
        std::cerr << "skipped " << s << "\n";
    std::string source =
        names.size() == 1 ? names.front()
                          : std::to_string(names.size()) + " traces (" + names.front() + ", ...)";
    if (!samples.hasShapes && samples.deviceKernels > 0)
        std::cerr << "note: " << source
                  << " was recorded without record_shapes: GEMM FLOPs and kernel bytes are "
                     "unknown, only collectives can be fitted (record with "
                     "torch.profiler.profile(record_shapes=True))\n";
    for (const auto& d : samples.deviceNames)
        if (!sameDevice(d, base.device.name))
            std::cerr << "warning: the trace ran on " << d << ", and " << a.get("--cluster")
                      << " describes " << base.device.name
                      << ": efficiencies are fractions of that cluster's peaks, so start from a "
                         "cluster of the GPU that ran the trace\n";
    KernelFitInputs in;
    in.inputs = names;
    in.source = source;
    in.baseLabel = a.get("--cluster");
    in.clusterName =
        base.name + ", calibrated on " + std::filesystem::path(names.front()).filename().string();
    in.headline = "Calibrated " + a.get("--cluster") + " from the kernels of " + source +
                  (samples.hostOnly ? " (CPU only: host ops are the kernels)" : "");
    if (targetStepNs > 0) {
        in.targetStepNs = targetStepNs;
        const std::string planFile = a.get("--plan");
        // The plan is resolved and its program built once, on the first cluster it sees (the
        // fitted one): the search only changes the launch rates, which the program does not
        // depend on.
        struct Built {
            int64_t worldSize = 0;
            StepProgram program;
        };
        auto built = std::make_shared<std::optional<Built>>();
        in.simulatedStepNs = [stepModel, stepPlan, planFile, built](const ClusterSpec& c) {
            if (!*built) {
                const ResolvedPlan r = resolvePlan(*stepModel, *stepPlan, &c, planFile);
                *built = Built{r.worldSize, buildStepProgram(r, stepOptionsFor(*stepPlan, c))};
            }
            const Built& b = **built;
            return static_cast<double>(simulate(b.program, c, b.worldSize).stepNs);
        };
    }
    return finishKernelCalibration(a, samples, base, in);
}

int runCalibrate(const Args& a) {
    const int modes = a.has("--trace") + a.has("--from-trace") + a.flag("--measure");
    if (modes != 1) {
        std::cerr << "error: give one of --trace (a measured run, fitted op by op), --from-trace "
                     "(kernels of any profiler trace) or --measure (microbenchmarks of this "
                     "machine), not "
                  << (modes ? "several" : "none") << " (see: shardscope calibrate --help)\n";
        return kExitUsage;
    }
    if (a.flag("--measure")) return runCalibrateMeasure(a);
    if (!a.has("--cluster")) {
        std::cerr << "error: --cluster FILE is required with --trace and --from-trace (the "
                     "cluster to start from)\n";
        return kExitUsage;
    }
    if (a.has("--from-trace")) return runCalibrateFromTrace(a);
    return runCalibrateOpByOp(a);
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
        "unit, phase, kind, micro-batch and order (`trace diff` shows that join).\n\n"
        "--from-trace fits to the kernels of any real profiler trace instead (a GPU job's, or a\n"
        "CPU-only one's whose host ops are the kernels; no model or plan needed): GEMM kernels\n"
        "take their FLOPs from the launching matmul op's shapes (record_shapes=True), memory-\n"
        "bound kernels their bytes from the launching op's inputs, NCCL kernels their size and\n"
        "group from their args. It fits the compute-efficiency curve, the memory efficiency and\n"
        "the collectives' latency and bus bandwidth on half of the ProfilerSteps, and prints\n"
        "each class's error on the other half, with the starting cluster and the fitted one.\n"
        "What it cannot price (no shapes, convolutions, broadcasts) is counted and named.\n"
        "It also reads the host's side: each thread's time per kernel launch (the model's for\n"
        "the forward, autograd's for the backward), and FSDP2's reduce-scatter copy-in's block\n"
        "table (torch._chunk_cat). Those are the profiled run's pace; with the model, the plan\n"
        "and the run's step time without the profiler (--step-ms, from its training log) it\n"
        "fits the profiler's share and takes it out, and a cluster carrying that share\n"
        "(profiler_ns_per_event) has it taken out of every later calibration.\n\n"
        "--measure runs short microbenchmarks on this machine's devices instead (shardscope-\n"
        "engine measure on --nproc local ranks: GEMMs by size and dtype, copies and adds by\n"
        "bytes, causal attention, the cost of one tiny op, and all-gather, reduce-scatter and\n"
        "all-reduce by size over the ranks) and fits them the same way. Without --cluster the\n"
        "cluster is made from the measurement: the best GEMM rate per dtype is the peak, the\n"
        "best copy rate the memory bandwidth, the local ranks one node.";
    s.options = {
        {"--trace", "FILE|DIR",
         "measured trace from `shardscope run --trace`, or PyTorch profiler traces of an FSDP2 "
         "job (a file per rank or their folder; with --model)",
         "", false, "-t"},
        {"--from-trace", "FILE|DIR",
         "fit to the kernels of real profiler traces instead (GPU or CPU, any job; more traces "
         "may follow as arguments): GEMMs, memory-bound kernels and collectives, with the "
         "error on held-back steps"},
        {"--step-ms", "MS",
         "--from-trace with --model and --plan: the same run's step time without the profiler "
         "(from its training log); fits profiler_ns_per_event, the host time the profiler added "
         "per event it recorded, so that the simulated step equals it"},
        {"--samples", "CSV",
         "--from-trace: also write every priced kernel (class, op, FLOPs or bytes, measured, "
         "predicted before and after) as CSV"},
        {"--measure", "",
         "fit to microbenchmarks of this machine instead: GEMMs by size and dtype, copies, "
         "attention, launch cost, and collectives over --nproc local ranks (Gloo on CPU, NCCL "
         "with --device cuda); without --cluster the cluster is made from what was measured"},
        {"--device", "cpu|cuda", "--measure: what to measure", "cpu"},
        {"--nproc", "N", "--measure: local ranks for the collective sweep [2 on CPU, 1 on CUDA]"},
        {"--threads", "N", "--measure: threads per rank [cores / ranks]"},
        {"--reps", "N", "--measure: times each point is measured, as that many steps", "4"},
        {"--quick", "", "--measure: fewer, smaller points (a few seconds on a CPU)"},
        {"--timeout-s", "S", "--measure: how long a rank waits for the others", "300"},
        {"--cluster", "FILE", "cluster JSON to start from (required with --trace and --from-trace)",
         "", false, "-c"},
        {"--output", "FILE", "where to write the calibrated cluster JSON", "", true, "-o"},
        {"--model", "FILE",
         "model (default: the one the trace records; required for PyTorch traces; with "
         "--from-trace and --plan: sizes the optimizer's foreach kernels)",
         "", false, "-m"},
        {"--param-dtype", "DTYPE", "PyTorch traces: parameter dtype for Hugging Face configs",
         "float32"},
        {"--activation-dtype", "DTYPE", "PyTorch traces: activation dtype for Hugging Face configs",
         "float32"},
        {"--plan", "FILE",
         "plan (default: the one the trace records, or recovered from PyTorch traces; with "
         "--from-trace and --model: sizes the optimizer's foreach kernels)",
         "", false, "-p"},
        {"--json", "", "print a machine summary"}};
    s.examples = {
        "shardscope run -m samples/models/tiny-llama/config.json -p "
        "samples/plans/tiny-llama-2rank.json --trace measured.json",
        "shardscope calibrate -t measured.json -c samples/clusters/cpu-2core.json -o "
        "cpu-calibrated.json",
        "shardscope calibrate --from-trace rank0.pt.trace.json.gz -c "
        "samples/clusters/a100-80gb-8x8.json -o a100-fitted.json",
        "shardscope calibrate --from-trace rank0.pt.trace.json.gz -c "
        "samples/clusters/h200-8x8.json "
        "-m config.json -p plan.json --step-ms 83.8 -o h200-fitted.json",
        "shardscope calibrate --measure -o this-machine.json",
        "shardscope calibrate --measure --device cuda --nproc 8 -c "
        "samples/clusters/h100-sxm-8x8.json "
        "-o h100-measured.json"};
    s.positionalsMetavar = "[TRACE...]";
    return {{s, runCalibrate}};
}

}  // namespace shardscope::cli
