// SPDX-License-Identifier: Apache-2.0
// `shardscope trace diff A B`: two ShardScope traces of one step program (simulated or
// measured) joined by op id: step time, peak memory, exposed communication, time by op
// kind, and the ops that differ most, with per-op and total error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <tuple>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/fsdp_trace_cli.h"
#include "engine/measure/step_overlap.h"
#include "engine/measure/step_trace.h"
#include "engine/measure/trace_diff.h"
#include "plans/core/intervals.h"
#include "profiler/analysis/trace_loader.h"

namespace shardscope::cli {

namespace {

int runTraceDiff(const Args& a) {
    const auto& pos = a.positionals();
    if (pos.empty()) {
        std::cerr << "error: give two ShardScope traces (A, the reference, then B), or PyTorch "
                     "profiler traces with --model and --cluster (see --help)\n";
        return kExitUsage;
    }
    if (a.has("--model") || a.has("--cluster") || pos.size() != 2) {
        auto pytorch = namesPyTorchTraces(pos);
        if (failed(pytorch)) return kExitUsage;
        if (*pytorch) return runPyTorchTraceDiff(a);
        std::cerr << "error: --model and --cluster are for PyTorch traces; two ShardScope traces "
                     "join by op id on their own\n";
        return kExitUsage;
    }
    auto ta = readTraceFile(pos[0]);
    if (failed(ta)) return kExitUsage;
    auto tb = readTraceFile(pos[1]);
    if (failed(tb)) return kExitUsage;
    return printTraceDiff(a, diffSideOf(*ta), diffSideOf(*tb));
}

}  // namespace

int printTraceDiff(const Args& a, const DiffSide& sideA, const DiffSide& sideB) {
    const DiffSide* A = &sideA;
    const DiffSide* B = &sideB;
    const TraceDiff diff = diffSides(sideA, sideB);
    const auto& rows = diff.rows;
    const auto& byKind = diff.byKind;
    const size_t onlyA = diff.onlyA, onlyB = diff.onlyB;
    if (rows.empty()) {
        std::cerr << "error: no op id is in both traces: are they of the same plan, model and "
                     "micro-batch?\n";
        return kExitFailed;
    }
    const double totalError = diff.totalError;
    if (a.flag("--json")) {
        nlohmann::json ops = nlohmann::json::array();
        for (const auto& r : rows)
            ops.push_back({{"op_id", r.id},
                           {"label", r.label},
                           {"kind", r.kind},
                           {"a_ns", r.a},
                           {"b_ns", r.b},
                           {"error", r.a > 0 ? (r.b - r.a) / r.a : 0.0}});
        nlohmann::json kinds = nlohmann::json::object();
        for (const auto& [k, v] : byKind)
            kinds[k] = {{"a_ns", v.first}, {"b_ns", v.second}};
        auto side = [](const DiffSide& s) {
            return nlohmann::json{{"path", s.path},
                                  {"producer", s.producer},
                                  {"step_time_ns", s.stepNs},
                                  {"peak_allocated_bytes", s.peakAllocated},
                                  {"exposed_comm_ns", s.exposedCommNs}};
        };
        auto rel = [](double x, double y) { return x > 0 ? (y - x) / x : 0.0; };
        return emitJson({{"a", side(*A)},
                         {"b", side(*B)},
                         {"step_time_error", rel(A->stepNs, B->stepNs)},
                         {"peak_allocated_error", rel(A->peakAllocated, B->peakAllocated)},
                         {"total_op_error", totalError},
                         {"joined_ops", rows.size()},
                         {"only_in_a", onlyA},
                         {"only_in_b", onlyB},
                         {"joined_by", diff.joinedByLabel ? "unit_phase_kind" : "op_id"},
                         {"by_kind", kinds},
                         {"ops", ops}},
                        "")
                       .ok()
                   ? kExitOk
                   : kExitUsage;
    }
    auto describe = [](const DiffSide& s) {
        return s.path + " (" +
               (s.measured ? "measured, " + std::to_string(s.ranks) + " ranks, " +
                                 std::to_string(s.steps) + " steps"
                           : std::string(s.producer.empty() ? "trace" : s.producer)) +
               ")";
    };
    std::cout << "A " << describe(*A) << "\nB " << describe(*B) << "\n"
              << rows.size()
              << (diff.joinedByLabel ? " ops joined by unit, phase, kind and order"
                                     : " ops joined by op id")
              << " (durations: mean over ranks and steps)";
    if (onlyA || onlyB) std::cout << "; " << onlyA << " only in A, " << onlyB << " only in B";
    std::cout << "\n";
    if (diff.joinedByLabel)
        std::cout << "note: the two traces' op ids name different ops (traces of different step "
                     "programs: another plan, or a program changed since one was recorded)\n";
    std::cout << "\n";
    Table t({"", "A", "B", "B - A", "ERROR"}, {false, true, true, true, true});
    t.row({"step time", formatMs(A->stepNs, 3), formatMs(B->stepNs, 3),
           formatMs(B->stepNs - A->stepNs, 3), formatError(A->stepNs, B->stepNs)});
    t.row({"peak allocated", formatMiB(A->peakAllocated), formatMiB(B->peakAllocated),
           formatMiB(B->peakAllocated - A->peakAllocated),
           formatError(A->peakAllocated, B->peakAllocated)});
    t.row({"exposed comm", formatMs(A->exposedCommNs, 3), formatMs(B->exposedCommNs, 3),
           formatMs(B->exposedCommNs - A->exposedCommNs, 3),
           formatError(A->exposedCommNs, B->exposedCommNs)});
    for (const auto& [k, v] : byKind)
        t.row({"  " + k + " (sum)", formatMs(v.first, 3), formatMs(v.second, 3),
               formatMs(v.second - v.first, 3), formatError(v.first, v.second)});
    t.print(std::cout);
    char line[160];
    std::snprintf(line, sizeof line,
                  "\nTotal per-op error: sum |B - A| / sum A = %.1f%% over the joined ops\n",
                  100.0 * totalError);
    std::cout << line << "\nLargest differences:\n";
    Table d({"OP", "", "A", "B", "ERROR"}, {true, false, true, true, true});
    auto topN = a.getInt("--top", 0);
    if (!topN) {
        std::cerr << "error: " << topN.error() << "\n";
        return kExitUsage;
    }
    const size_t top = std::min<size_t>(rows.size(), static_cast<size_t>(*topN));
    for (size_t i = 0; i < top; ++i)
        d.row({std::to_string(rows[i].id), rows[i].label, formatMs(rows[i].a, 3),
               formatMs(rows[i].b, 3), formatError(rows[i].a, rows[i].b)});
    d.print(std::cout);
    return kExitOk;
}

std::vector<Command> traceDiffCommands() {
    CommandSpec s;
    s.name = "trace diff";
    s.summary =
        "Join a run's trace with another or with a simulation: step time, peak memory, per-op "
        "error.";
    s.description =
        "A is the reference (usually the measured run), B the other (usually the simulation):\n"
        "  shardscope run ... --trace measured.json\n"
        "  shardscope simulate ... --trace simulated.json\n"
        "  shardscope trace diff measured.json simulated.json\n"
        "Ops join by their step-program op id, so both traces must come from the same model,\n"
        "plan and micro-batch. Measured durations are means over ranks and measured steps;\n"
        "step time is the slowest rank's mean step for a measured trace and the last op's end\n"
        "for a simulated one; exposed communication is collective time no compute overlapped.";
    s.description +=
        "\n\nPyTorch profiler traces of an FSDP2 job (a file per rank, or their folder) are\n"
        "A when --model and --cluster are given: the plan that ran (--plan, or recovered\n"
        "from the traces as `plan recover` does) is simulated on the cluster (B), and the\n"
        "trace's collectives, copies, per-unit forward and backward compute and optimizer\n"
        "step join the program's ops by unit, phase, kind, micro-batch and order.";
    s.positionalsMetavar = "A [B]";
    s.options = {
        {"--top", "N", "how many of the largest per-op differences to list", "10"},
        {"--json", "", "print every joined op and the totals as JSON"},
        {"--model", "FILE", "PyTorch traces: the model the job trained", "", false, "-m"},
        {"--param-dtype", "DTYPE", "PyTorch traces: parameter dtype for Hugging Face configs",
         "float32"},
        {"--activation-dtype", "DTYPE", "PyTorch traces: activation dtype for Hugging Face configs",
         "float32"},
        {"--plan", "FILE", "PyTorch traces: the plan that ran (default: recovered)", "", false,
         "-p"},
        {"--cluster", "FILE", "PyTorch traces: the cluster to simulate on", "", false, "-c"}};
    s.examples = {
        "shardscope trace diff measured.json simulated.json",
        "shardscope trace diff traces/ -m config.json -c samples/clusters/cpu-2core.json"};
    return {{s, runTraceDiff}};
}

}  // namespace shardscope::cli

