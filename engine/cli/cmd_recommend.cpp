// SPDX-License-Identifier: Apache-2.0
// `shardscope recommend`: search the plan space with the simulator and export the best plan.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <optional>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/recommend_options.h"
#include "engine/cli/recommend_report.h"
#include "engine/schedule/step_program.h"
#include "engine/search/search.h"
#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "plans/plan/export.h"
#include "plans/plan/plan_json.h"
#include "plans/plan/resolve.h"

namespace shardscope::cli {

namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void onSigint(int) {
    g_interrupted.store(true);
}

// The plan the user runs now (--current, e.g. `plan recover` of their trace): its sequence
// length, global batch and reduce precision are the search's unless given. Resolved before
// the search, so that a plan with errors stops it from starting. False (said) on an error.
bool readCurrentPlan(const Args& a, const ModelGraph& g, const ClusterSpec& cluster,
                     const FixedChoices& fixed, SearchOptions& o, std::optional<Plan>& current,
                     std::optional<ResolvedPlan>& currentResolved) {
    // The plan the user runs now (e.g. `plan recover` of their trace): its sequence length
    // and global batch are the search's unless given, and it is simulated beside the best.
    if (a.has("--current")) {
        auto p = loadPlanFile(a.get("--current"));
        if (failed(p, "--current: ")) return false;
        current = std::move(*p);
    }
    o.seqLen = current && current->seqLen > 0 ? current->seqLen : 8192;
    // A model that cannot run past its positions (ModelGraph::positionLimit) is searched at that
    // length unless told otherwise.
    const bool bounded = g.learnedPositions && g.maxPositions > 0;
    if (bounded && !current && o.seqLen > g.maxPositions) o.seqLen = g.maxPositions;
    if (a.has("--seq")) {
        auto seq = a.getInt("--seq", 1);
        if (failed(seq)) return false;
        o.seqLen = *seq;
        if (bounded && o.seqLen > g.maxPositions) {
            std::cerr << "error: --seq " << o.seqLen << " exceeds the model's " << g.maxPositions
                      << " positions (" << g.positionLimit << ")\n";
            return false;
        }
    }
    // Resolved before the search, so that a plan with errors stops it from starting.
    if (current) {
        current->seqLen = o.seqLen;
        currentResolved = resolvePlan(g, *current, &cluster, a.get("--current"));
        if (currentResolved->hasErrors()) {
            for (const auto& pr : currentResolved->problems)
                std::cerr << pr.toString() << "\n";
            std::cerr << "error: --current: the plan has errors on this model and cluster\n";
            return false;
        }
        if (!a.has("--global-batch"))
            o.globalBatch =
                current->microBatchSize * current->microBatches * currentResolved->worldSize;
        // The reduce precision the user trains with now is kept unless --fix says otherwise.
        if (!fixed.reduceDtype)
            for (const auto& u : currentResolved->units)
                if (!u.isRoot && !u.params.empty()) {
                    o.reduceDtypes = {u.reduceDtype};
                    break;
                }
    }
    return true;
}

// --global-batch, --memory-headroom and what the fixed choices need of them. False (said)
// on an error.
bool readBatchOptions(const Args& a, const ClusterSpec& cluster, SearchOptions& o) {
    if (a.has("--global-batch")) {
        auto gb = a.getInt("--global-batch", 1);
        if (!gb) {
            std::cerr << "error: " << gb.error() << "\n";
            return false;
        }
        o.globalBatch = *gb;
    }
    try {
        size_t used = 0;
        o.memoryHeadroom = std::stod(a.get("--memory-headroom"), &used);
        if (used != a.get("--memory-headroom").size() || o.memoryHeadroom < 0 ||
            o.memoryHeadroom >= 1)
            throw std::invalid_argument("range");
    } catch (const std::exception&) {
        std::cerr << "error: --memory-headroom: expected a fraction in [0, 1), got \""
                  << a.get("--memory-headroom") << "\"\n";
        return false;
    }
    if (o.microBatch) {
        const int64_t perRank = searchGlobalBatch(cluster, o) / cluster.worldSize();
        if (perRank % *o.microBatch != 0) {
            std::cerr << "error: --fix micro_batch=" << *o.microBatch << ": expected a divisor of "
                      << "the per-GPU batch, " << perRank << " sequences (global batch "
                      << searchGlobalBatch(cluster, o) << " over " << cluster.worldSize()
                      << " GPUs; change it with --global-batch)\n";
            return false;
        }
    }
    if (o.allowFloat8 && cluster.device.peakFlops.count(DType::Float8E4M3) == 0) {
        std::cerr << "error: --allow float8: " << cluster.device.name
                  << " has no fp8 tensor cores (its peak_flops lists no float8_e4m3fn)\n";
        return false;
    }
    return true;
}

// The search's answer as JSON (--json).
nlohmann::json recommendJson(const ModelGraph& g, const ClusterSpec& cluster,
                             const SearchOptions& o, const SearchResult& res,
                             const std::optional<Candidate>& mine, const Candidate* chosen,
                             const nlohmann::json& exported) {
    nlohmann::json pareto = nlohmann::json::array();
    for (const auto& c : res.pareto)
        pareto.push_back(candidateJson(c));
    nlohmann::json j{{"model", g.name},
                     {"cluster", cluster.name},
                     {"global_batch", res.globalBatch},
                     {"seq_len", o.seqLen},
                     {"memory_budget_bytes", res.memoryBudget},
                     {"evaluated", res.evaluated},
                     {"total", res.total},
                     {"cancelled", res.cancelled},
                     {"baseline", candidateJson(res.baseline)},
                     {"pareto", pareto}};
    if (res.best) j["best"] = candidateJson(*res.best);
    if (res.bestEager) j["best_eager"] = candidateJson(*res.bestEager);
    if (res.bestWithoutFloat8) j["best_without_float8"] = candidateJson(*res.bestWithoutFloat8);
    if (mine) j["current"] = candidateJson(*mine);
    if (res.closest) j["closest"] = candidateJson(*res.closest);
    if (chosen) j["export"] = exported;
    return j;
}

int runRecommend(const Args& a) {
    auto g = loadModelArg(a);
    if (failed(g)) return kExitUsage;
    auto cluster = loadClusterNamed(a.get("--cluster"));
    if (failed(cluster)) return kExitUsage;
    auto fmt = parseExportFormat(a.get("--format"));
    if (failed(fmt, "--format: ")) return kExitUsage;
    SearchOptions o;
    // FSDPStrategy takes FSDP1's kwargs; ModelParallelStrategy (lightning) applies FSDP2's.
    ExportFormat format = *fmt;
    o.fsdp1Compatible = format == ExportFormat::Fsdp1 || format == ExportFormat::LightningFsdp1;
    o.allowOffload = !a.flag("--no-offload");
    FixedChoices fixed;
    if (a.has("--fix")) {
        if (Status st = applyFixes(a.get("--fix"), o, fixed); !st.ok()) {
            std::cerr << "error: " << st.error() << "\n";
            return kExitUsage;
        }
        if (fixed.fsdp1 && !o.fsdp1Compatible) {
            if (a.given("--format")) {
                std::cerr << "error: --fix api=fsdp1 with --format " << a.get("--format")
                          << ": give --format fsdp1 or lightning-fsdp1 (FSDP1's own exports)\n";
                return kExitUsage;
            }
            format = ExportFormat::Fsdp1;
            o.fsdp1Compatible = true;
        }
    }
    if (a.has("--allow"))
        if (Status st = applyAllow(a.get("--allow"), o); !st.ok()) {
            std::cerr << "error: " << st.error() << "\n";
            return kExitUsage;
        }
    o.expandableSegments = a.flag("--expandable-segments");
    std::optional<Plan> current;
    std::optional<ResolvedPlan> currentResolved;
    if (!readCurrentPlan(a, *g, *cluster, fixed, o, current, currentResolved)) return kExitUsage;
    if (!readBatchOptions(a, *cluster, o)) return kExitUsage;
    if (findBlocks(*g).empty())
        std::cerr << "note: no repeated blocks found (a ModuleList of one class); searching the "
                     "other choices\n";
    std::signal(SIGINT, onSigint);
    o.cancel = &g_interrupted;
    const bool tty = ::isatty(STDERR_FILENO);
    const auto t0 = std::chrono::steady_clock::now();
    auto elapsed = [&] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    o.progress = [&](size_t done, size_t total) {
        if (!tty && done != total) return;
        const double t = elapsed();
        const double eta =
            done > 0 ? t * static_cast<double>(total - done) / static_cast<double>(done) : 0;
        const int width = 30;
        const int filled = total > 0 ? static_cast<int>(width * done / total) : width;
        std::fprintf(stderr, "\r[%s%s] %zu/%zu plans, %.1f s, ETA %.1f s   %s",
                     std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                     done, total, t, eta, done == total ? "\n" : "");
        std::fflush(stderr);
    };
    const SearchResult res = searchPlans(*g, *cluster, o);
    std::signal(SIGINT, SIG_DFL);
    if (res.cancelled)
        std::fprintf(stderr, "\ninterrupted: reporting the best of %zu plans evaluated\n",
                     res.evaluated);

    std::optional<Candidate> mine;
    if (current) {
        const ResolvedPlan& r = *currentResolved;
        Candidate c;
        c.plan = *current;
        c.summary = "the plan in " + a.get("--current");
        SimOptions so;
        so.keepTimeline = false;
        so.expandableSegments = o.expandableSegments;
        c.sim = simulate(buildStepProgram(r, stepOptionsFor(*current, *cluster)), *cluster,
                         r.worldSize, so);
        c.fits = c.sim.peakReserved <= res.memoryBudget;
        mine = std::move(c);
    }
    const Candidate* chosen = res.best ? &*res.best : res.closest ? &*res.closest : nullptr;
    nlohmann::json exported;
    if (chosen) {
        const ResolvedPlan r = resolvePlan(*g, chosen->plan, &*cluster, "recommended");
        if (const auto why = exportRefusal(r, format)) {
            std::cerr << "error: not exporting as " << a.get("--format") << ": " << *why << "\n";
            return kExitFailed;
        }
        exported = exportPlan(r, format);
        if (a.has("--output")) {
            if (Status s = writeFileAtomically(a.get("--output"), exported.dump(2) + "\n"); !s) {
                std::cerr << "error: " << s.error() << "\n";
                return kExitUsage;
            }
        }
    }
    if (a.flag("--json")) {
        if (!emitJson(recommendJson(*g, *cluster, o, res, mine, chosen, exported), "").ok())
            return kExitUsage;
        return res.best ? kExitOk : kExitFailed;
    }
    std::cout << "Recommendation for " << (g->name.empty() ? a.get("--model") : g->name) << " on "
              << cluster->name << "\n  global batch " << res.globalBatch << " sequences of "
              << o.seqLen << " tokens; memory budget " << formatBytes(res.memoryBudget) << " ("
              << static_cast<int>(100 * (1 - o.memoryHeadroom)) << "% of "
              << formatBytes(cluster->device.memoryBytes) << ")\n";
    char buf[256];
    std::snprintf(buf, sizeof buf, "  searched %zu plans in %.1f s\n\n", res.evaluated, elapsed());
    std::cout << buf;
    if (!res.best) {
        printNoPlanFits(res, o.memoryHeadroom);
        return kExitFailed;
    }
    printRecommendation(res, mine ? &*mine : nullptr, *g, *cluster);
    if (a.has("--output"))
        std::cout << "\nWrote " << a.get("--output") << " ("
                  << (format == ExportFormat::Fsdp1 && !a.given("--format") ? "fsdp1"
                                                                            : a.get("--format"))
                  << ")\n";
    else
        std::cout << "\nWrite the plan with -o FILE (--format "
                     "shardscope|fsdp2|fsdp1|lightning|lightning-fsdp1).\n";
    return kExitOk;
}

}  // namespace

