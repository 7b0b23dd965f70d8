// SPDX-License-Identifier: Apache-2.0
// `shardscope simulate`: build the step program of a plan and simulate it on a cluster.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <tuple>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/measure/step_trace.h"
#include "engine/schedule/step_program.h"
#include "engine/sim/cost_model.h"
#include "engine/sim/simulator.h"
#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "plans/plan/resolve.h"
#include "profiler/export/chrome_trace_writer.h"

namespace shardscope::cli {

namespace {

std::string ms(int64_t ns) {
    char b[32];
    std::snprintf(b, sizeof b, "%.2f ms", static_cast<double>(ns) * 1e-6);
    return b;
}

// The step's kernels by class (docs/kernel-model.md): what the compute ops launch, priced.
nlohmann::json kernelsJson(const ClusterSpec& c, const StepProgram& p) {
    const KernelTotals t = kernelTotals(c, p);
    nlohmann::json j = nlohmann::json::object();
    for (KernelKind k : {KernelKind::Gemm, KernelKind::Attention, KernelKind::MemoryBound}) {
        const KernelClassTotal& x = t.byKind[static_cast<int>(k)];
        j[kernelKindName(k)] = {{"count", x.count},
                                {k == KernelKind::MemoryBound ? "bytes" : "flops", x.work},
                                {"device_ns", static_cast<int64_t>(x.deviceSeconds * 1e9)}};
    }
    j["cpu_launch_ns"] = static_cast<int64_t>(t.launchSeconds * 1e9);
    // The GEMMs by shape (M x K by K x N, as aten::mm's inputs): what a cluster's
    // gemm_efficiency_by_shape prices; GEMMs of no known shape are left out.
    std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> shapes;
    for (const Op& op : p.ops)
        if (op.mix >= 0 && static_cast<size_t>(op.mix) < p.mixes.size())
            for (const KernelEntry& e : p.mixes[static_cast<size_t>(op.mix)].entries)
                if (e.kind == KernelKind::Gemm && e.shape.m > 0)
                    shapes[{e.shape.m, e.shape.n, e.shape.k}] += e.count;
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [key, count] : shapes)
        list.push_back({{"m", std::get<0>(key)},
                        {"n", std::get<1>(key)},
                        {"k", std::get<2>(key)},
                        {"count", count}});
    j["gemm"]["shapes"] = list;
    // The optimizer's foreach kernels (in memory_bound above): a GPU device's AdamW step.
    for (const Op& op : p.ops)
        if (op.kind == OpKind::OptimizerStep && op.mix >= 0 &&
            static_cast<size_t>(op.mix) < p.mixes.size()) {
            const KernelMix& mix = p.mixes[static_cast<size_t>(op.mix)];
            double bytes = 0;
            for (const KernelEntry& e : mix.entries)
                bytes += e.count * e.perKernel;
            j["optimizer"] = {
                {"count", mix.kernels},
                {"bytes", bytes},
                {"device_ns", static_cast<int64_t>(optimizerMixSeconds(c, mix) * 1e9)}};
        }
    return j;
}

nlohmann::json summaryJson(const ResolvedPlan& r, const StepProgram& p, const SimResult& s,
                           const ClusterSpec& c) {
    nlohmann::json units = nlohmann::json::array();
    for (size_t i = 0; i < r.units.size(); ++i) {
        const UnitSummary u = i < s.units.size() ? s.units[i] : UnitSummary{};
        units.push_back({{"name", r.units[i].name},
                         {"all_gather_bytes", u.allGatherBytes},
                         {"reduce_scatter_bytes", u.reduceScatterBytes},
                         {"comm_ns", u.commNs},
                         {"exposed_comm_ns", u.exposedCommNs}});
    }
    nlohmann::json peak = nlohmann::json::object();
    for (int k = 0; k < static_cast<int>(MemCategory::Count); ++k)
        peak[memCategoryName(static_cast<MemCategory>(k))] = s.atPeak[static_cast<size_t>(k)];
    return {{"plan", r.plan.name},
            {"cluster", c.name},
            {"world_size", r.worldSize},
            {"micro_batch_size", r.plan.microBatchSize},
            {"seq_len", r.plan.seqLen},
            {"micro_batches", r.plan.microBatches},
            {"ops", p.ops.size()},
            {"step_time_ns", s.stepNs},
            {"compute_ns", s.computeNs},
            {"comm_ns", s.commNs},
            {"exposed_comm_ns", s.exposedCommNs},
            {"overlap_ratio", s.overlapRatio},
            {"peak_allocated_bytes", s.peakAllocated},
            {"peak_reserved_bytes", s.peakReserved},
            {"device_memory_bytes", c.device.memoryBytes},
            {"oom", s.oom},
            {"tokens_per_s", s.tokensPerS},
            {"mfu", s.mfu},
            {"memory_at_peak", peak},
            {"kernels", kernelsJson(c, p)},
            {"chunk_cat_host_ns", s.chunkCatHostNs},
            {"units", units}};
}

// Chrome Trace Event JSON (Perfetto UI and chrome://tracing open it): one process for the
// simulated rank role, one thread per stream, memory counters by category. ShardScope's
// op ids, units and phases ride in args.
nlohmann::json chromeTrace(const ResolvedPlan& r, const StepProgram& p, const SimResult& s) {
    ChromeTraceWriter w;
    const int pid = tracePid(0);
    w.processName(pid, "rank 0 (simulated; all " + std::to_string(r.worldSize) + " ranks alike)");
    for (int st = 0; st < static_cast<int>(Stream::Count); ++st)
        w.lane(pid, traceTid(0, st), streamName(static_cast<Stream>(st)), st);
    for (size_t i = 0; i < p.ops.size(); ++i) {
        const Op& op = p.ops[i];
        nlohmann::json args{{"op_id", i},
                            {"unit", r.units[op.unit.index()].name},
                            {"phase", phaseName(op.phase)},
                            {"kind", opKindName(op.kind)},
                            {"micro_batch", op.microBatch}};
        if (op.flops > 0) args["flops"] = op.flops;
        if (op.commBytes > 0) {
            args["bytes"] = op.commBytes;
            args["group_size"] = op.groupSize;
        }
        w.span(pid, traceTid(0, static_cast<int>(op.stream)), opLabel(r, op), opKindName(op.kind),
               static_cast<double>(s.start[i]), static_cast<double>(s.end[i] - s.start[i]),
               std::move(args));
    }
    // Every point, several at one instant included: the counter's maximum is then the
    // reported peak (an allocation and a free at one instant peak in between).
    for (const auto& m : s.timeline) {
        nlohmann::json a = nlohmann::json::object();
        for (int k = 0; k < static_cast<int>(MemCategory::Count); ++k)
            a[memCategoryName(static_cast<MemCategory>(k))] = m.byCategory[static_cast<size_t>(k)];
        const auto at = static_cast<double>(m.timeNs);
        w.counter(pid, traceTid(0, kCounterLane), "memory allocated by category (bytes)", at,
                  std::move(a));
        w.counter(pid, traceTid(0, kCounterLane), "memory (bytes)", at,
                  {{"allocated", m.allocated}, {"reserved", m.reserved}});
    }
    return w.finish({{"producer", "shardscope simulate"},
                     {"rank_pid_offset", kRankPidOffset},
                     {"plan", r.plan.name},
                     {"world_size", r.worldSize}});
}

// The step program op by op with its simulated times (--program --json).
nlohmann::json programJson(const ResolvedPlan& r, const StepProgram& prog, const SimResult& s,
                           const ClusterSpec& cluster) {
    nlohmann::json ops = nlohmann::json::array();
    for (size_t i = 0; i < prog.ops.size(); ++i) {
        const Op& op = prog.ops[i];
        // FSDP2's reduce over a shard group of one is a device copy, not a collective
        // (foreach_reduce's world_size == 1 path): listed as such, so counting the
        // program's collectives counts what NCCL runs.
        const bool reduceCopy = isCollective(op.kind) && op.groupSize <= 1 && op.memBytes > 0;
        ops.push_back({{"id", i},
                       {"kind", reduceCopy ? "reduce_copy" : opKindName(op.kind)},
                       {"phase", phaseName(op.phase)},
                       {"stream", streamName(op.stream)},
                       {"unit", r.units[op.unit.index()].name},
                       {"micro_batch", op.microBatch},
                       {"bytes", op.commBytes},
                       {"group_size", op.groupSize},
                       {"start_ns", s.start[i]},
                       {"end_ns", s.end[i]}});
        // A copy's bytes (FSDP's copy-ins, copy-outs and casts).
        if (op.mix < 0 && op.memBytes > 0) ops.back()["memory_bytes"] = op.memBytes;
        // A compute op's kernels (docs/kernel-model.md): counts by class, and the bytes
        // its memory-bound kernels move.
        if (op.mix >= 0 && static_cast<size_t>(op.mix) < prog.mixes.size()) {
            int64_t count[3] = {0, 0, 0};  // by KernelKind
            double bytes = 0;
            for (const KernelEntry& e : prog.mixes[static_cast<size_t>(op.mix)].entries) {
                count[static_cast<int>(e.kind)] += e.count;
                if (e.kind == KernelKind::MemoryBound)
                    bytes += static_cast<double>(e.count) * e.perKernel;
            }
            nlohmann::json k = nlohmann::json::object();
            for (KernelKind kk : {KernelKind::Gemm, KernelKind::Attention, KernelKind::MemoryBound})
                k[kernelKindName(kk)] = count[static_cast<int>(kk)];
            ops.back()["kernels"] = k;
            ops.back()["memory_bound_bytes"] = bytes;
            if (op.kind != OpKind::OptimizerStep)  // priced by its foreach curve instead
                ops.back()["memory_bound_ns"] =
                    std::llround(1e9 * mixParts(cluster, prog.mixes[static_cast<size_t>(op.mix)],
                                                op.computeDtype)
                                           .memorySeconds);
        }
    }
    return {{"ops", ops}};
}

// The simulated step as text: the totals, the kernels, the peak and the units by exposed
// communication.
void printSimulation(const Args& a, const ResolvedPlan& r, const StepProgram& prog,
                     const StepOptions& so, const SimResult& s, const ClusterSpec& cluster) {
    std::cout << "Simulated step of plan " << (r.plan.name.empty() ? a.get("--plan") : r.plan.name)
              << "\n"
              << "  on " << cluster.name << ", micro-batch " << so.microBatchSize << " x "
              << so.seqLen << " tokens"
              << (so.microBatches > 1 ? " x " + std::to_string(so.microBatches) + " micro-batches"
                                      : "")
              << ", " << prog.ops.size() << " ops per rank\n";
    if (cluster.simDefaulted)
        std::cout << "  (cluster file has no \"sim\" section: using the documented defaults)\n";
    char line[256];
    std::snprintf(line, sizeof line, "  step time     %s   tokens/s %s   MFU %.1f%%\n",
                  ms(s.stepNs).c_str(), formatCount(static_cast<int64_t>(s.tokensPerS)).c_str(),
                  100.0 * s.mfu);
    std::cout << line;
    std::snprintf(line, sizeof line,
                  "  compute       %s   communication %s, exposed %s (overlap %.1f%%)\n",
                  ms(s.computeNs).c_str(), ms(s.commNs).c_str(), ms(s.exposedCommNs).c_str(),
                  100.0 * s.overlapRatio);
    std::cout << line;
    if (s.mfu > 1.0)
        std::cout << "  warning: MFU above 100%: the model's FLOPs ran faster than the cluster's "
                     "peak_flops allows; check the cluster's peak and efficiency figures\n";
    {
        const KernelTotals kt = kernelTotals(cluster, prog);
        const auto& gm = kt.byKind[static_cast<int>(KernelKind::Gemm)];
        const auto& at = kt.byKind[static_cast<int>(KernelKind::Attention)];
        const auto& mb = kt.byKind[static_cast<int>(KernelKind::MemoryBound)];
        auto sec = [&](double x) { return ms(static_cast<int64_t>(x * 1e9)); };
        std::cout << "  kernels       " << formatCount(kt.count())
                  << " per step: " << formatCount(gm.count) << " GEMM " << sec(gm.deviceSeconds)
                  << ", " << formatCount(at.count) << " attention " << sec(at.deviceSeconds) << ", "
                  << formatCount(mb.count) << " memory-bound " << sec(mb.deviceSeconds);
        if (kt.launchSeconds > 0) std::cout << "; CPU launches " << sec(kt.launchSeconds);
        if (s.chunkCatHostNs > 0)
            std::cout << ", and the reduce-scatter copy-ins' block tables " << ms(s.chunkCatHostNs);
        std::cout << "\n";
    }
    if (so.recomputeEarlyStop) {
        // What full checkpointing's early stop leaves out (docs/kernel-model.md).
        int64_t skipped = 0;
        for (const ModuleRun& run : r.moduleRuns)
            if (r.units[static_cast<size_t>(run.unit)].activationCheckpointing == AcMode::Full)
                for (const auto& gm : run.recomputeSkips)
                    skipped += gm.calls;
        if (skipped > 0)
            std::cout << "  recompute     stops before " << skipped << " GEMM"
                      << (skipped == 1 ? "" : "s")
                      << " a micro-batch, as non-reentrant torch.utils.checkpoint does "
                         "(--reentrant-checkpointing: all of forward)\n";
    }
    std::cout << "  peak memory   allocated " << formatBytes(s.peakAllocated) << ", reserved "
              << formatBytes(s.peakReserved) << " of " << formatBytes(cluster.device.memoryBytes)
              << (s.oom ? "  -> OUT OF MEMORY by " +
                              formatBytes(s.peakReserved - cluster.device.memoryBytes)
                        : "  (fits)")
              << "\n  at the peak  ";
    for (int k = 0; k < static_cast<int>(MemCategory::Count); ++k)
        if (s.atPeak[static_cast<size_t>(k)] > 0)
            std::cout << " " << memCategoryName(static_cast<MemCategory>(k)) << " "
                      << formatBytes(s.atPeak[static_cast<size_t>(k)]) << ";";
    std::cout << "\n\n";
    std::vector<size_t> idx;
    for (size_t i = 0; i < r.units.size() && i < s.units.size(); ++i)
        idx.push_back(i);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) {
        return s.units[x].exposedCommNs > s.units[y].exposedCommNs;
    });
    Table t({"UNIT", "ALL-GATHER", "REDUCE-SCATTER", "COMM", "EXPOSED"},
            {false, true, true, true, true});
    const size_t shown = std::min<size_t>(idx.size(), a.flag("--all-units") ? idx.size() : 8);
    for (size_t k = 0; k < shown; ++k) {
        const auto& u = s.units[idx[k]];
        t.row({r.units[idx[k]].displayName(), formatBytes(u.allGatherBytes),
               formatBytes(u.reduceScatterBytes), ms(u.commNs), ms(u.exposedCommNs)});
    }
    std::cout << "Units by exposed communication"
              << (shown < idx.size() ? " (top " + std::to_string(shown) + "; --all-units for all)"
                                     : "")
              << ":\n";
    t.print(std::cout);
}

