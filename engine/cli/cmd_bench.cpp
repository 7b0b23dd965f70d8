// SPDX-License-Identifier: Apache-2.0
// `shardscope bench simulate`: speed of the simulator, printed as figures (never asserted
// in tests: these machines are shared and noisy). Measures, on one core:
//  - one step of a Llama-3-70B-shaped model (80 blocks) on 1,024 GPUs (128 nodes of 8),
//    memory model included: step program build + simulation;
//  - simulations per second over plan variants of that model (reshard, prefetch,
//    checkpointing, micro-batch), each resolved, built and simulated;
//  - how the cost grows from 8 to 8,192 GPUs and from 2 to 160 blocks.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>
#include <tuple>

#include "engine/cli/bench_cli.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/schedule/step_program.h"
#include "engine/search/search.h"
#include "engine/search/variant.h"
#include "engine/sim/simulator.h"
#include "plans/core/atomic_write.h"
#include "plans/core/json_reader.h"
#include "plans/model/model_json.h"
#include "plans/plan/resolve.h"
#include "profiler/import/kineto_import.h"
#include "profiler/import/synthetic_trace.h"

namespace shardscope::cli {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs f repeatedly for at least `budget` seconds; returns seconds per call.
template <typename F>
double timeIt(F&& f, double budget) {
    int64_t n = 0;
    const auto t0 = Clock::now();
    do {
        f();
        ++n;
    } while (secondsSince(t0) < budget);
    return secondsSince(t0) / static_cast<double>(n);
}

Plan perBlock(int64_t world) {
    Plan p;
    p.meshShape = {world};
    p.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
    p.wrap.classes = {"LlamaDecoderLayer"};
    p.defaults.mixedPrecision = MixedPrecisionSpec{DType::BFloat16, DType::Float32, {}, true};
    p.microBatchSize = 1;
    p.seqLen = 8192;
    return p;
}

volatile int64_t g_sink = 0;  // keeps results observable

// The plan variants a search tries (reshard x checkpointing x micro-batch x prefetch), as
// per-block plans of 80 blocks on 1,024 GPUs.
std::vector<Plan> benchPlanVariants() {
    std::vector<Plan> variants;
    for (int reshard = 0; reshard < 3; ++reshard)
        for (int ac = 0; ac < 3; ++ac)
            for (int64_t mbs : {1, 2})
                for (bool prefetch : {false, true}) {
                    Plan v = perBlock(1024);
                    v.defaults.reshardAfterForward = reshard == 0   ? ReshardSetting::ofBool(true)
                                                     : reshard == 1 ? ReshardSetting::ofBool(false)
                                                                    : ReshardSetting::ofInt(8);
                    v.defaults.activationCheckpointing = static_cast<AcMode>(ac);
                    v.microBatchSize = mbs;
                    if (prefetch)
                        for (int i = 0; i + 2 < 80; ++i) {
                            UnitSpec u;
                            u.modules = {"model.layers." + std::to_string(i)};
                            u.forwardPrefetch =
                                std::vector<std::string>{"model.layers." + std::to_string(i + 1),
                                                         "model.layers." + std::to_string(i + 2)};
                            v.units.push_back(u);
                        }
                    variants.push_back(std::move(v));
                }
    return variants;
}

// The same settings as variants applied to a resolved plan in place (the search's path),
// each with its micro-batch size.
std::vector<std::pair<PlanVariant, int64_t>> benchFastVariants() {
    std::vector<std::pair<PlanVariant, int64_t>> fast;
    for (int reshard = 0; reshard < 3; ++reshard)
        for (int ac = 0; ac < 3; ++ac)
            for (int64_t mbs : {1, 2})
                for (int depth : {0, 2}) {
                    PlanVariant v;
                    v.reshard = reshard == 0   ? ReshardSetting::ofBool(true)
                                : reshard == 1 ? ReshardSetting::ofBool(false)
                                               : ReshardSetting::ofInt(8);
                    v.ac = static_cast<AcMode>(ac);
                    v.forwardPrefetchDepth = depth;
                    fast.push_back({v, mbs});
                }
    return fast;
}

int runBenchSimulate(const Args& a) {
    auto cfg = readJsonFile(samplePath(a.get("--model")));
    auto base = loadClusterFile(samplePath(a.get("--cluster")));
    if (!cfg || !base) {
        std::cerr << "error: " << (!cfg ? cfg.error() : base.error()) << "\n";
        return kExitUsage;
    }
    const double budget = 0.3;
    auto model = [&](int64_t layers) {
        nlohmann::json j = *cfg;
        j["num_hidden_layers"] = layers;
        HfLoadOptions o;
        return std::move(modelFromHfConfig(j, "bench", o)).value();
    };
    auto clusterOf = [&](int64_t gpus) {
        ClusterSpec c = *base;
        c.node.devicesPerNode = std::min<int64_t>(8, gpus);
        c.nodes = gpus / c.node.devicesPerNode;
        return c;
    };
    // As the search simulates: no memory timeline, no per-op times kept.
    SimOptions quietSim;
    quietSim.keepTimeline = false;
    quietSim.keepOpTimes = false;
    // As the search does: one program rebuilt in place, its storage kept.
    StepProgram reused;
    auto oneStep = [&](const ModelGraph& g, const ClusterSpec& c, const Plan& p,
                       const ResolvedPlan& r, const SimOptions& so) {
        buildStepProgram(r, stepOptionsFor(p, c), reused);
        SimResult s = simulate(reused, c, r.worldSize, so);
        g_sink = g_sink + s.stepNs + static_cast<int64_t>(reused.ops.size());
        (void)g;
        return s;
    };

    std::printf("shardscope bench simulate (one core, %.1f s per figure; model %s)\n\n", budget,
                a.get("--model").c_str());
    const ModelGraph g80 = model(80);
    const ClusterSpec c1024 = clusterOf(1024);
    const Plan p = perBlock(1024);
    const ResolvedPlan r = resolvePlan(g80, p, &c1024, "bench");
    const StepProgram prog = buildStepProgram(r, stepOptionsFor(p, c1024));
    const double tSim = timeIt([&] { oneStep(g80, c1024, p, r, quietSim); }, budget);
    std::printf("Llama-3-70B shape (80 blocks, %zu ops per step) on 1,024 GPUs (128 nodes x 8):\n",
                prog.ops.size());
    std::printf(
        "  one step, program build + simulation + memory model: %8.1f us   (goal <= 1000 us)\n",
        tSim * 1e6);
    const double tBuild = timeIt(
        [&] {
            buildStepProgram(r, stepOptionsFor(p, c1024), reused);
            g_sink = g_sink + static_cast<int64_t>(reused.ops.size());
        },
        budget);
    const double tSimOnly = timeIt(
        [&] { g_sink = g_sink + simulate(prog, c1024, r.worldSize, quietSim).stepNs; }, budget);
    std::printf("    of which program build %.1f us, simulation with memory model %.1f us\n",
                tBuild * 1e6, tSimOnly * 1e6);
    const double tResolve = timeIt(
        [&] { g_sink = g_sink + resolvePlan(g80, p, &c1024, "bench").units.size(); }, budget);
    std::printf("  plan resolution (units, sizes, validation):          %8.1f us\n",
                tResolve * 1e6);

    // Plan variants: each is resolved, built and simulated, as a search does.
    const std::vector<Plan> variants = benchPlanVariants();
    size_t k = 0;
    const double tVariant = timeIt(
        [&] {
            const Plan& v = variants[k++ % variants.size()];
            const ResolvedPlan rv = resolvePlan(g80, v, &c1024, "bench");
            oneStep(g80, c1024, v, rv, quietSim);
        },
        budget * 2);
    std::printf(
        "  plan variants (%zu: reshard x checkpointing x micro-batch x prefetch), resolve + build "
        "+ simulate:\n"
        "    %8.0f simulations/s   (goal >= 10,000; Calculon, Python: ~600/s)\n",
        variants.size(), 1.0 / tVariant);
    // The search's fast path: settings applied to the resolved plan in place.
    const std::vector<std::pair<PlanVariant, int64_t>> fast = benchFastVariants();
    ResolvedPlan work = r;
    // One of the variants applied to the resolved plan, built and simulated.
    auto variantStep = [&](size_t i, const SimOptions& so) {
        const auto& [v, mbs] = fast[i % fast.size()];
        applyVariant(work, v);
        Plan pv = p;
        pv.microBatchSize = mbs;
        return oneStep(g80, c1024, pv, work, so);
    };
    const double tFast = timeIt([&] { variantStep(k++, quietSim); }, budget * 2);
    std::printf(
        "    %8.0f simulations/s applying the same %zu variants to the resolved plan (the search's "
        "path)\n",
        1.0 / tFast, fast.size());
    // The search also gives each simulation its memory budget (SearchOptions::memoryHeadroom
    // below the device's memory): a plan whose allocated bytes alone exceed it stops there,
    // without the caching-allocator model.
    {
        const auto memBudget = static_cast<int64_t>(static_cast<double>(c1024.device.memoryBytes) *
                                                    (1.0 - SearchOptions{}.memoryHeadroom));
        SimOptions so;
        so.keepTimeline = false;
        so.keepOpTimes = false;
        so.reservedBudget = memBudget;
        size_t over = 0;
        for (size_t i = 0; i < fast.size(); ++i)
            over += variantStep(i, so).reservedIsLowerBound;
        const double tBudget = timeIt([&] { variantStep(k++, so); }, budget * 2);
        std::printf(
            "    %8.0f simulations/s the same, with the search's memory budget (%.1f GiB: %zu of "
            "the %zu\n"
            "             variants exceed it by allocated bytes alone and skip the allocator "
            "model)\n\n",
            1.0 / tBudget, static_cast<double>(memBudget) / (1 << 30), over, fast.size());
    }

    std::printf("Cost by GPU count (80 blocks): must not grow with ranks\n  %8s %10s\n", "GPUs",
                "us/step");
    for (int64_t gpus : {8, 64, 512, 1024, 4096, 8192}) {
        const ClusterSpec c = clusterOf(gpus);
        const Plan pg = perBlock(gpus);
        const ResolvedPlan rg = resolvePlan(g80, pg, &c, "bench");
        std::printf("  %8lld %10.1f\n", static_cast<long long>(gpus),
                    1e6 * timeIt([&] { oneStep(g80, c, pg, rg, quietSim); }, budget / 3));
    }
    std::printf("\nCost by block count (1,024 GPUs)\n  %8s %8s %10s\n", "blocks", "ops", "us/step");
    for (int64_t layers : {2, 10, 20, 40, 80, 160}) {
        const ModelGraph g = model(layers);
        const ResolvedPlan rl = resolvePlan(g, p, &c1024, "bench");
        const size_t ops = buildStepProgram(rl, stepOptionsFor(p, c1024)).ops.size();
        std::printf("  %8lld %8zu %10.1f\n", static_cast<long long>(layers), ops,
                    1e6 * timeIt([&] { oneStep(g, c1024, p, rl, quietSim); }, budget / 3));
    }
    return kExitOk;
}

int runBenchRecommend(const Args& a) {
    auto cfg = readJsonFile(samplePath(a.get("--model")));
    auto base = loadClusterFile(samplePath(a.get("--cluster")));
    if (!cfg || !base) {
        std::cerr << "error: " << (!cfg ? cfg.error() : base.error()) << "\n";
        return kExitUsage;
    }
    const ModelGraph g = std::move(modelFromHfConfig(*cfg, samplePath(a.get("--model")))).value();
    std::printf(
        "shardscope bench recommend: %s, seq 8192, global batch 4Mi tokens (at least one sequence "
        "per GPU)\n\n",
        g.name.c_str());
    std::printf("  %6s %9s %9s %9s %12s %12s %14s %14s\n", "GPUs", "plans", "simulated", "seconds",
                "sims/s", "best step", "default step", "best/default");
    for (int64_t gpus : {64, 512, 4096}) {
        ClusterSpec c = *base;
        c.node.devicesPerNode = 8;
        c.nodes = gpus / 8;
        SearchOptions o;
        o.seqLen = 8192;
        const auto t0 = Clock::now();
        const SearchResult res = searchPlans(g, c, o);
        const double t = secondsSince(t0);
        const double bestMs = res.best ? static_cast<double>(res.best->sim.stepNs) * 1e-6 : 0;
        const double defMs = static_cast<double>(res.baseline.sim.stepNs) * 1e-6;
        char ratio[64];
        if (!res.best)
            std::snprintf(ratio, sizeof ratio, "nothing fits");
        else if (!res.baseline.fits)
            std::snprintf(ratio, sizeof ratio, "default OOM");
        else
            std::snprintf(ratio, sizeof ratio, "%.3fx faster", defMs / bestMs);
        std::printf("  %6lld %9zu %9zu %9.2f %12.0f %9.1f ms %11.1f ms %14s\n",
                    static_cast<long long>(gpus), res.evaluated, res.simulated, t,
                    static_cast<double>(res.simulated) / t, bestMs, defMs, ratio);
    }
    {
        ClusterSpec c = *base;
        c.node.devicesPerNode = 8;
        c.nodes = 64;
        SearchOptions o;
        o.seqLen = 8192;
        o.threads = 1;
        const auto t0 = Clock::now();
        const SearchResult res = searchPlans(g, c, o);
        const double t = secondsSince(t0);
        std::printf(
            "\n  one core, 512 GPUs: %zu plans simulated in %.2f s = %.0f simulations/s (goal >= "
            "10,000)\n",
            res.simulated, t, static_cast<double>(res.simulated) / t);
    }
    std::printf(
        "\nSample models against the common default (each block a unit, reshard True, root False,\n"
        "implicit prefetch, bf16/fp32, largest micro-batch that fits):\n");
    std::printf("  %-18s %6s %6s %12s %12s %14s\n", "model", "GPUs", "seq", "best step",
                "default step", "best/default");
    for (const auto& [m, gpus, seq] :
         std::vector<std::tuple<std::string, int64_t, int64_t>>{{"llama3-8b", 64, 4096},
                                                                {"mistral-7b-v0.1", 64, 4096},
                                                                {"qwen2-7b", 64, 2048},
                                                                {"qwen2-0.5b", 8, 4096},
                                                                {"gpt2", 8, 1024},
                                                                {"llama3-70b", 512, 2048}}) {
        auto gm = loadModelFile(samplePath("samples/models/" + m + "/config.json"));
        if (!gm) continue;
        ClusterSpec c = *base;
        c.node.devicesPerNode = 8;
        c.nodes = gpus / 8;
        SearchOptions o;
        o.seqLen = seq;
        const SearchResult res = searchPlans(*gm, c, o);
        if (!res.best) continue;
        const double b = static_cast<double>(res.best->sim.stepNs),
                     d = static_cast<double>(res.baseline.sim.stepNs);
        char ratio[64];
        if (res.baseline.fits)
            std::snprintf(ratio, sizeof ratio, "%.3fx faster", d / b);
        else
            std::snprintf(ratio, sizeof ratio, "default OOM");
        std::printf("  %-18s %6lld %6lld %9.1f ms %9.1f ms %14s\n", m.c_str(),
                    static_cast<long long>(gpus), static_cast<long long>(seq), b * 1e-6, d * 1e-6,
                    ratio);
    }
    std::printf(
        "\n(goal: <= 10 s per recommendation; %u threads; sims/s includes re-resolving each wrap "
        "structure;\n"
        " plans a smaller micro-batch already shows cannot fit are counted but not simulated)\n",
        std::max(1u, std::thread::hardware_concurrency()));
    return kExitOk;
}

}  // namespace