namespace shardscope::cli {

namespace {

// `trace overlap`: per FSDP unit and phase, how much communication compute hid.
int runTraceOverlap(const Args& a) {
    const auto& pos = a.positionals();
    if (pos.empty()) {
        std::cerr << "error: give a trace (a ShardScope trace, or PyTorch profiler traces: files "
                     "or a folder of them)\n";
        return kExitUsage;
    }
    {
        // A PyTorch profiler trace (or a folder of them): per FSDP unit from FSDP's labels.
        auto files = expandTraceArgs(pos);
        if (failed(files)) return kExitUsage;
        if (files->size() > 1 || files->front().fromFolder) return runPyTorchTraceOverlap(a);
        auto t = importKinetoFile(files->front().path);
        if (failed(t)) return kExitUsage;
        if (!isShardScopeTrace(*t)) return runPyTorchTraceOverlap(a);
    }
    auto trace = readTraceFile(pos[0]);
    if (failed(trace)) return kExitUsage;
    const StepOverlap ov = stepOverlap(*trace);
    const double samples = static_cast<double>(ov.rankSteps);
    double comm = 0, exposed = 0;
    for (const auto& r : ov.rows) {
        comm += r.commNs;
        exposed += r.exposedNs;
    }
    if (a.flag("--json")) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& r : ov.rows)
            out.push_back({{"unit", r.unit},
                           {"phase", r.phase},
                           {"kind", r.kind},
                           {"comm_ns_per_step", r.commNs / samples},
                           {"exposed_ns_per_step", r.exposedNs / samples}});
        nlohmann::json doc = {{"trace", pos[0]},
                              {"rank_steps", ov.rankSteps},
                              {"comm_ns_per_step", comm / samples},
                              {"exposed_ns_per_step", exposed / samples},
                              {"peer_wait_ns_per_step",
                               ov.peerWaitMatched > 0 ? nlohmann::json(ov.peerWaitNs / samples)
                                                      : nlohmann::json(nullptr)},
                              {"collectives", out}};
        if (a.flag("--collectives")) {
            // Each collective on its own, with the keys of the PyTorch traces' list.
            nlohmann::json each = nlohmann::json::array();
            for (const auto& c : ov.collectives)
                each.push_back({{"unit", c.unit == "<root>" ? "" : c.unit},
                                {"phase", c.phase},
                                {"kind", c.kind},
                                {"rank", c.rank},
                                {"step", c.step},
                                {"start_ns", c.startNs},
                                {"end_ns", c.endNs},
                                {"exposed_ns", c.exposedNs},
                                {"peer_wait_ns", c.peerWaitNs >= 0 ? nlohmann::json(c.peerWaitNs)
                                                                   : nlohmann::json(nullptr)}});
            doc["each_collective"] = std::move(each);
        }
        return emitJson(doc, "").ok() ? kExitOk : kExitUsage;
    }
    std::cout << pos[0] << ": " << ov.rankSteps << " rank-steps; per step, communication "
              << formatMs(comm / samples) << ", of it " << formatMs(exposed / samples)
              << " exposed ("
              << (comm > 0 ? static_cast<int>(std::lround(100.0 * (comm - exposed) / comm)) : 0)
              << "% hidden under compute)\n";
    if (ov.peerWaitMatched > 0)
        std::cout << "of the communication, " << formatMs(ov.peerWaitNs / samples)
                  << " a step was waiting for the last rank to arrive, not moving data\n";
    std::cout << "\n";
    Table t({"UNIT", "PHASE", "COLLECTIVE", "TIME/STEP", "EXPOSED/STEP", "HIDDEN"},
            {false, false, false, true, true, true});
    for (const auto& r : ov.rows)
        t.row({r.unit, r.phase, r.kind, formatMs(r.commNs / samples),
               formatMs(r.exposedNs / samples),
               r.commNs > 0 ? std::to_string(static_cast<int>(
                                  std::lround(100.0 * (r.commNs - r.exposedNs) / r.commNs))) +
                                  "%"
                            : "-"});
    t.print(std::cout);
    return kExitOk;
}

}  // namespace