int runSimulate(const Args& a) {
    auto g = loadModelArg(a);
    if (failed(g)) return kExitUsage;
    auto plan = loadPlanFile(a.get("--plan"));
    if (failed(plan)) return kExitUsage;
    auto cluster = loadClusterNamed(a.get("--cluster"));
    if (failed(cluster)) return kExitUsage;
    for (auto [opt, field] :
         {std::pair{"--batch", &plan->microBatchSize}, std::pair{"--seq", &plan->seqLen},
          std::pair{"--micro-batches", &plan->microBatches}})
        if (a.has(opt)) {
            auto v = a.getInt(opt, 1);
            if (!v) {
                std::cerr << "error: " << v.error() << "\n";
                return kExitUsage;
            }
            *field = *v;
        }
    if (a.has("--seq")) plan->seqLenDefaulted = false;
    const ResolvedPlan r = resolvePlan(*g, *plan, &*cluster, a.get("--plan"));
    if (r.hasErrors()) {
        for (const auto& pr : r.problems)
            std::cerr << pr.toString() << "\n";
        std::cerr << "error: the plan has errors; fix them (see `shardscope plan validate`)\n";
        return kExitFailed;
    }
    for (const auto& pr : r.problems)  // warnings: simulated, but said
        std::cerr << pr.toString() << "\n";
    StepOptions so = stepOptionsFor(*plan, *cluster);
    so.recomputeEarlyStop = !a.flag("--reentrant-checkpointing");
    const StepProgram prog = buildStepProgram(r, so);
    SimOptions opts;
    opts.expandableSegments = a.flag("--expandable-segments");
    const SimResult s = simulate(prog, *cluster, r.worldSize, opts);
    if (a.has("--trace")) {
        if (Status st =
                writeFileAtomically(a.get("--trace"), chromeTrace(r, prog, s).dump() + "\n");
            !st) {
            std::cerr << "error: " << st.error() << "\n";
            return kExitUsage;
        }
        std::cerr << "wrote " << a.get("--trace") << " (" << prog.ops.size()
                  << " ops; open in https://ui.perfetto.dev or shardscope-gui)\n";
    }
    if (a.flag("--program")) {
        if (!a.flag("--json")) {
            std::cout << prog.dump(r);
            return kExitOk;
        }
        return emitJson(programJson(r, prog, s, *cluster), "").ok() ? kExitOk : kExitUsage;
    }
    if (a.flag("--json"))
        return emitJson(summaryJson(r, prog, s, *cluster), "").ok() ? kExitOk : kExitUsage;

    printSimulation(a, r, prog, so, s, *cluster);
    return kExitOk;
}

}  // namespace

