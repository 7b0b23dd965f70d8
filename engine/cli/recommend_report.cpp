// SPDX-License-Identifier: Apache-2.0
// The text and JSON pieces of `recommend`'s report.
#include "engine/cli/recommend_report.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>

#include "engine/cli/common.h"
#include "plans/core/strings.h"
#include "plans/plan/plan_json.h"
#include "plans/plan/resolve.h"

namespace shardscope::cli {

std::string ms(int64_t ns) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f ms", static_cast<double>(ns) * 1e-6);
    return b;
}

nlohmann::json candidateJson(const Candidate& c) {
    return {{"summary", c.summary},
            {"fits", c.fits},
            {"step_time_ns", c.sim.stepNs},
            {"tokens_per_s", c.sim.tokensPerS},
            {"mfu", c.sim.mfu},
            {"exposed_comm_ns", c.sim.exposedCommNs},
            {"peak_allocated_bytes", c.sim.peakAllocated},
            {"peak_reserved_bytes", c.sim.peakReserved},
            {"plan", planToJson(c.plan)}};
}

std::string line(const Candidate& c) {
    char b[256];
    std::snprintf(
        b, sizeof b, "step %s, %s tokens/s, MFU %.1f%%, peak reserved %s, exposed comm %s",
        ms(c.sim.stepNs).c_str(), formatCount(static_cast<int64_t>(c.sim.tokensPerS)).c_str(),
        100 * c.sim.mfu, formatBytes(c.sim.peakReserved).c_str(), ms(c.sim.exposedCommNs).c_str());
    return b;
}

void printNoPlanFits(const SearchResult& res, double headroom) {
    std::cout << "No plan fits. The plan needing least memory still needs "
              << formatBytes(res.closest ? res.closest->sim.peakReserved : 0) << ", "
              << formatBytes(res.closest ? res.closest->sim.peakReserved - res.memoryBudget : 0)
              << " over the budget:\n  " << (res.closest ? res.closest->summary : std::string("-"))
              << "\n";
    if (res.closest) {
        // What binds: the state sharded over the ranks (parameters, gradients, optimizer
        // state), which only more GPUs (or offload) shrink, or what one micro-batch adds
        // (activations and the buffers around them), which micro-batch 1 and full
        // checkpointing already minimise in this plan.
        const auto& at = res.closest->sim.atPeak;
        auto cat = [&](MemCategory c) { return at[static_cast<size_t>(c)]; };
        const int64_t state = cat(MemCategory::ShardedParams) + cat(MemCategory::Gradients) +
                              cat(MemCategory::OptimizerState);
        const int64_t perMicroBatch =
            cat(MemCategory::Activations) + cat(MemCategory::Temporaries) +
            cat(MemCategory::UnshardedParams) + cat(MemCategory::AllGatherBuffer) +
            cat(MemCategory::ReduceScatterBuffer);
        std::cout << "At its peak: parameters, gradients and optimizer state " << formatBytes(state)
                  << "; activations, temporaries and communication "
                  << "buffers " << formatBytes(perMicroBatch) << " (allocated; the rest of "
                  << "the reserved bytes is the caching allocator's).\n";
        if (state > res.memoryBudget)
            std::cout << "The sharded state alone exceeds the budget: shard over more GPUs "
                         "(it shrinks with the world size), or give less headroom "
                         "(--memory-headroom "
                      << headroom << " now).\n";
        else
            std::cout << "The sharded state fits; one micro-batch's activations do not: a "
                         "shorter sequence (--seq), more GPUs, or less headroom "
                         "(--memory-headroom "
                      << headroom << " now).\n";
    }
}

namespace {
// "Compile:    torch.compile per block buys +26.6% throughput over the fastest eager plan
// (1157.4 ms)...", or that it buys nothing when the best plan does without it (`marker`
// absent from its summary).
void printGain(const Candidate& best, const std::optional<Candidate>& without, const char* marker,
               const char* option, const char* other, const char* caveat, const char* recipe = "") {
    if (!without || without->sim.stepNs <= 0) return;
    char buf[320];
    if (best.summary.find(marker) != std::string::npos)
        std::snprintf(
            buf, sizeof buf, "%s%s buys %+.1f%% throughput over the fastest %s plan (%.1f ms)%s\n",
            option, recipe,
            100.0 *
                (static_cast<double>(without->sim.stepNs) / static_cast<double>(best.sim.stepNs) -
                 1.0),
            other, static_cast<double>(without->sim.stepNs) * 1e-6, caveat);
    else
        std::snprintf(buf, sizeof buf, "%s buys nothing here: the fastest plan is %s\n", option,
                      other);
    std::cout << buf;
}
}  // namespace