std::vector<Command> benchCommands() {
    CommandSpec s;
    s.name = "bench simulate";
    s.summary = "Measure simulator speed: one 80-block step on 1,024 GPUs, simulations/s, scaling.";
    s.description =
        "Prints figures; nothing is asserted. Run it alone on an idle machine and compare ratios\n"
        "measured side by side in one run.";
    s.options = {{"--model", "FILE", "Hugging Face config of the model shape",
                  "samples/models/llama3-70b/config.json"},
                 {"--cluster", "FILE", "cluster JSON (nodes are varied)",
                  "samples/clusters/h100-sxm-64x8.json"}};
    CommandSpec r;
    r.name = "bench recommend";
    r.summary = "Measure plan search: time to a recommendation on 64, 512 and 4,096 GPUs, plans/s.";
    r.description = "Prints figures; nothing is asserted.";
    r.options = s.options;
    CommandSpec im;
    im.name = "bench import";
    im.summary = "Measure trace import: MB/s and peak memory against the trace in memory.";
    im.description =
        "Generates a multi-rank PyTorch-profiler-style trace of --size-mb megabytes (kernels\n"
        "and NCCL collectives), imports it in a child process and prints the speed and the\n"
        "peak resident memory against the size of the imported trace. --file adds a trace of\n"
        "yours (.json or .json.gz). Prints figures; nothing is asserted.";
    im.options = {{"--size-mb", "N", "size of the generated trace in MB", "1000"},
                  {"--keep", "FILE", "write the generated trace here and keep it", ""},
                  {"--file", "FILE", "also measure this trace", ""}};
    CommandSpec mem;
    mem.name = "bench memory";
    mem.summary =
        "Print the memory fidelity table: simulated peaks against PyTorch's own accounting.";
    mem.description =
        "Runs tests/oracles/bench_memory.py with the set-up script's Python (SHARDSCOPE_PYTHON "
        "overrides):\n"
        "each case of the matrix (Llama-3.1-8B, Qwen2-7B, Qwen3-8B, OLMo-2-7B, Phi-4,\n"
        "Mixtral-8x7B, Qwen1.5-MoE-A2.7B, GPT-2-XL, Llama-3-70B, Gemma-2-9B, Gemma-3-1B,\n"
        "Mistral-7B-v0.1 (past their sliding windows at 8192), falcon-rw-1b (ALiBi),\n"
        "Seed-OSS-36B, Granite-3.1-8B, SmolLM3-3B, OLMo-3-7B, EXAONE-4.0-32B, OLMo-1.7-7B,\n"
        "OLMoE-1B-7B, Granite-3.1-1B-A400M, StarCoder2-7B, phi-2, Pythia-6.9B, Command R7B:\n"
        "250 cases, about 120 minutes on\n"
        "2 cores; Qwen3-30B-A3B and Qwen2-57B-A14B, about 13 minutes a case, only with\n"
        "--filter naming them;\n"
        "world 8 and 64; batch 1-2; seq 2048 and 8192; checkpointing none, full, every second\n"
        "block and op-level selective; reshard True and False; bf16/fp32 and fp32) built as the\n"
        "real Hugging Face model under FakeTensorMode, sharded with the real fully_shard on a "
        "fake\n"
        "process group, trained two steps under FSDPMemTracker, next to `simulate`. Prints\n"
        "tracker, ours and the error (goal 3%, bar 5%); exit 1 when a case is past the bar.";
    mem.options = {{"--quick", "", "one case per model and checkpointing mode (a few minutes)"},
                   {"--filter", "TEXT", "only cases whose description contains this text"},
                   {"--json", "FILE", "also write the rows to this file"}};
    mem.examples = {"shardscope bench memory --quick", "shardscope bench memory --filter mixtral"};
    return {
        {s, runBenchSimulate}, {r, runBenchRecommend}, {im, runBenchImport}, {mem, runBenchMemory}};
}

}  // namespace shardscope::cli
