// SPDX-License-Identifier: Apache-2.0
// `shardscope trace diff A B`: two ShardScope traces of one step program (simulated or
// measured) joined by op id: step time, peak memory, exposed communication, time by op
// kind, and the ops that differ most, with per-op and total error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <tuple>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "plans/core/intervals.h"

namespace shardscope::cli {

namespace {

struct OpTimes {
    std::string label, kind;
    double sumNs = 0;
    int count = 0;
    [[nodiscard]] double mean() const { return count ? sumNs / count : 0; }
};

struct Side {
    std::string path, producer;
    bool measured = false;
    int ranks = 0, steps = 0;
    double stepNs = 0;  // measured: the slowest rank's mean step span; simulated: last end
    double peakAllocated = 0;
    double exposedCommNs = 0;        // per step (rank 0)
    std::map<int64_t, OpTimes> ops;  // op id -> mean duration over ranks and steps
};

int64_t unionLength(std::vector<Interval> v) {
    return totalLength(mergeIntervals(std::move(v)));
}

bool isComm(const std::string& k) {
    return k == "all_gather" || k == "reduce_scatter" || k == "all_reduce";
}
bool isComputeKind(const std::string& k) {
    return k == "forward" || k == "backward" || k == "recompute" || k == "optimizer";
}

Expected<Side> readSide(const std::string& path) {
    std::ifstream in(path);
    if (!in) return Error{path + ": cannot open file"};
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") ||
        !j["traceEvents"].is_array())
        return Error{path + ":/traceEvents: expected a Chrome trace with a traceEvents array"};
    Side s;
    s.path = path;
    if (j.contains("metadata") && j["metadata"].is_object())
        s.producer = j["metadata"].value("producer", "");
    s.measured = s.producer == "shardscope run";
    std::map<int64_t, std::pair<double, int>> spans;
    std::map<std::pair<int64_t, int64_t>, std::pair<std::vector<Interval>, std::vector<Interval>>>
        perStep;  // (rank, step) -> (compute, comm)
    int64_t lastEnd = 0, firstStart = INT64_MAX;
    for (const auto& e : j["traceEvents"]) {
        if (!e.is_object()) continue;
        const std::string ph = e.value("ph", "");
        if (ph == "C" && e.value("name", "") == "memory (bytes)" && e.contains("args"))
            s.peakAllocated = std::max(s.peakAllocated, e["args"].value("allocated", 0.0));
        if (ph != "X") continue;
        const int64_t rank = e.value("pid", int64_t{0});
        const int64_t t0 = std::llround(e.value("ts", 0.0) * 1000.0);
        const int64_t t1 = t0 + std::llround(e.value("dur", 0.0) * 1000.0);
        if (e.value("cat", "") == "step") {
            spans[rank].first += static_cast<double>(t1 - t0);
            ++spans[rank].second;
            continue;
        }
        if (!e.contains("args") || !e["args"].is_object() || !e["args"].contains("op_id")) continue;
        const auto& a = e["args"];
        const int64_t id = a["op_id"].is_number_integer() ? a["op_id"].get<int64_t>() : -1;
        if (id < 0) continue;
        const std::string kind = a.value("kind", "");
        auto& op = s.ops[id];
        op.label = e.value("name", "");
        op.kind = kind;
        op.sumNs += static_cast<double>(t1 - t0);
        ++op.count;
        s.ranks = std::max<int>(s.ranks, static_cast<int>(rank) + 1);
        const int64_t step = a.value("step", int64_t{0});
        auto& ps = perStep[{rank, step}];
        if (isComm(kind)) ps.second.push_back({t0, t1});
        if (isComputeKind(kind)) ps.first.push_back({t0, t1});
        lastEnd = std::max(lastEnd, t1);
        firstStart = std::min(firstStart, t0);
    }
    if (s.ops.empty())
        return Error{path +
                     ": no ops with a ShardScope op id (diff joins `shardscope simulate "
                     "--trace` and `shardscope run --trace` files)"};
    if (!spans.empty()) {
        for (const auto& [_, v] : spans)
            s.stepNs = std::max(s.stepNs, v.first / std::max(1, v.second));
    } else {
        s.stepNs = static_cast<double>(lastEnd - std::min(firstStart, int64_t{0}));
    }
    // Exposed communication: rank 0's mean over its steps.
    double exposed = 0;
    int n = 0;
    for (auto& [key, v] : perStep) {
        if (key.first != 0) continue;
        std::vector<Interval> both = v.first;
        both.insert(both.end(), v.second.begin(), v.second.end());
        exposed += static_cast<double>(unionLength(both) - unionLength(v.first));
        ++n;
    }
    s.exposedCommNs = n ? exposed / n : 0;
    s.steps = n;
    return s;
}

int runTraceDiff(const Args& a) {
    const auto& pos = a.positionals();
    if (pos.size() != 2) {
        std::cerr << "error: trace diff takes two trace files (A, the reference, then B)\n";
        return kExitUsage;
    }
    auto A = readSide(pos[0]);
    if (failed(A)) return kExitUsage;
    auto B = readSide(pos[1]);
    if (failed(B)) return kExitUsage;
    // Join by op id; by kind totals per step.
    struct Row {
        int64_t id;
        std::string label, kind;
        double a, b;
    };
    std::vector<Row> rows;
    std::map<std::string, std::pair<double, double>> byKind;
    double absErr = 0, totalA = 0;
    size_t onlyA = 0, onlyB = 0;
    for (const auto& [id, oa] : A->ops) {
        auto it = B->ops.find(id);
        if (it == B->ops.end()) {
            ++onlyA;
            continue;
        }
        rows.push_back({id, oa.label, oa.kind, oa.mean(), it->second.mean()});
        byKind[oa.kind].first += oa.mean();
        byKind[oa.kind].second += it->second.mean();
        absErr += std::abs(it->second.mean() - oa.mean());
        totalA += oa.mean();
    }
    for (const auto& [id, _] : B->ops)
        if (!A->ops.count(id)) ++onlyB;
    if (rows.empty()) {
        std::cerr << "error: no op id is in both traces: are they of the same plan, model and "
                     "micro-batch?\n";
        return kExitFailed;
    }
    std::sort(rows.begin(), rows.end(),
              [](const Row& x, const Row& y) { return std::abs(x.b - x.a) > std::abs(y.b - y.a); });
    const double totalError = totalA > 0 ? absErr / totalA : 0;
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
        auto side = [](const Side& s) {
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
                         {"by_kind", kinds},
                         {"ops", ops}},
                        "")
                       .ok()
                   ? kExitOk
                   : kExitUsage;
    }
    auto describe = [](const Side& s) {
        return s.path + " (" +
               (s.measured ? "measured, " + std::to_string(s.ranks) + " ranks, " +
                                 std::to_string(s.steps) + " steps"
                           : std::string(s.producer.empty() ? "trace" : s.producer)) +
               ")";
    };
    std::cout << "A " << describe(*A) << "\nB " << describe(*B) << "\n"
              << rows.size() << " ops joined by op id (durations: mean over ranks and steps)";
    if (onlyA || onlyB) std::cout << "; " << onlyA << " only in A, " << onlyB << " only in B";
    std::cout << "\n\n";
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

}  // namespace

