// SPDX-License-Identifier: Apache-2.0
// A user's own PyTorch FSDP run, from its profiler traces: `trace overlap` per FSDP unit
// (when the trace is PyTorch's, not ShardScope's) and `plan recover`. The analysis lives in
// profiler/analysis (fsdp_trace.h); this file parses arguments and prints.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/fsdp_trace_cli.h"
#include "engine/cli/overlap_report.h"
#include "engine/measure/fsdp_join.h"
#include "engine/sim/simulator.h"
#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "plans/plan/resolve.h"
#include "profiler/analysis/fsdp_trace.h"
#include "profiler/analysis/trace_loader.h"

namespace shardscope::cli {

namespace {

Expected<std::vector<RankAnalysis>> analyzeAll(const std::vector<std::string>& paths,
                                               std::vector<std::string>& skipped) {
    std::vector<RankAnalysis> out;
    KinetoImportOptions o = traceImportOptions();
    const Status st = forEachTrace(
        paths, o,
        [&](const std::string& path, Trace&& t) -> Status {
            if (isShardScopeTrace(t))
                return Error{path +
                             ": a ShardScope trace among PyTorch traces; give them separately"};
            RankAnalysis r{path, t.rank, analyzeFsdp(t)};
            if (r.a.api.empty())
                return Error{path + ": " + (r.a.notes.empty() ? "no FSDP labels" : r.a.notes[0]) +
                             ". `shardscope trace summary` gives any trace's communication-"
                             "computation overlap as HTA defines it"};
            out.push_back(std::move(r));
            return {};
        },
        &skipped);
    if (!st) return Error{st.error()};
    return out;
}

}  // namespace

int runPyTorchTraceOverlap(const Args& a) {
    std::vector<std::string> skipped;
    auto ranks = analyzeAll(a.positionals(), skipped);
    for (const auto& s : skipped)
        std::cerr << "note: skipped " << s << "\n";
    if (failed(ranks)) return kExitUsage;
    std::vector<FsdpTraceAnalysis*> all;
    for (auto& r : *ranks)
        all.push_back(&r.a);
    const PeerWaitFit fit = fillPeerWaits(all);
    const bool waits = fit.matched > 0;
    std::vector<UnitRow> rows;
    std::map<std::string, size_t> rowOf;
    double stepNs = 0, comm = 0, exposed = 0, peerWait = 0;
    for (const auto& r : *ranks) {
        stepNs += r.a.stepNs;
        peerWait += static_cast<double>(r.a.peerWaitNs);
        comm += static_cast<double>(r.a.commNs);
        exposed += static_cast<double>(r.a.exposedNs);
        for (const auto& u : r.a.units) {
            addUnit(u, rows, rowOf);
        }
    }
    const auto n = static_cast<double>(ranks->size());
    const auto& first = ranks->front().a;
    if (a.flag("--json"))
        return emitJson(overlapJson(a, *ranks, rows, fit, waits, stepNs, comm, exposed, peerWait),
                        "")
                       .ok()
                   ? kExitOk
                   : kExitUsage;
    std::cout << "PyTorch " << (first.api == "fsdp2" ? "FSDP2" : "FSDP1") << " trace"
              << (ranks->size() > 1 ? "s" : "") << " of " << ranks->size() << " rank"
              << (ranks->size() > 1 ? "s" : "") << " ("
              << (first.gpu ? (first.collectives.empty() ? "GPU" : "NCCL kernels") : "Gloo")
              << "), " << first.steps << " step" << (first.steps > 1 ? "s" : "") << " of "
              << first.microBatches << " micro-batch" << (first.microBatches > 1 ? "es" : "")
              << ", step " << formatMs(stepNs / n) << "\n";
    std::cout << "per step and rank: FSDP communication " << formatMs(comm / n) << ", of it "
              << formatMs(exposed / n) << " exposed ("
              << (comm > 0 ? static_cast<int>(std::lround(100.0 * (comm - exposed) / comm)) : 0)
              << "% hidden under compute)\n";
    if (waits)
        std::cout << "of the communication, " << formatMs(peerWait / n)
                  << " a step was waiting for the last rank to arrive (PEER WAIT), not "
                     "moving data\n";
    std::cout << "\n";
    printUnitRows(rows, n, waits);
    std::cout << "\nTimes per step, averaged over ranks. DIST: how many units ahead of the unit "
                 "whose hook issued it an all-gather was (0: issued by its own pre-forward or "
                 "pre-backward, no prefetch)."
              << (waits ? " PEER WAIT: of the unit's collectives, the time before the last rank "
                          "started each (ranks' clocks aligned on the collectives' ends)."
                        : "")
              << "\n";
    for (const auto& note : first.notes)
        std::cout << "note: " << note << "\n";
    return kExitOk;
}

Expected<bool> namesPyTorchTraces(const std::vector<std::string>& traceArgs) {
    auto files = expandTraceArgs(traceArgs);
    if (!files) return Error{files.error()};
    if (files->size() > 1 || files->front().fromFolder) return true;
    auto t = importKinetoFile(files->front().path);
    if (!t) return Error{t.error()};
    return !isShardScopeTrace(*t);
}

Expected<PyTorchRun> loadPyTorchRun(const Args& a, const std::vector<std::string>& traceArgs) {
    PyTorchRun run;
    std::vector<std::string> skipped;
    const Status st = forEachTrace(
        traceArgs, traceImportOptions(),
        [&](const std::string& path, Trace&& t) -> Status {
            if (isShardScopeTrace(t))
                return Error{path +
                             ": a ShardScope trace among PyTorch traces; give them separately"};
            run.paths.push_back(path);
            run.traces.push_back(std::move(t));
            return {};
        },
        &skipped);
    for (const auto& s : skipped)
        std::cerr << "note: skipped " << s << "\n";
    if (!st) return Error{st.error()};
    if (!a.has("--model"))
        return Error{
            "--model: give the model the job trained (a Hugging Face config.json or a "
            "ShardScope model JSON): PyTorch traces do not carry it"};
    auto model = loadModelArg(a);
    if (!model) return Error{model.error()};
    run.model = std::move(*model);
    auto cluster = loadClusterArg(a);
    if (!cluster) return Error{cluster.error()};
    if (!*cluster)
        return Error{
            "--cluster: give the cluster to simulate on (samples/clusters/cpu-2core.json "
            "for a CPU run)"};
    run.cluster = std::move(**cluster);
    // Each rank's FSDP structure, once: the first recovers the plan, all join the program.
    std::vector<FsdpTraceAnalysis> analyses;
    analyses.reserve(run.traces.size());
    for (const Trace& t : run.traces)
        analyses.push_back(analyzeFsdp(t));
    const FsdpTraceAnalysis& first = analyses.front();
    if (first.api.empty())
        return Error{run.paths.front() +
                     ": no FSDP labels (FSDP::* or FullyShardedDataParallel.*)"};
    if (a.has("--plan")) {
        auto p = loadPlanFile(a.get("--plan"));
        if (!p) return Error{p.error()};
        run.plan = std::move(*p);
        run.planSource = a.get("--plan");
    } else {
        RecoveredPlan rec = recoverPlan(first, run.paths.front(), &*run.model);
        if (!rec.error.empty()) return Error{run.paths.front() + ": " + rec.error};
        run.plan = std::move(rec.plan);
        run.planSource = "recovered from " + run.paths.front();
    }
    run.resolved = resolvePlan(*run.model, run.plan, &*run.cluster, run.planSource);
    if (run.resolved->hasErrors()) {
        std::string msg = "the plan (" + run.planSource + ") has errors:";
        for (const auto& p : run.resolved->problems)
            msg += "\n  " + p.toString();
        return Error{msg};
    }
    run.program = buildStepProgram(*run.resolved, stepOptionsFor(run.plan, *run.cluster));
    std::vector<std::pair<std::string, const Trace*>> ranks;
    for (size_t i = 0; i < run.traces.size(); ++i)
        ranks.emplace_back(run.paths[i], &run.traces[i]);
    auto join = joinFsdpTraces(ranks, analyses, *run.resolved, *run.program);
    if (!join) return Error{join.error()};
    run.join = std::move(*join);
    return run;
}

int runPyTorchTraceDiff(const Args& a) {
    std::vector<std::string> traces = a.positionals();
    auto run = loadPyTorchRun(a, traces);
    if (failed(run)) return kExitUsage;
    const SimResult sim = simulate(*run->program, *run->cluster, run->resolved->worldSize);
    const TraceFile b =
        simulatedStepTrace(*run->resolved, *run->program, sim,
                           "simulation of " + run->planSource + " on " + run->cluster->name);
    if (!a.flag("--json")) {
        std::cout << "joined " << run->join->joined << " FSDP ops of " << run->traces.size()
                  << " rank trace" << (run->traces.size() > 1 ? "s" : "")
                  << " to the step program (" << run->join->traceOnly
                  << " trace ops without a program op)\n";
        for (const auto& n : run->join->notes)
            std::cout << "note: " << n << "\n";
    }
    return printTraceDiff(a, diffSideOf(run->join->file), diffSideOf(b));
}

namespace {

int runPlanRecover(const Args& a) {
    std::vector<std::string> skipped;
    auto ranks = analyzeAll(a.positionals(), skipped);
    for (const auto& s : skipped)
        std::cerr << "note: skipped " << s << "\n";
    if (failed(ranks)) return kExitUsage;
    const RankAnalysis& r0 = ranks->front();
    // Every rank runs the same plan: the units must agree.
    for (const auto& r : *ranks) {
        std::vector<std::string> x, y;
        for (const auto& u : r.a.units)
            x.push_back(u.name);
        for (const auto& u : r0.a.units)
            y.push_back(u.name);
        if (x != y) {
            std::cerr << "error: " << r.path << " and " << r0.path
                      << " show different FSDP units; give the traces of one job\n";
            return kExitUsage;
        }
    }
    std::optional<ModelGraph> model;
    if (a.has("--model")) {
        auto m = loadModelArg(a);
        if (failed(m)) return kExitUsage;
        model = std::move(*m);
    }
    RecoveredPlan rec = recoverPlan(r0.a, r0.path, model ? &*model : nullptr);
    if (!rec.error.empty()) {
        std::cerr << "error: " << r0.path << ": " << rec.error << "\n";
        return kExitUsage;
    }
    const nlohmann::json j = planToJson(rec.plan);
    // Check what we write loads back as a plan, and against the model when one is given.
    auto back = planFromJson(j, "recovered plan");
    if (failed(back, "internal: ")) return kExitUsage;
    std::vector<std::string> problems;
    if (model) {
        const ResolvedPlan resolved = resolvePlan(*model, *back, nullptr, "recovered plan");
        for (const auto& p : resolved.problems)
            problems.push_back(p.toString());
    }
    const std::string out = a.get("--output");
    if (auto st = emitJson(j, out); !st) {
        std::cerr << "error: " << st.error() << "\n";
        return kExitUsage;
    }
    std::ostream& info = out.empty() || out == "-" ? std::cerr : std::cout;
    if (!out.empty() && out != "-") info << "wrote " << out << "\n";
    info << "recovered from " << ranks->size() << " trace" << (ranks->size() > 1 ? "s" : "") << " ("
         << r0.a.units.size() << " units, " << r0.a.steps << " steps)\n";
    info << "inferred:\n";
    for (const auto& s : rec.inferred)
        info << "  " << s << "\n";
    info << "defaulted:\n";
    for (const auto& s : rec.defaulted)
        info << "  " << s << "\n";
    for (const auto& p : problems)
        info << "problem: " << p << "\n";
    return kExitOk;
}

}  // namespace

std::vector<Command> fsdpTraceCommands() {
    CommandSpec s;
    s.name = "plan recover";
    s.summary = "Recover the FSDP plan a PyTorch job ran from its profiler traces.";
    s.description =
        "Reads torch.profiler traces of an FSDP2 (fully_shard) or FSDP1 job (a file per rank, or\n"
        "their folder) and writes the plan as ShardScope plan JSON that `simulate`, `plan show`\n"
        "and `recommend` accept: the units and their order (FSDP::pre_forward labels),\n"
        "reshard_after_forward per unit (whether it all-gathers again in backward, and over\n"
        "how many ranks), explicit forward and backward prefetch lists, the mesh (HSDP when\n"
        "gradients are all-reduced after the reduce-scatter), mixed precision from the\n"
        "collectives' dtypes, micro-batches per step, and batch and sequence length from the\n"
        "embedding's input shape. It says which fields were inferred and which defaulted.\n"
        "Profile with record_shapes=True for the sizes.";
    s.positionalsMetavar = "TRACE|DIR...";
    s.options = modelOptions(false);
    s.options.front().help = "check the recovered plan against this model (optional)";
    s.options.push_back(
        {"--output", "FILE", "write the plan here (default: stdout)", "", false, "-o"});
    s.examples = {"shardscope plan recover traces/ -o recovered.json",
                  "shardscope plan recover traces/ -m config.json -o recovered.json && "
                  "shardscope simulate -m config.json -p recovered.json -c cluster.json"};
    return {{s, runPlanRecover}};
}

}  // namespace shardscope::cli
