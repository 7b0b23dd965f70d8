// SPDX-License-Identifier: Apache-2.0
#include "engine/measure/trace_diff.h"

#include <algorithm>
#include <cmath>

#include "plans/core/intervals.h"

namespace shardscope {

namespace {
int64_t unionLength(std::vector<Interval> v) {
    return totalLength(mergeIntervals(std::move(v)));
}
}  // namespace

DiffSide diffSideOf(const TraceFile& t) {
    DiffSide s;
    s.path = t.path;
    s.producer = t.producer;
    s.measured = t.measured();
    s.ranks = t.ranks;
    s.stepNs = t.stepNs;
    s.peakAllocated = t.peakAllocated;
    // rank 0's (compute, communication) intervals per step, for its exposed communication
    std::map<int32_t, std::pair<std::vector<Interval>, std::vector<Interval>>> rank0;
    for (const TraceOp& op : t.ops) {
        auto& o = s.ops[op.opId];
        o.label = op.label;
        o.kind = op.kind ? opKindName(*op.kind) : "";
        o.unit = op.unit;
        o.phase = op.phase;
        o.sumNs += static_cast<double>(op.endNs - op.startNs);
        ++o.count;
        if (op.rank != 0) continue;
        auto& ps = rank0[op.step];
        if (op.kind && isCollective(*op.kind)) ps.second.push_back({op.startNs, op.endNs});
        if (op.kind && isComputeOp(*op.kind)) ps.first.push_back({op.startNs, op.endNs});
    }
    double exposed = 0;
    for (auto& [_, v] : rank0) {
        std::vector<Interval> both = v.first;
        both.insert(both.end(), v.second.begin(), v.second.end());
        exposed += static_cast<double>(unionLength(both) - unionLength(v.first));
    }
    s.steps = static_cast<int>(rank0.size());
    s.exposedCommNs = rank0.empty() ? 0 : exposed / static_cast<double>(rank0.size());
    return s;
}

OpJoin joinOpIds(const std::map<int64_t, OpKey>& from, const std::map<int64_t, OpKey>& to) {
    OpJoin j;
    for (const auto& [id, key] : from) {
        auto it = to.find(id);
        if (it == to.end()) continue;
        if (it->second != key) {
            j.byKey = true;
            break;
        }
        j.toOf[id] = id;
    }
    if (!j.byKey) return j;
    j.toOf.clear();
    std::map<OpKey, std::vector<int64_t>> toByKey;
    for (const auto& [id, key] : to)
        toByKey[key].push_back(id);
    std::map<OpKey, size_t> seen;
    for (const auto& [id, key] : from) {
        const size_t n = seen[key]++;
        auto it = toByKey.find(key);
        if (it != toByKey.end() && n < it->second.size()) j.toOf[id] = it->second[n];
    }
    return j;
}

TraceDiff diffSides(const DiffSide& A, const DiffSide& B) {
    TraceDiff d;
    auto keys = [](const DiffSide& s) {
        std::map<int64_t, OpKey> k;
        for (const auto& [id, o] : s.ops)
            k[id] = OpKey{o.unit, o.phase, o.kind};
        return k;
    };
    const OpJoin join = joinOpIds(keys(A), keys(B));
    d.joinedByLabel = join.byKey;
    const std::map<int64_t, int64_t>& bOf = join.toOf;  // A's id -> B's
    double absErr = 0, totalA = 0;
    std::map<int64_t, bool> bJoined;
    for (const auto& [id, oa] : A.ops) {
        auto j = bOf.find(id);
        if (j == bOf.end()) {
            ++d.onlyA;
            continue;
        }
        const DiffOp& ob = B.ops.at(j->second);
        bJoined[j->second] = true;
        d.rows.push_back({id, oa.label, oa.kind, oa.mean(), ob.mean()});
        d.byKind[oa.kind].first += oa.mean();
        d.byKind[oa.kind].second += ob.mean();
        absErr += std::abs(ob.mean() - oa.mean());
        totalA += oa.mean();
    }
    for (const auto& [id, _] : B.ops)
        if (!bJoined.count(id)) ++d.onlyB;
    std::sort(d.rows.begin(), d.rows.end(), [](const TraceDiff::Row& x, const TraceDiff::Row& y) {
        return std::abs(x.b - x.a) > std::abs(y.b - y.a);
    });
    d.totalError = totalA > 0 ? absErr / totalA : 0;
    return d;
}

std::vector<int32_t> programOpIdsOf(const std::vector<TraceOp>& ops, const StepProgram& p,
                                    const ResolvedPlan& r, bool& byKey) {
    std::map<int64_t, OpKey> traceKeys, programKeys;
    for (const TraceOp& op : ops)
        if (op.opId >= 0)
            traceKeys.emplace(op.opId,
                              OpKey{op.unit, op.phase, op.kind ? opKindName(*op.kind) : ""});
    for (size_t i = 0; i < p.ops.size(); ++i) {
        const Op& op = p.ops[i];
        programKeys[static_cast<int64_t>(i)] =
            OpKey{r.units[op.unit.index()].name, phaseName(op.phase), opKindName(op.kind)};
    }
    const OpJoin join = joinOpIds(traceKeys, programKeys);
    byKey = join.byKey;
    std::vector<int32_t> ids;
    ids.reserve(ops.size());
    for (const TraceOp& op : ops) {
        auto it = join.toOf.find(op.opId);
        ids.push_back(it == join.toOf.end() ? -1 : static_cast<int32_t>(it->second));
    }
    return ids;
}

}  // namespace shardscope