std::vector<Command> traceDiffCommands() {
    CommandSpec s;
    s.name = "trace diff";
    s.summary = "Join two ShardScope traces by op id: step time, peak memory and per-op error.";
    s.description =
        "A is the reference (usually the measured run), B the other (usually the simulation):\n"
        "  shardscope run ... --trace measured.json\n"
        "  shardscope simulate ... --trace simulated.json\n"
        "  shardscope trace diff measured.json simulated.json\n"
        "Ops join by their step-program op id, so both traces must come from the same model,\n"
        "plan and micro-batch. Measured durations are means over ranks and measured steps;\n"
        "step time is the slowest rank's mean step for a measured trace and the last op's end\n"
        "for a simulated one; exposed communication is collective time no compute overlapped.";
    s.positionalsMetavar = "A B";
    s.options = {{"--top", "N", "how many of the largest per-op differences to list", "10"},
                 {"--json", "", "print every joined op and the totals as JSON"}};
    s.examples = {"shardscope trace diff measured.json simulated.json"};
    return {{s, runTraceDiff}};
}

}  // namespace shardscope::cli

namespace shardscope::cli {

namespace {

// `trace overlap`: per FSDP unit and phase, how much communication compute hid.
int runTraceOverlap(const Args& a) {
    const auto& pos = a.positionals();
    if (pos.size() != 1) {
        std::cerr << "error: trace overlap takes one ShardScope trace\n";
        return kExitUsage;
    }
    std::ifstream in(pos[0]);
    if (!in) {
        std::cerr << "error: " << pos[0] << ": cannot open file\n";
        return kExitUsage;
    }
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") ||
        !j["traceEvents"].is_array()) {
        std::cerr << "error: " << pos[0]
                  << ":/traceEvents: expected a Chrome trace with a traceEvents array\n";
        return kExitUsage;
    }
    struct Ev {
        int64_t a, b;
        std::string unit, phase, kind;
    };
    std::map<std::pair<int64_t, int64_t>, std::vector<Ev>> byRankStep;
    for (const auto& e : j["traceEvents"]) {
        if (!e.is_object() || e.value("ph", "") != "X" || !e.contains("args") ||
            !e["args"].is_object() || !e["args"].contains("op_id"))
            continue;
        const auto& ar = e["args"];
        const int64_t t0 = std::llround(e.value("ts", 0.0) * 1000.0);
        const int64_t t1 = t0 + std::llround(e.value("dur", 0.0) * 1000.0);
        byRankStep[{e.value("pid", int64_t{0}), ar.value("step", int64_t{0})}].push_back(
            {t0, t1, ar.value("unit", ""), ar.value("phase", ""), ar.value("kind", "")});
    }
    if (byRankStep.empty()) {
        std::cerr << "error: " << pos[0]
                  << ": no ops with a ShardScope op id (use `shardscope run --trace` or "
                     "`shardscope simulate --trace`; for PyTorch profiler traces, `trace summary` "
                     "gives HTA's overlap)\n";
        return kExitUsage;
    }
    // Per (unit, phase, kind): communication time and the part no compute on the same rank
    // overlapped, averaged over ranks and steps.
    struct Acc {
        double commNs = 0, exposedNs = 0;
        int64_t count = 0;
    };
    std::map<std::tuple<std::string, std::string, std::string>, Acc> acc;
    for (const auto& [key, evs] : byRankStep) {
        std::vector<Interval> compute;
        for (const auto& e : evs)
            if (isComputeKind(e.kind)) compute.push_back({e.a, e.b});
        const auto computeU = mergeIntervals(std::move(compute));
        for (const auto& e : evs) {
            if (!isComm(e.kind)) continue;
            const std::vector<Interval> one{{e.a, e.b}};
            const int64_t hidden = intersectionLength(one, computeU);
            auto& x = acc[{e.unit.empty() ? "<root>" : e.unit, e.phase, e.kind}];
            x.commNs += static_cast<double>(e.b - e.a);
            x.exposedNs += static_cast<double>(e.b - e.a - hidden);
            ++x.count;
        }
    }
    const double samples = static_cast<double>(byRankStep.size());
    std::vector<std::pair<std::tuple<std::string, std::string, std::string>, Acc>> rows(acc.begin(),
                                                                                        acc.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& x, const auto& y) { return x.second.exposedNs > y.second.exposedNs; });
    double comm = 0, exposed = 0;
    for (const auto& [_, v] : rows) {
        comm += v.commNs;
        exposed += v.exposedNs;
    }
    if (a.flag("--json")) {
        nlohmann::json out = nlohmann::json::array();
        for (const auto& [k, v] : rows)
            out.push_back({{"unit", std::get<0>(k)},
                           {"phase", std::get<1>(k)},
                           {"kind", std::get<2>(k)},
                           {"comm_ns_per_step", v.commNs / samples},
                           {"exposed_ns_per_step", v.exposedNs / samples}});
        return emitJson({{"trace", pos[0]},
                         {"rank_steps", byRankStep.size()},
                         {"comm_ns_per_step", comm / samples},
                         {"exposed_ns_per_step", exposed / samples},
                         {"collectives", out}},
                        "")
                       .ok()
                   ? kExitOk
                   : kExitUsage;
    }
    std::cout << pos[0] << ": " << byRankStep.size() << " rank-steps; per step, communication "
              << formatMs(comm / samples) << ", of it " << formatMs(exposed / samples)
              << " exposed ("
              << (comm > 0 ? static_cast<int>(std::lround(100.0 * (comm - exposed) / comm)) : 0)
              << "% hidden under compute)\n\n";
    Table t({"UNIT", "PHASE", "COLLECTIVE", "TIME/STEP", "EXPOSED/STEP", "HIDDEN"},
            {false, false, false, true, true, true});
    for (const auto& [k, v] : rows)
        t.row({std::get<0>(k), std::get<1>(k), std::get<2>(k), formatMs(v.commNs / samples),
               formatMs(v.exposedNs / samples),
               v.commNs > 0 ? std::to_string(static_cast<int>(
                                  std::lround(100.0 * (v.commNs - v.exposedNs) / v.commNs))) +
                                  "%"
                            : "-"});
    t.print(std::cout);
    return kExitOk;
}

}  // namespace

std::vector<Command> traceOverlapCommands() {
    CommandSpec s;
    s.name = "trace overlap";
    s.summary = "Exposed communication per FSDP unit, phase and collective in a ShardScope trace.";
    s.description =
        "For a `shardscope run --trace` or `shardscope simulate --trace` file: each collective's\n"
        "time and the part of it no compute on the same rank overlapped (exposed), summed per\n"
        "unit, phase and collective kind and averaged over ranks and steps, largest first\n"
        "(collectives that run at the same time each count their own exposed time).\n"
        "PyTorch profiler traces carry no units: `shardscope trace summary` gives their\n"
        "communication-computation overlap as HTA defines it.";
    s.positionalsMetavar = "TRACE";
    s.options = {{"--json", "", "print JSON"}};
    s.examples = {
        "shardscope trace overlap shardscope-out/tiny-llama.reshard-true.measured-trace.json"};
    return {{s, runTraceOverlap}};
}

}  // namespace shardscope::cli
