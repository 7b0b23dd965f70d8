// SPDX-License-Identifier: Apache-2.0
#pragma once
// Two traces of one step program joined by op id (`shardscope trace diff`): per side the
// step time, peak memory, exposed communication and each op's mean duration; joined, the
// per-op and per-kind differences and the total per-op error. A side is a ShardScope trace
// (simulated or measured by `shardscope run`) or PyTorch profiler traces joined to the
// program by fsdp_join.h.
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/measure/step_trace.h"

namespace shardscope {

struct DiffOp {
    std::string label, kind, unit, phase;
    double sumNs = 0;
    int count = 0;
    [[nodiscard]] double mean() const { return count ? sumNs / count : 0; }
};

struct DiffSide {
    std::string path, producer;
    bool measured = false;
    int ranks = 0, steps = 0;
    double stepNs = 0;  // measured: the slowest rank's mean step span; simulated: last end
    double peakAllocated = 0;
    double exposedCommNs = 0;       // per step (rank 0)
    std::map<int64_t, DiffOp> ops;  // op id -> mean duration over ranks and steps
};
[[nodiscard]] DiffSide diffSideOf(const TraceFile& t);

// An op as two traces of FSDP steps can both name it: unit, phase, kind.
using OpKey = std::tuple<std::string, std::string, std::string>;
struct OpJoin {
    std::map<int64_t, int64_t> toOf;  // an id of `from` -> the id of `to` naming the same op
    // The ids name different ops (traces of two versions of a program, one with ops the
    // other lacks): joined by key and order of occurrence (the n-th op of a key in id
    // order: micro-batches) instead of by id.
    bool byKey = false;
};
// Joins two id spaces: by id where every id both have names the same op, else by key and
// occurrence. Ids without a counterpart are left out of toOf.
[[nodiscard]] OpJoin joinOpIds(const std::map<int64_t, OpKey>& from,
                               const std::map<int64_t, OpKey>& to);

struct TraceDiff {
    struct Row {
        int64_t id = 0;
        std::string label, kind;
        double a = 0, b = 0;
    };
    std::vector<Row> rows;                                    // largest |b - a| first
    std::map<std::string, std::pair<double, double>> byKind;  // sums of means, A and B
    double totalError = 0;  // sum |B - A| / sum A over the joined ops
    size_t onlyA = 0, onlyB = 0;
    bool joinedByLabel = false;  // OpJoin::byKey
};
[[nodiscard]] TraceDiff diffSides(const DiffSide& a, const DiffSide& b);

// The program op each trace op is (joinOpIds: by id, or for a trace of an earlier version
// of the program, one with ops this one lacks, by unit, phase, kind and order); -1 where
// there is none. `byKey`: whether the ids had to be joined by key.
[[nodiscard]] std::vector<int32_t> programOpIdsOf(const std::vector<TraceOp>& ops,
                                                  const StepProgram& p, const ResolvedPlan& r,
                                                  bool& byKey);

}  // namespace shardscope