void printRecommendation(const SearchResult& res, const Candidate* mine, const ModelGraph& g,
                         const ClusterSpec& cluster) {
    char buf[256];
    const Candidate& b = *res.best;
    std::cout << "Best plan:  " << b.summary << "\n            " << line(b) << "\n";
    auto fp32Params = [](const Candidate& c) {
        const auto& mp = c.plan.defaults.mixedPrecision;
        return mp && mp->paramDtype == DType::Float32;
    };
    if (const std::vector<ModuleId> fp32 = g.keepFp32Modules(); fp32Params(b) && !fp32.empty())
        std::cout << "            fp32 parameters: \"" << g.module(fp32[0]).fqn
                  << "\" and its like compute in fp32, and FSDP1 gives every unit one "
                     "MixedPrecision (FSDP2 trains the model in bf16 with those modules as fp32 "
                     "units)\n";
    // What each allowed option buys: the best plan against the fastest one without it.
    printGain(b, res.bestEager, "compiled per block", "Compile:    torch.compile per block",
              "eager",
              "; the simulator's compile speedups run about twice the published ones "
              "(docs/profiles.md)");
    printGain(b, res.bestWithoutFloat8, "float8", "Float8:     torchao float8", "bf16", "",
              " (tensorwise, float8 all-gather)");
    const Candidate& d = res.baseline;
    std::cout << "Default:    each block a unit, reshard True (root False), implicit prefetch, "
              << (fp32Params(d) ? "fp32 params/fp32" : "bf16/fp32") << "\n            " << line(d)
              << (d.fits ? "" : "  (does not fit)") << "\n";
    if (d.fits) {
        std::snprintf(buf, sizeof buf,
                      "            the best plan is %.2fx the default's throughput\n",
                      static_cast<double>(d.sim.stepNs) / static_cast<double>(b.sim.stepNs));
        std::cout << buf;
    }
    if (mine) {
        std::cout << "Current:    " << mine->summary << "\n            " << line(*mine)
                  << (mine->fits ? "" : "  (does not fit the budget)") << "\n";
        if (mine->sim.tokensPerS > 0) {
            std::snprintf(buf, sizeof buf,
                          "            the best plan is %.2fx its throughput (tokens/s)\n",
                          b.sim.tokensPerS / mine->sim.tokensPerS);
            std::cout << buf;
        }
    }
    std::cout << "\nWhere the memory goes at the peak (allocated "
              << formatBytes(b.sim.peakAllocated) << "):\n ";
    for (int k = 0; k < static_cast<int>(MemCategory::Count); ++k)
        if (b.sim.atPeak[static_cast<size_t>(k)] > 0)
            std::cout << " " << memCategoryName(static_cast<MemCategory>(k)) << " "
                      << formatBytes(b.sim.atPeak[static_cast<size_t>(k)]) << ";";
    std::cout << "\n\nExposed communication: " << ms(b.sim.exposedCommNs) << " of "
              << ms(b.sim.commNs) << " (" << static_cast<int>(100 * (1 - b.sim.overlapRatio))
              << "% not hidden under compute)";
    {
        const ResolvedPlan r = resolvePlan(g, b.plan, &cluster, "recommended");
        std::vector<size_t> idx;
        for (size_t i = 0; i < b.sim.units.size() && i < r.units.size(); ++i)
            if (b.sim.units[i].exposedCommNs > 0) idx.push_back(i);
        std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
            return b.sim.units[x].exposedCommNs > b.sim.units[y].exposedCommNs;
        });
        for (size_t k = 0; k < std::min<size_t>(3, idx.size()); ++k) {
            const size_t u = idx[k];
            const bool ends =
                u == 0 || r.units[u].modules[0] == r.units[1 % r.units.size()].modules[0];
            const std::string why = ends ? "gathered before the first compute and reduced after "
                                           "the last: nothing to hide under"
                                         : "its collectives outlast the compute they overlap, or "
                                           "queue behind another collective of "
                                           "the same process group";
            std::cout << "\n  " << r.units[u].displayName() << ": "
                      << ms(b.sim.units[u].exposedCommNs) << " exposed (" << why << ")";
        }
    }
    std::cout << "\n";
    // The next-best alternative: the fastest Pareto point using less memory than the best.
    for (const auto& c : res.pareto)
        if (c.sim.peakReserved < b.sim.peakReserved && c.sim.stepNs > b.sim.stepNs) {
            std::snprintf(buf, sizeof buf, "%.2f%% slower for %s less peak memory",
                          100.0 * static_cast<double>(c.sim.stepNs - b.sim.stepNs) /
                              static_cast<double>(b.sim.stepNs),
                          formatBytes(b.sim.peakReserved - c.sim.peakReserved).c_str());
            std::cout << "\nNext-best alternative (" << buf << "):\n  " << c.summary << "\n";
            break;
        }
    size_t over = 0;
    for (const auto& c : res.pareto)
        over += !c.fits;
    std::cout << "\nPareto front of the plans that fit (step time vs peak reserved memory)";
    if (over > 0)
        std::cout << "; " << over << " faster point" << (over > 1 ? "s" : "")
                  << " of the front need more than " << formatBytes(res.memoryBudget)
                  << " (see --json)";
    std::cout << ":\n";
    Table t({"STEP", "PEAK RESERVED", "PLAN"}, {true, true, false});
    for (const auto& c : res.pareto)
        if (c.fits) t.row({ms(c.sim.stepNs), formatBytes(c.sim.peakReserved), c.summary});
    t.print(std::cout);
}

}  // namespace shardscope::cli
