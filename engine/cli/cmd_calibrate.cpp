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

namespace {

// What a kernel fit was made from, for its report and the cluster it writes.
struct KernelFitInputs {
    std::vector<std::string> inputs;  // traces, or the measurement's file
    std::string source;               // for "sources" and errors
    std::string baseLabel;            // the starting cluster, as the user knows it
    std::string clusterName;          // the written cluster's name
    std::string headline;             // the report's first line
    // --step-ms: the run's step time without the profiler (ns), and the simulated step of the
    // run's model and plan on a cluster; the fit's profiler_ns_per_event makes them equal.
    double targetStepNs = 0;
    std::function<double(const ClusterSpec&)> simulatedStepNs;
};

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

// `calibrate --measure`: microbenchmarks of this machine (shardscope-engine measure on local
// ranks), fitted like a trace's kernels, from --cluster or from a cluster made of what was
// measured (the best GEMM rate per dtype as the peak, the best copy rate as the memory
// bandwidth, the local ranks as one node).
int runCalibrateMeasure(const Args& a) {
    const std::string device = a.has("--device") ? a.get("--device") : "cpu";
    if (device != "cpu" && device != "cuda") {
        std::cerr << "error: --device: expected cpu or cuda, got \"" << device << "\"\n";
        return kExitUsage;
    }
    std::vector<int64_t> ints;
    if (!readIntOptions(a, {"--nproc", "--threads", "--reps", "--timeout-s"}, {1, 1, 2, 1}, ints))
        return kExitUsage;
    const int64_t nproc = ints[0] ? ints[0] : device == "cuda" ? 1 : 2;
    const auto rankThreads = threadsPerRank(nproc, ints[1]);
    if (!rankThreads) {
        std::cerr << "error: " << rankThreads.error() << "\n";
        return kExitUsage;
    }
    const int64_t threads = *rankThreads;
    std::optional<ClusterSpec> given;
    if (a.has("--cluster")) {
        auto c = loadClusterNamed(a.get("--cluster"));
        if (failed(c)) return kExitUsage;
        given = std::move(*c);
    }
    auto engine = findEngine();
    if (failed(engine)) return kExitFailed;
    auto dir = makeRunFolder("shardscope-measure");
    if (failed(dir)) return kExitFailed;
    const int64_t timeoutS = ints[3] ? ints[3] : 300;
    std::vector<std::string> args{engine->string(), "measure",
                                  "--device",       device,
                                  "--threads",      std::to_string(threads),
                                  "--reps",         std::to_string(ints[2] ? ints[2] : 4),
                                  "--timeout-s",    std::to_string(timeoutS)};
    if (a.flag("--quick")) args.push_back("--quick");
    std::cerr << "shardscope calibrate --measure: " << nproc << " rank" << (nproc > 1 ? "s" : "")
              << " on " << (device == "cuda" ? "cuda:0.." : "this CPU") << ", " << threads
              << " thread" << (threads > 1 ? "s" : "") << " each; logs in " << dir->string()
              << "\n";
    if (const int rc =
            launchLocalRanks(args, nproc, *dir, timeoutS, "shardscope calibrate --measure");
        rc != 0)
        return rc;
    const std::string file = (*dir / "rank0.json").string();
    std::ifstream inFile(file);
    const auto m = nlohmann::json::parse(inFile, nullptr, false);
    if (m.is_discarded() || !m.is_object() || !m.contains("samples") || !m["samples"].is_array()) {
        std::cerr << "error: " << file << ": the measurement is not readable JSON with samples\n";
        return kExitFailed;
    }
    KernelSamples samples;
    std::map<DType, double> bestFlops;
    double bestBytes = 0;
    for (const auto& j : m["samples"]) {
        KernelSample k;
        const std::string cls = j.value("class", "");
        k.cls = cls == "gemm"           ? KernelClass::Gemm
                : cls == "memory-bound" ? KernelClass::MemoryBound
                : cls == "collective"   ? KernelClass::Collective
                : cls == "attention"    ? KernelClass::Attention
                                        : KernelClass::Other;
        k.step = j.value("step", 0);
        k.durNs = j.value("dur_ns", int64_t{0});
        k.flops = j.value("flops", 0.0);
        k.bytes = j.value("bytes", 0.0);
        k.groupSize = j.value("group_size", 0);
        k.collective = j.value("collective", "");
        k.op = k.kernel = j.value("op", "");
        if (auto d = parseDType(j.value("dtype", "float32")); d) k.dtype = *d;
        // A GEMM's [M, N, K] (shardscope-engine measure writes them): its shape's own
        // efficiency is fitted, as a trace's are (gemm_efficiency_by_shape). Without them a
        // CPU whose bf16 and fp32 GEMMs scale differently by size (AMX on a Xeon: small bf16
        // GEMMs at a tenth of its peak, fp32 at a third) had both priced by one curve.
        if (const auto sh = j.find("shape");
            k.cls == KernelClass::Gemm && sh != j.end() && sh->is_array() && sh->size() == 3 &&
            std::all_of(sh->begin(), sh->end(), [](const nlohmann::json& x) {
                return x.is_number_integer() && x.get<int64_t>() > 0;
            })) {
            k.m = (*sh)[0].get<int64_t>();
            k.n = (*sh)[1].get<int64_t>();
            k.k = (*sh)[2].get<int64_t>();
        }
        if (k.durNs <= 0) continue;
        const double secs = static_cast<double>(k.durNs) * 1e-9;
        if (k.cls == KernelClass::Gemm)
            bestFlops[k.dtype] = std::max(bestFlops[k.dtype], k.flops / secs);
        if (k.cls == KernelClass::MemoryBound) bestBytes = std::max(bestBytes, k.bytes / secs);
        samples.samples.push_back(std::move(k));
    }
    const auto& dj = m.value("device", nlohmann::json::object());
    const std::string deviceName = dj.value("name", std::string("this machine"));
    const std::string when =
        "measured by `shardscope calibrate --measure` (" + std::to_string(nproc) + " local ranks)";
    ClusterSpec base;
    if (given) {
        base = *given;
        if (!sameDevice(deviceName, base.device.name))
            std::cerr << "warning: measured " << deviceName << ", and " << a.get("--cluster")
                      << " describes " << base.device.name << "\n";
    } else {
        if (bestFlops.empty() || bestBytes <= 0) {
            std::cerr << "error: " << file
                      << ": no GEMM or copy was measured; nothing to make a cluster from\n";
            return kExitFailed;
        }
        base.name = "this machine: " + deviceName + " x " + std::to_string(nproc);
        base.nodes = 1;
        base.device.name = deviceName;
        base.device.kind = dj.value("kind", std::string("cpu")) == "gpu" ? "gpu" : "cpu";
        base.device.memoryBytes = dj.value("memory_bytes", int64_t{0});
        base.device.peakFlops = bestFlops;
        base.device.hbmBandwidth = bestBytes;
        base.node.devicesPerNode = nproc;
        // Placeholders the collective fit replaces (one node: the network is not used).
        base.node.intraBandwidth = bestBytes;
        base.network.nicBandwidth = bestBytes;
        base.host.linkBandwidth = bestBytes;
        for (const char* f : {"/device/peak_flops", "/device/hbm_bandwidth_bytes_per_s",
                              "/device/memory_bytes", "/node/devices_per_node"})
            base.sources[f] =
                when + (std::string(f) == "/device/peak_flops" ? ": the best GEMM rate per dtype"
                        : std::string(f) == "/device/hbm_bandwidth_bytes_per_s"
                            ? ": the best copy or add rate"
                            : "");
        base.sources["/network/nic_bandwidth_bytes_per_s"] =
            "not measured (one node): the memory bandwidth as a placeholder";
        base.sources["/host/link_bandwidth_bytes_per_s"] =
            "not measured: the memory bandwidth as a placeholder";
    }
    std::cerr << "measured " << samples.samples.size() << " points on " << deviceName
              << "; launching one tiny op costs " << static_cast<int64_t>(m.value("launch_ns", 0.0))
              << " ns\n";
    KernelFitInputs in;
    in.inputs = {file};
    in.source = when + " on " + deviceName;
    in.baseLabel = given ? a.get("--cluster") : "the measured peaks";
    in.clusterName = given ? given->name + ", calibrated on this machine" : base.name;
    in.headline = "Measured " + deviceName + " (" + std::to_string(nproc) + " rank" +
                  (nproc > 1 ? "s" : "") + ", " + std::to_string(threads) + " thread" +
                  (threads > 1 ? "s" : "") + " each)";
    const int rc = finishKernelCalibration(a, samples, base, in);
    if (rc == kExitOk) {
        std::error_code ec;
        std::filesystem::remove_all(*dir, ec);
    }
    return rc;
}

// The program op each trace op is (joinOpIds: by id, or for a trace of an earlier version
// of the program, one with ops this one lacks, by unit, phase, kind and order); -1 where
// there is none. Whether the ids had to be joined by key.
std::vector<int32_t> programIdsOf(const std::vector<TraceOp>& ops, const StepProgram& p,
                                  const ResolvedPlan& r, bool& byKey) {
    std::map<int64_t, OpKey> traceKeys, programKeys;
    for (const TraceOp& op : ops)
        if (op.opId >= 0)
            traceKeys.emplace(op.opId,
                              OpKey{op.unit, op.phase, op.kind ? opKindName(*op.kind) : ""});
    for (size_t i = 0; i < p.ops.size(); ++i) {
        const Op& op = p.ops[i];
        programKeys[static_cast<int64_t>(i)] =
            OpKey{r.units[op.unit.index()].name, phaseName(op.phase), opKindName(op.kind)};
    }
    const OpJoin join = joinOpIds(traceKeys, programKeys);
    byKey = join.byKey;
    std::vector<int32_t> ids;
    ids.reserve(ops.size());
    for (const TraceOp& op : ops) {
        auto it = join.toOf.find(op.opId);
        ids.push_back(it == join.toOf.end() ? -1 : static_cast<int32_t>(it->second));
    }
    return ids;
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
    const std::vector<int32_t> ids = programIdsOf(measured->ops, prog, r, byKey);
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
    printCurve(fit->cluster.sim.computeEfficiency, "FLOP");
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