std::vector<Command> simulateCommands() {
    CommandSpec s;
    s.name = "simulate";
    s.summary =
        "Simulate one training step of a plan on a cluster: step time, overlap, peak memory.";
    s.description =
        "Builds the step program (what each rank issues on which CUDA stream, FSDP2 or FSDP1\n"
        "semantics) and simulates it with the cluster's cost models: NCCL ring collectives,\n"
        "compute by FLOPs and efficiency, memory through a caching-allocator model. Ranks are\n"
        "symmetric, so one rank is simulated for all. The micro-batch comes from the plan's\n"
        "\"training\" section unless --batch/--seq/--micro-batches are given.";
    s.options = modelOptions(true);
    s.options.push_back({"--plan", "FILE", "plan JSON", "", true, "-p"});
    s.options.push_back(
        {"--cluster", "FILE", "cluster JSON (hardware and sim parameters)", "", true, "-c"});
    s.options.push_back({"--batch", "B", "micro-batch size (overrides the plan)"});
    s.options.push_back({"--seq", "S", "sequence length (overrides the plan)"});
    s.options.push_back(
        {"--micro-batches", "N", "gradient accumulation steps (overrides the plan)"});
    s.options.push_back(
        {"--expandable-segments", "", "model PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"});
    s.options.push_back({"--reentrant-checkpointing", "",
                         "full checkpointing recomputes all of forward (use_reentrant=True, "
                         "CheckpointImpl.REENTRANT, ShardScope's engine); by default the "
                         "recompute stops where non-reentrant torch.utils.checkpoint does"});
    s.options.push_back({"--trace", "FILE", "write a Chrome/Perfetto trace of the simulated step"});
    s.options.push_back(
        {"--program", "", "print the step program (one op per line) instead of the summary"});
    s.options.push_back({"--all-units", "", "list every unit, not only the top 8"});
    s.options.push_back({"--json", "", "print a machine summary"});
    s.examples = {
        "shardscope simulate -m samples/models/llama3-8b/config.json -p "
        "samples/plans/llama-per-block.json "
        "-c samples/clusters/h100-sxm-8x8.json --trace step.json"};
    return {{s, runSimulate}};
}

}  // namespace shardscope::cli