std::vector<Command> traceOverlapCommands() {
    CommandSpec s;
    s.name = "trace overlap";
    s.summary =
        "Exposed communication per FSDP unit and phase, from PyTorch FSDP or ShardScope traces.";
    s.description =
        "PyTorch profiler traces of an FSDP2 or FSDP1 job (a file per rank, or their folder):\n"
        "FSDP's own labels give each all-gather, reduce-scatter and HSDP all-reduce its unit and\n"
        "phase; per unit and step, averaged over ranks: the time, the exposed part (no compute\n"
        "kernel, or on CPU no op of the issuing thread, ran meanwhile) and the prefetch distance\n"
        "seen (how many units ahead of the unit whose hook issued it an all-gather was).\n"
        "Given every rank's trace, PEER WAIT is the part of the collectives spent before the\n"
        "last rank started each: waiting for a straggler, not moving data (the ranks' clocks\n"
        "are aligned on the collectives' ends, so traces of several hosts compare).\n"
        "A `shardscope run --trace` or `simulate --trace` file: each collective's time and the\n"
        "part no compute on the same rank overlapped, summed per unit, phase and kind and\n"
        "averaged over ranks and steps, largest first.";
    s.positionalsMetavar = "TRACE|DIR...";
    s.options = {{"--json", "", "print JSON"},
                 {"--collectives", "", "with --json: every collective on its own too"}};
    s.examples = {
        "shardscope trace overlap profiler_traces/",
        "shardscope trace overlap shardscope-out/tiny-llama.reshard-true.measured-trace.json"};
    return {{s, runTraceOverlap}};
}

}  // namespace shardscope::cli