std::vector<Command> recommendCommands() {
    CommandSpec s;
    s.name = "recommend";
    s.summary = "Search sharding plans with the simulator and export the fastest one that fits.";
    s.description =
        "Enumerates FSDP2 plans (blocks per unit 1/2/4, embedding and head units, 1D or HSDP\n"
        "within nodes, reshard True/False/node size, explicit prefetch depth 0-2 each way,\n"
        "bf16 parameters with an fp32 reduce (the --current plan's reduce dtype, or what --fix\n"
        "says), checkpointing none/selective/full, micro-batch with accumulation to the global\n"
        "batch; CPU offload only if nothing else fits), simulates\n"
        "each, and reports the fastest plan whose peak reserved memory fits the device with\n"
        "the headroom, against the common default (and --current, the plan you run now), with\n"
        "the Pareto front. Ctrl-C stops and reports the best found so far. Exit 1 when no plan\n"
        "fits.";
    s.options = modelOptions(true);
    s.options.push_back({"--cluster", "FILE", "cluster JSON", "", true, "-c"});
    s.options.push_back(
        {"--global-batch", "G", "sequences per optimizer step [4Mi tokens, at least one per GPU]"});
    s.options.push_back({"--seq", "S", "sequence length [8192, or the --current plan's]"});
    s.options.push_back({"--current", "PLAN",
                         "the plan you run now (e.g. from `plan recover`): simulated beside the "
                         "best; its seq_len and global batch are the search's unless given"});
    s.options.push_back({"--memory-headroom", "H", "fraction of device memory kept free", "0.1"});
    s.options.push_back({"--expandable-segments", "",
                         "model the caching allocator with expandable segments "
                         "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"});
    s.options.push_back({"--format", "FMT",
                         "export format: shardscope, fsdp2, fsdp1, lightning, lightning-fsdp1",
                         "shardscope", false, "-f"});
    s.options.push_back({"--fix", "KEY=VALUE,...",
                         "choices the search keeps: reduce_dtype=float32|bfloat16 (default: "
                         "float32, or the --current plan's), api=fsdp1, "
                         "activation_checkpointing=none|full|selective_op, micro_batch=N"});
    s.options.push_back({"--no-offload", "", "never propose CPU offload, even when nothing fits"});
    s.options.push_back({"--allow", "OPTIONS",
                         "also search options that change numerics or need a compiler: compile "
                         "(torch.compile per block), float8 (torchao tensorwise with float8 "
                         "all-gather; fp8 devices); FSDP2 only; says what each buys"});
    s.options.push_back({"--output", "FILE", "write the recommended plan here", "", false, "-o"});
    s.options.push_back({"--json", "", "print the report as JSON (with the exported plan)"});
    s.examples = {
        "shardscope recommend -m samples/models/llama3-8b/config.json -c "
        "samples/clusters/h100-sxm-8x8.json "
        "-f fsdp2 -o plan.fsdp2.json",
        "shardscope plan recover TRACES/ -m config.json -o current.json && shardscope calibrate "
        "-t TRACES/ -m config.json -c base.json -o mine.json && shardscope recommend -m "
        "config.json -c mine.json --current current.json -f fsdp2 -o better.fsdp2.json"};
    return {{s, runRecommend}};
}

}  // namespace shardscope::cli
