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
#include "engine/measure/fsdp_join.h"
#include "engine/sim/simulator.h"
#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "plans/plan/resolve.h"
#include "profiler/analysis/fsdp_trace.h"
#include "profiler/analysis/trace_loader.h"

namespace shardscope::cli {

namespace {

struct RankAnalysis {
    std::string path;
    int64_t rank = 0;
    FsdpTraceAnalysis a;
};

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

std::string msOrDash(double ns, bool any) {
    return any ? formatMs(ns) : "-";
}

// Per unit, averaged over ranks (units matched by name).
struct UnitRow {
    const FsdpUnit* first = nullptr;
    double fwdAg = 0, fwdAgExp = 0, bwdAg = 0, bwdAgExp = 0, rs = 0, rsExp = 0, ar = 0, arExp = 0;
    double fwdWait = 0, bwdWait = 0;  // waiting for a peer (fillPeerWaits)
    int64_t fwdAgs = 0, bwdAgs = 0, rss = 0, ars = 0;
    int32_t fwdMin = INT32_MAX, fwdMax = INT32_MIN, bwdMin = INT32_MAX, bwdMax = INT32_MIN;
};

}  // namespace

namespace {
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
