// SPDX-License-Identifier: Apache-2.0
// `shardscope run`: runs a plan for real. Spawns N local ranks of `shardscope-engine
// worker` (the torchrun environment: RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), watches them, stops all of them when one fails or on Ctrl-C, and merges
// their results into one summary and one multi-rank trace. With --cluster it also
// simulates the same step and prints predicted against measured.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/launch.h"
#include "engine/cli/run_report.h"
#include "engine/measure/run_trace.h"
#include "engine/measure/step_trace.h"
#include "engine/schedule/step_program.h"
#include "engine/sim/simulator.h"
#include "plans/core/atomic_write.h"
#include "plans/core/intervals.h"
#include "plans/plan/resolve.h"
#include "profiler/record/device_activity.h"

namespace shardscope::cli {

namespace {

namespace fs = std::filesystem;

// --device, --collectives and --no-record together; false (said) when they do not go.
bool modesValid(const Args& a, const std::string& device, const std::string& collectives) {
    if (device != "cpu" && device != "cuda") {
        std::cerr << "error: --device: expected cpu or cuda, got \"" << device << "\"\n";
        return false;
    }
    if (collectives != "overlapped" && collectives != "blocking") {
        std::cerr << "error: --collectives: expected overlapped or blocking, got \"" << collectives
                  << "\"\n";
        return false;
    }
    if (device == "cuda" && collectives == "blocking") {
        std::cerr << "error: --collectives blocking is what FSDP2 does on a CPU device; on CUDA "
                     "it overlaps collectives on its streams, as the engine does by default\n";
        return false;
    }
    if (a.flag("--no-record") && (a.has("--trace") || a.has("--dump-params"))) {
        std::cerr << "error: --no-record records no ops: it cannot write --trace or "
                     "--dump-params\n";
        return false;
    }
    return true;
}

// Where the results go is checked before the run, not after it: a run's results are not
// thrown away because a folder is missing or read-only. False (said) when one cannot be.
bool outputsWritable(const Args& a) {
    for (const char* opt : {"--trace", "--output", "--dump-params"}) {
        if (!a.has(opt) || a.get(opt) == "-") continue;
        const fs::path target(a.get(opt));
        const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
        std::error_code pe;
        if (fs::is_directory(target, pe)) {
            std::cerr << "error: " << opt << " " << target.string()
                      << ": a folder, where a file is to be written\n";
            return false;
        }
        if (!fs::is_directory(parent, pe) || ::access(parent.c_str(), W_OK) != 0) {
            std::cerr << "error: " << opt << " " << target.string() << ": cannot write in "
                      << parent.string()
                      << (fs::is_directory(parent, pe) ? " (not writable)" : " (no such folder)")
                      << "; checked before the run so that its results are not lost\n";
            return false;
        }
    }
    return true;
}

int runRun(const Args& a) {
    auto g = loadModelArg(a);
    if (failed(g)) return kExitUsage;
    auto plan = loadPlanFile(a.get("--plan"));
    if (failed(plan)) return kExitUsage;
    std::optional<ClusterSpec> cluster;
    if (a.has("--cluster")) {
        auto c = loadClusterNamed(a.get("--cluster"));
        if (failed(c)) return kExitUsage;
        cluster = std::move(*c);
    }
    std::vector<int64_t> ints;
    if (!readIntOptions(a,
                        {"--nproc", "--steps", "--warmup", "--batch", "--seq", "--timeout-s",
                         "--micro-batches", "--threads"},
                        {1, 1, 0, 1, 2, 1, 1, 1}, ints))
        return kExitUsage;
    if (ints[3]) plan->microBatchSize = ints[3];
    if (ints[4]) {
        plan->seqLen = ints[4];
        plan->seqLenDefaulted = false;
    }
    if (ints[6]) plan->microBatches = ints[6];
    int64_t meshWorld = 1;
    for (int64_t d : plan->meshShape)
        meshWorld *= d;
    const int64_t nproc = ints[0] ? ints[0] : plan->meshShape.empty() ? 2 : meshWorld;
    if (plan->meshShape.empty()) {
        plan->meshShape = {nproc};
    } else if (meshWorld != nproc) {
        std::cerr << "error: " << a.get("--plan") << ":/mesh/shape: the mesh has " << meshWorld
                  << " ranks but --nproc is " << nproc << "\n";
        return kExitUsage;
    }
    const std::string device = a.has("--device") ? a.get("--device") : "cpu";
    const bool cuda = device == "cuda";
    const std::string collectives = a.has("--collectives") ? a.get("--collectives") : "overlapped";
    if (!modesValid(a, device, collectives)) return kExitUsage;
    if (!outputsWritable(a)) return kExitUsage;
    // A plan that fails validation is rejected before any process starts.
    const ResolvedPlan r = resolvePlan(*g, *plan, nullptr, a.get("--plan"));
    if (r.hasErrors()) {
        for (const auto& pr : r.problems)
            std::cerr << pr.toString() << "\n";
        std::cerr << "error: the plan has errors; nothing was started (see `shardscope plan "
                     "validate`)\n";
        return kExitFailed;
    }
    const auto rankThreads = threadsPerRank(nproc, ints[7]);
    if (!rankThreads) {
        std::cerr << "error: " << rankThreads.error() << "\n";
        return kExitUsage;
    }
    const int64_t threads = *rankThreads;
    auto eng = findEngine();
    if (failed(eng)) return kExitFailed;
    const fs::path engine = *eng;
    auto tmpDir = makeRunFolder("shardscope-run");
    if (failed(tmpDir)) return kExitFailed;
    const fs::path dir = *tmpDir;
    const int64_t timeoutS = ints[5] ? ints[5] : 60;
    const std::vector<std::string> common =
        workerCommand(a, engine, *plan, ints, timeoutS, threads, device, collectives);
    std::cerr << "shardscope run: " << nproc << " rank" << (nproc > 1 ? "s" : "")
              << " on this machine ("
              << (cuda                        ? "NCCL, rank i on cuda:i"
                  : collectives == "blocking" ? "Gloo on CPU, blocking collectives"
                                              : "Gloo on CPU")
              << "), " << threads << " thread" << (threads > 1 ? "s" : "") << " each; logs in "
              << dir.string() << "\n";

    if (const int rc = launchLocalRanks(common, nproc, dir, timeoutS, "shardscope run"); rc != 0)
        return rc;

    const auto rankResults = readRankResults(dir, nproc);
    if (!rankResults) return kExitFailed;
    const std::vector<nlohmann::json>& ranks = *rankResults;
    const RankSummary x = summarizeRanks(ranks);
    nlohmann::json out = runSummary(r, *plan, ranks, x, device, nproc, cuda);
    const nlohmann::json predicted =
        cluster ? predictRun(*g, *plan, *cluster, a.get("--plan"), nproc, x) : nlohmann::json();
    if (cluster) out["predicted"] = predicted;
    // What `calibrate` and `trace diff` need to rebuild the step program of this run.
    const nlohmann::json runInfo{{"model", fs::absolute(a.get("--model")).string()},
                                 {"plan_file", fs::absolute(a.get("--plan")).string()},
                                 {"param_dtype", a.get("--param-dtype")},
                                 {"activation_dtype", a.get("--activation-dtype")},
                                 {"world_size", nproc},
                                 {"micro_batch_size", plan->microBatchSize},
                                 {"seq_len", plan->seqLen},
                                 {"micro_batches", plan->microBatches},
                                 {"device", device}};
    // A write that fails (a full disk, a folder removed during the run) loses nothing: the
    // results still print, the ranks' records stay in the run folder when the merged trace
    // could not be written, and the run exits 1 naming what was not written.
    std::vector<std::string> writeErrors;
    bool keepRunFolder = false;
    if (a.has("--trace")) {
        if (Status st = writeFileAtomically(a.get("--trace"),
                                            mergedTrace(ranks, r.plan.name, runInfo).dump() + "\n");
            !st) {
            writeErrors.push_back("--trace " + st.error() + "; the ranks' records are kept in " +
                                  dir.string());
            keepRunFolder = true;
        } else {
            std::cerr << "wrote " << a.get("--trace") << " (" << nproc
                      << " ranks; open in https://ui.perfetto.dev or shardscope-gui)\n";
        }
    }
    std::error_code ec;
    if (!keepRunFolder) fs::remove_all(dir, ec);
    if (a.has("--output")) {
        if (Status st = emitJson(out, a.get("--output")); !st)
            writeErrors.push_back("--output " + st.error());
        else
            std::cerr << "wrote " << a.get("--output") << "\n";
    }
    const auto finish = [&](int code) {
        for (const auto& e : writeErrors)
            std::cerr << "error: " << e << "\n";
        return writeErrors.empty() ? code : kExitFailed;
    };
    if (a.flag("--json")) return finish(emitJson(out, "").ok() ? kExitOk : kExitUsage);

    printRun(a, r, *plan, nproc, cuda, out, x, cluster, predicted);
    return finish(x.orderOk ? kExitOk : kExitFailed);
}

}  // namespace

std::vector<Command> runCommands() {
    CommandSpec s;
    s.name = "run";
    s.summary =
        "Run a plan for real on local CPU ranks (Gloo) or GPUs (NCCL) and measure step time and "
        "memory.";
    s.description =
        "Spawns N ranks of shardscope-engine on this machine with the torchrun environment\n"
        "(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); each builds the model from its Hugging\n"
        "Face config (llama, mistral, qwen2), shards it as the plan says (FSDP2 semantics), and\n"
        "trains on synthetic tokens with AdamW: warm-up steps, then measured steps. Every op\n"
        "is recorded with the step program's op id, and the recorded order is checked against\n"
        "the program. A plan that fails validation starts nothing; a rank that fails or hangs\n"
        "stops all of them within --timeout-s, and Ctrl-C stops every rank.\n\n"
        "Across machines, launch the ranks yourself with torchrun, SLURM or mpirun:\n"
        "  torchrun --nnodes 2 --nproc-per-node 8 ... build/engine/shardscope-engine worker "
        "--model M --plan P";
    s.options = modelOptions(true);
    s.options.push_back(
        {"--plan", "FILE", "plan JSON (its mesh must have --nproc ranks)", "", true, "-p"});
    s.options.push_back({"--cluster", "FILE",
                         "also simulate the step on this cluster and print predicted against "
                         "measured (samples/clusters/cpu-2core.json for this machine)",
                         "", false, "-c"});
    s.options.push_back({"--nproc", "N", "local ranks (default: the plan's mesh, else 2)"});
    s.options.push_back({"--device", "cpu|cuda",
                         "cpu: Gloo on CPU ranks; cuda: rank i on cuda:i with NCCL, its GPU work "
                         "recorded with CUPTI into --trace",
                         "cpu"});
    s.options.push_back({"--no-device-trace", "",
                         "with --device cuda: do not record GPU work with CUPTI (when another "
                         "profiler holds CUPTI)"});
    s.options.push_back({"--steps", "N", "measured steps", "3"});
    s.options.push_back({"--warmup", "N", "warm-up steps before measuring", "1"});
    s.options.push_back({"--batch", "B", "micro-batch size (overrides the plan)"});
    s.options.push_back({"--seq", "S", "sequence length (overrides the plan)"});
    s.options.push_back(
        {"--micro-batches", "N", "gradient accumulation steps (overrides the plan)"});
    s.options.push_back({"--threads", "N", "intra-op threads per rank (default: cores / ranks)"});
    s.options.push_back(
        {"--collectives", "overlapped|blocking",
         "overlapped: collectives run on Gloo's threads behind compute, as FSDP2's streams let "
         "them on GPUs; blocking: each is waited for where it is issued, with "
         "all_gather_into_tensor and reduce_scatter_tensor, as PyTorch's FSDP2 does on a CPU "
         "device (to compare with a torch.profiler trace of FSDP2 on Gloo)",
         "overlapped"});
    s.options.push_back({"--timeout-s", "S",
                         "collective timeout: a dead or hung rank fails the others after this long",
                         "60"});
    s.options.push_back({"--trace", "FILE", "write the measured multi-rank Chrome/Perfetto trace"});
    s.options.push_back(
        {"--dump-params", "FILE", "write the trained full parameters as JSON (rank 0)"});
    s.options.push_back(
        {"--json", "", "print a machine summary (simulate --json's keys where they apply)"});
    s.options.push_back(
        {"--output", "FILE", "also write the --json summary to FILE (the table still prints)"});
    s.options.push_back({"--no-record", "",
                         "record neither ops nor allocations (to measure the recorder's overhead; "
                         "no trace, breakdown or op-order check)"});
    s.examples = {
        "shardscope run -m samples/models/tiny-llama/config.json -p "
        "samples/plans/tiny-llama-2rank.json --seq 64",
        "shardscope run -m samples/models/tiny-llama/config.json -p "
        "samples/plans/tiny-llama-2rank.json -c samples/clusters/cpu-2core.json --trace "
        "measured.json",
        "shardscope run -m samples/models/tiny-llama/config.json -p "
        "samples/plans/tiny-llama-2rank.json --device cuda --trace gpu.json"};
    return {{s, runRun}};
}

}  // namespace shardscope::cli
