// SPDX-License-Identifier: Apache-2.0
#include "profiler/analysis/fsdp_trace.h"

#include "plans/plan/resolve.h"
#include "profiler/analysis/peer_wait.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <unordered_map>

namespace shardscope {

namespace {

bool startsWith(std::string_view s, std::string_view p) {
    return s.substr(0, p.size()) == p;
}

CollectiveKind issueKind(std::string_view name) {
    if (!startsWith(name, "c10d::")) return CollectiveKind::Other;
    if (name.find("barrier") != std::string_view::npos) return CollectiveKind::Other;
    return collectiveKindOf(name.substr(6));
}

int64_t product(const std::vector<int64_t>& d) {
    std::vector<int64_t> clamped;
    for (int64_t x : d)
        clamped.push_back(std::max<int64_t>(0, x));
    return d.empty() ? 0 : shapeElements(clamped);
}

std::optional<DType> dtypeOf(std::string_view s) {
    if (startsWith(s, "c10::")) s.remove_prefix(5);
    if (s == "float" || s == "Float") return DType::Float32;
    if (s == "BFloat16") return DType::BFloat16;
    if (s == "Half") return DType::Float16;
    if (s == "double" || s == "Double") return DType::Float64;
    return std::nullopt;
}

}  // namespace

std::optional<Fsdp2Label> parseFsdp2Label(std::string_view name) {
    if (!startsWith(name, "FSDP::")) return std::nullopt;
    for (std::string_view p : {"FSDP::forward_prefetch for ", "FSDP::backward_prefetch for "})
        if (startsWith(name, p))
            return Fsdp2Label{p.substr(0, p.size() - 5), std::string(name.substr(p.size()))};
    const size_t open = name.find(" (");
    if (open != std::string_view::npos && name.back() == ')')
        return Fsdp2Label{name.substr(0, open),
                          std::string(name.substr(open + 2, name.size() - open - 3))};
    return Fsdp2Label{name, std::string()};
}

std::vector<std::string> splitUnitModules(const std::string& fqn) {
    std::vector<std::string> out;
    size_t from = 0;
    while (true) {
        const size_t comma = fqn.find(", ", from);
        out.push_back(
            fqn.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
        if (comma == std::string::npos) break;
        from = comma + 2;
    }
    return out;
}

namespace {
// The events of `lanes` in time order, a parent before its children. The threads of one
// process that carry FSDP labels take turns (the main thread waits in backward() while
// autograd's device thread runs it), so their events nest as one thread's would.
std::vector<int32_t> eventsOfLanes(const Trace& t, const std::vector<int32_t>& lanes) {
    std::vector<char> in(t.lanes.size(), 0);
    for (int32_t l : lanes)
        if (l >= 0 && static_cast<size_t>(l) < in.size()) in[static_cast<size_t>(l)] = 1;
    std::vector<int32_t> ev;
    for (size_t i = 0; i < t.size(); ++i)
        if (in[static_cast<size_t>(t.lane[i])]) ev.push_back(static_cast<int32_t>(i));
    std::sort(ev.begin(), ev.end(), [&](int32_t x, int32_t y) {
        return t.start[x] != t.start[y] ? t.start[x] < t.start[y] : t.dur[x] > t.dur[y];
    });
    return ev;
}
}  // namespace

std::vector<Interval> hostBusy(const Trace& t, const std::vector<int32_t>& lanes) {
    // The thread is busy while its innermost open range is an op that computes: an op's
    // time less its children's. An op that only encloses FSDP's hook (autograd's
    // evaluate_function around FSDP::pre_backward) is not busy while the hook waits.
    const std::vector<int32_t> ev = eventsOfLanes(t, lanes);
    auto computes = [&](int32_t e) {
        if (t.cls[e] != EventClass::Cpu) return false;
        const std::string& cat = t.strings.at(t.category[e]);
        if (cat != "cpu_op" && cat != "Operator") return false;
        const std::string& n = t.strings.at(t.name[e]);
        return !startsWith(n, "c10d::") && n != "record_param_comms";
    };
    struct Frame {
        int64_t end, cursor;
        bool busy;
    };
    std::vector<Frame> stack;
    std::vector<Interval> v;
    auto close = [&]() {
        const Frame f = stack.back();
        stack.pop_back();
        if (f.busy && f.end > f.cursor) v.emplace_back(f.cursor, f.end);
        if (!stack.empty()) stack.back().cursor = std::max(stack.back().cursor, f.end);
    };
    for (int32_t e : ev) {
        const int64_t s = t.start[e];
        while (!stack.empty() && stack.back().end <= s)
            close();
        int64_t end = s + t.dur[e];
        if (!stack.empty()) {
            Frame& p = stack.back();
            if (p.busy && s > p.cursor) v.emplace_back(p.cursor, s);
            p.cursor = std::max(p.cursor, s);
            end = std::min(end, p.end);  // a child never outlives its parent
        }
        stack.push_back({end, s, computes(e)});
    }
    while (!stack.empty())
        close();
    return mergeIntervals(std::move(v));
}

DeviceLaunches deviceLaunches(const Trace& t, const std::vector<int32_t>& lanes) {
    std::vector<char> in(t.lanes.size(), 0);
    for (int32_t l : lanes)
        if (l >= 0 && static_cast<size_t>(l) < in.size()) in[static_cast<size_t>(l)] = 1;
    std::vector<std::pair<int64_t, Interval>> v;
    for (const auto& [from, to] : t.flowEvents) {
        const auto f = static_cast<size_t>(from), d = static_cast<size_t>(to);
        if (!in[static_cast<size_t>(t.lane[f])] ||
            t.lanes[static_cast<size_t>(t.lane[d])].kind != LaneKind::DeviceStream)
            continue;
        v.push_back({t.start[f], {t.start[d], t.start[d] + t.dur[d]}});
    }
    std::sort(v.begin(), v.end());
    DeviceLaunches dl;
    dl.launchStart.reserve(v.size());
    dl.device.reserve(v.size());
    for (const auto& [ls, iv] : v) {
        dl.launchStart.push_back(ls);
        dl.device.push_back(iv);
    }
    return dl;
}

Interval DeviceLaunches::spanOf(int64_t from, int64_t to) const {
    Interval span{-1, -1};
    for (auto i = static_cast<size_t>(
             std::lower_bound(launchStart.begin(), launchStart.end(), from) - launchStart.begin());
         i < launchStart.size() && launchStart[i] < to; ++i) {
        span.first = span.first < 0 ? device[i].first : std::min(span.first, device[i].first);
        span.second = std::max(span.second, device[i].second);
    }
    return span;
}

MainThreadWalk mainThreadWalk(const Trace& t, const std::vector<int32_t>& lanes) {
    MainThreadWalk w;
    w.order = eventsOfLanes(t, lanes);
    int64_t first = INT64_MAX, last = 0;
    for (int32_t e : w.order) {
        first = std::min(first, t.start[e]);
        last = std::max(last, t.start[e] + t.dur[e]);
        if (startsWith(t.strings.at(t.name[e]), "ProfilerStep#"))
            w.steps.emplace_back(t.start[e], t.start[e] + t.dur[e]);
    }
    w.haveSteps = !w.steps.empty();
    if (!w.haveSteps) w.steps.emplace_back(first == INT64_MAX ? 0 : first, last);
    return w;
}

int32_t MainThreadWalk::stepOf(int64_t ts) const {
    auto it = std::upper_bound(steps.begin(), steps.end(), Interval{ts, INT64_MAX});
    if (it == steps.begin()) return -1;
    --it;
    return ts < it->second ? static_cast<int32_t>(it - steps.begin()) : -1;
}

bool isSdpaKernelOp(std::string_view name) {
    return startsWith(name, "aten::_scaled_dot_product_") &&
           name.find("backward") == std::string_view::npos;
}

bool isForwardOnlyOp(std::string_view name, bool* attention) {
    const bool sdpa = name == "aten::scaled_dot_product_attention";
    if (attention) *attention = sdpa;
    return sdpa || name == "aten::linear" || name == "aten::embedding";
}

namespace {
// One rank's trace walked as analyzeFsdp reads it: the main thread's FSDP ranges in order,
// the units they name, the collectives issued and where they ran.
class FsdpAnalyzer {
public:
    explicit FsdpAnalyzer(const Trace& trace) : t(trace) {
        a.worldSize = t.worldSize;
        a.rank = t.rank;
        a.processGroups = t.processGroups;
    }

    FsdpTraceAnalysis run() {
        if (!findMainThread()) return std::move(a);
        for (int32_t e : walk.order)
            visit(e);
        for (int32_t m : microOfStep)
            a.microBatches = std::max(a.microBatches, m);
        if (a.api == "fsdp1") matchFsdp1Backward();
        locateCollectives();
        exposedTimes();
        perUnit();
        sortUnits();
        batchAndSeq();
        return std::move(a);
    }

private:
    bool findMainThread() {
        // The main thread: the host lane with the most FSDP labels.
        std::unordered_map<int32_t, int64_t> labels;
        int64_t fsdp2 = 0, fsdp1 = 0;
        for (size_t i = 0; i < t.size(); ++i) {
            if (t.lanes[static_cast<size_t>(t.lane[i])].kind != LaneKind::HostThread) continue;
            const std::string& n = t.strings.at(t.name[i]);
            if (startsWith(n, "FSDP::")) {
                ++labels[t.lane[i]];
                ++fsdp2;
            } else if (startsWith(n, "FullyShardedDataParallel.")) {
                ++labels[t.lane[i]];
                ++fsdp1;
            }
        }
        if (labels.empty()) {
            a.notes.push_back(
                "no FSDP record_function labels (FSDP::* or FullyShardedDataParallel.*) in the "
                "trace: not an FSDP run, or profiled without CPU activity");
            return false;
        }
        a.api = fsdp2 >= fsdp1 ? "fsdp2" : "fsdp1";
        a.mainLane =
            std::max_element(labels.begin(), labels.end(), [](const auto& x, const auto& y) {
                return x.second < y.second;
            })->first;

        for (const auto& [lane, n] : labels)
            if (t.lanes[static_cast<size_t>(lane)].pid ==
                t.lanes[static_cast<size_t>(a.mainLane)].pid)
                a.hostLanes.push_back(lane);
        std::sort(a.hostLanes.begin(), a.hostLanes.end());
        walk = mainThreadWalk(t, a.hostLanes);
        const std::vector<Interval>& steps = walk.steps;
        if (!walk.haveSteps)
            a.notes.push_back("no ProfilerStep ranges: the whole trace is taken as one step");
        a.steps = static_cast<int32_t>(steps.size());
        // On a GPU the host runs ahead of the device: a step takes what its launches took there.
        a.launched = deviceLaunches(t, a.hostLanes);
        for (const auto& s : steps) {
            const Interval d = a.launched.spanOf(s.first, s.second);
            a.stepNs += static_cast<double>(d.first >= 0 ? d.second - d.first : s.second - s.first);
        }
        a.stepNs /= static_cast<double>(steps.size());
        microOfStep.assign(steps.size(), 0);
        return true;
    }

    int32_t stepOf(int64_t ts) const { return walk.stepOf(ts); }

    int32_t unitOf(const std::string& fqn) {
        auto [it, fresh] = unitIndex.try_emplace(fqn, static_cast<int32_t>(a.units.size()));
        if (fresh) {
            FsdpUnit u;
            u.name = fqn;
            u.modules = splitUnitModules(fqn);
            a.units.push_back(std::move(u));
        }
        return it->second;
    }
    static void addTarget(std::vector<std::string>& v, const std::string& x) {
        if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
    }

    // A forward-only op (isForwardOnlyOp) that ran in unit u: in forward, the unit's own; in
    // backward, its recompute's. u -1: none.
    void countForwardOnly(int32_t u, bool sdpa) {
        if (u < 0) return;
        FsdpUnit& unit = a.units[static_cast<size_t>(u)];
        (inBackward ? unit.recomputedOps : unit.forwardOps) += !sdpa;
        (inBackward ? unit.recomputedAttention : unit.forwardAttention) += sdpa;
    }
    // A record inside a record of itself on its thread: a selective policy's dispatch mode
    // records an op around the op's own record (FsdpUnit::policyForwardMm).
    bool nestedInItself(int32_t e, int64_t end) {
        for (auto it = stack.rbegin(); it != stack.rend(); ++it)
            if (t.lane[it->event] == t.lane[e] && t.name[it->event] == t.name[e] && it->end >= end)
                return true;  // the mode's own records may lie between the two
        return false;
    }
    // An mm or SDPA kernel op that ran under a selective policy, counted in unit u.
    void countPolicyOp(int32_t u, int32_t e, const std::string& name, int64_t end) {
        const bool mm = name == "aten::mm";
        if (u < 0 || !(mm || isSdpaKernelOp(name)) || !nestedInItself(e, end)) return;
        FsdpUnit& unit = a.units[static_cast<size_t>(u)];
        (mm ? (inBackward ? unit.policyRecomputedMm : unit.policyForwardMm)
            : (inBackward ? unit.policyRecomputedSdpa : unit.policyForwardSdpa)) += 1;
        if (!inBackward) ++unit.policyForwardNested;
    }
    // A forward-only op (counted once: a policy's inner record of it only marks the unit) or
    // an op a policy handles, in unit u.
    void countForwardOp(int32_t u, int32_t e, const std::string& name, int64_t end) {
        if (bool sdpa = false; !isForwardOnlyOp(name, &sdpa))
            countPolicyOp(u, e, name, end);
        else if (!nestedInItself(e, end))
            countForwardOnly(u, sdpa);
        else if (u >= 0 && !inBackward)
            ++a.units[static_cast<size_t>(u)].policyForwardNested;
    }
    // FSDP2's own copies, by the innermost FSDP range open on the op's thread: a copy into
    // the unsharded storage right inside a pre-forward or pre-backward (over one rank; with
    // record_shapes the cast before it, of another source dtype, is left out), and the
    // reduce dtype of a post-backward's fsdp::chunk_cat (its output's).
    void countFsdp2Copy(int32_t e, const std::string& name) {
        const std::string* range = nullptr;
        for (auto it = stack.rbegin(); it != stack.rend() && !range; ++it)
            if (t.lane[it->event] == t.lane[e] &&
                startsWith(t.strings.at(t.name[it->event]), "FSDP::"))
                range = &t.strings.at(t.name[it->event]);
        const auto l = range ? parseFsdp2Label(*range) : std::nullopt;
        if (!l) return;
        const auto in = t.opInputs.find(e);
        const std::vector<std::string>* types =
            in != t.opInputs.end() ? &in->second.types : nullptr;
        FsdpUnit& u = a.units[static_cast<size_t>(unitOf(l->fqn))];
        if (name == "fsdp::chunk_cat") {
            if (types && !types->empty() && u.chunkCatDtype.empty())
                u.chunkCatDtype = types->back();
            return;
        }
        if (l->op != "FSDP::pre_forward" && l->op != "FSDP::pre_backward") return;
        if (types && types->size() >= 2 && (*types)[0] != (*types)[1]) return;  // the cast
        (l->op == "FSDP::pre_forward" ? u.forwardLocalCopies : u.backwardLocalCopies) += 1;
        if (types && !types->empty() && u.localCopyDtype.empty()) u.localCopyDtype = (*types)[0];
    }

    void visit(int32_t e) {
        const int64_t s = t.start[e];
        while (!stack.empty() && stack.back().end <= s)
            stack.pop_back();
        const std::string& name = t.strings.at(t.name[e]);
        const int32_t step = stepOf(s);
        const int64_t end = s + t.dur[e];
        visitFsdp2(e, name, step, end);
        visitFsdp1(e, name, step, end);
        visitCollective(e, name, step, s, end);
        stack.push_back({e, end});
    }

    // FSDP2's ranges: micro-batches, units in forward and backward order, prefetch targets.
    void visitFsdp2(int32_t e, const std::string& name, int32_t step, int64_t end) {
        if (step >= 0 && a.api == "fsdp2") {
            if (name == "FSDP::root_pre_forward") {
                ++microOfStep[static_cast<size_t>(step)];
                inBackward = false;
                lastPreForward = lastPreBackward = -1;
                forwardStack.clear();
            }
            // Forward-only ops: in forward, the unit's own; in backward, a recompute's.
            countForwardOp(inBackward             ? lastPreBackward
                           : forwardStack.empty() ? -1
                                                  : forwardStack.back(),
                           e, name, end);
            if (name == "aten::copy_" || name == "fsdp::chunk_cat") countFsdp2Copy(e, name);
            if (startsWith(name, "FSDP::post_backward")) inBackward = true;
            if (const auto l = parseFsdp2Label(name)) {
                if (l->op == "FSDP::pre_forward") {
                    lastPreForward = unitOf(l->fqn);
                    forwardStack.push_back(lastPreForward);
                    FsdpUnit& u = a.units[static_cast<size_t>(lastPreForward)];
                    if (u.forwardPos < 0) u.forwardPos = fwdCounter++;
                } else if (l->op == "FSDP::post_forward") {
                    const int32_t done = unitOf(l->fqn);
                    const auto it = std::find(forwardStack.rbegin(), forwardStack.rend(), done);
                    if (it != forwardStack.rend()) forwardStack.erase(std::next(it).base());
                    FsdpUnit& u = a.units[static_cast<size_t>(done)];
                    if (u.postForwardPos < 0) u.postForwardPos = postFwdCounter++;
                } else if (l->op == "FSDP::pre_backward") {
                    lastPreBackward = unitOf(l->fqn);
                    inBackward = true;
                    FsdpUnit& u = a.units[static_cast<size_t>(lastPreBackward)];
                    if (u.backwardPos < 0) u.backwardPos = bwdCounter++;
                } else if (l->op == "FSDP::forward_prefetch" ||
                           l->op == "FSDP::backward_prefetch") {
                    // Implicit backward prefetch runs inside the issuer's pre_backward;
                    // explicit lists run right after its pre_forward / pre_backward.
                    const bool fwd = l->op == "FSDP::forward_prefetch";
                    const int32_t target = unitOf(l->fqn);
                    const int32_t by = fwd ? lastPreForward : lastPreBackward;
                    if (by >= 0) {
                        FsdpUnit& issuer = a.units[static_cast<size_t>(by)];
                        addTarget(fwd ? issuer.forwardPrefetch : issuer.backwardPrefetch,
                                  a.units[static_cast<size_t>(target)].name);
                    }
                }
            }
        }
    }

    void visitFsdp1(int32_t e, const std::string& name, int32_t step, int64_t end) {
        // FSDP1's forward-only ops: in forward, those of the innermost unit whose forward
        // range holds them; in backward, a recompute's, in the unit whose pre-backward hook
        // fired last (it fires as the unit's output gradient is made, before autograd
        // reaches the saved tensors that start a non-reentrant recompute).
        if (step >= 0 && a.api == "fsdp1" &&
            (isForwardOnlyOp(name) || name == "aten::mm" || isSdpaKernelOp(name))) {
            int32_t u = inBackward ? fsdp1LastPreBackward : -1;
            if (!inBackward)
                for (auto it = stack.rbegin(); it != stack.rend() && u < 0; ++it)
                    if (const auto f = fsdp1UnitOf.find(it->event); f != fsdp1UnitOf.end())
                        u = f->second;
            countForwardOp(u, e, name, end);
        }
        // FSDP1: every FSDP instance's forward is a FullyShardedDataParallel.forward range;
        // the outermost is the root (a micro-batch), nested ones are the units in order.
        if (step >= 0 && a.api == "fsdp1" && name == "FullyShardedDataParallel.forward") {
            const bool nested = std::any_of(stack.begin(), stack.end(), [&](const Open& op) {
                return t.strings.at(t.name[op.event]) == "FullyShardedDataParallel.forward";
            });
            if (!nested) {
                ++microOfStep[static_cast<size_t>(step)];
                fsdp1Forward = 0;
                inBackward = false;
                fsdp1LastPreBackward = -1;
            }
            const int32_t u = unitOf("unit " + std::to_string(nested ? ++fsdp1Forward : 0));
            fsdp1UnitOf[e] = u;
            if (a.units[static_cast<size_t>(u)].forwardPos < 0)
                a.units[static_cast<size_t>(u)].forwardPos = fwdCounter++;
        }
        if (a.api == "fsdp1" && (name == "FullyShardedDataParallel._pre_backward_hook" ||
                                 name == "FullyShardedDataParallel._post_backward_hook")) {
            if (!inBackward) fsdp1Hook = 0;
            inBackward = true;
        }
        // FSDP1's pre-backward hooks fire as gradients reach each unit's outputs: the
        // root's first, then the units in reverse forward order.
        if (step >= 0 && a.api == "fsdp1" &&
            name == "FullyShardedDataParallel._pre_backward_hook") {
            const int32_t j = fsdp1Hook++;
            const int32_t k = j == 0 ? 0 : fsdp1Forward + 1 - j;
            if (k >= 0) {
                const int32_t u = unitOf("unit " + std::to_string(k));
                fsdp1UnitOf[e] = u;
                fsdp1LastPreBackward = u;
                if (a.units[static_cast<size_t>(u)].backwardPos < 0)
                    a.units[static_cast<size_t>(u)].backwardPos = bwdCounter++;
            }
        }
    }

    // A collective issued on the main thread, with its sizes, unit and issuer.
    void visitCollective(int32_t e, const std::string& name, int32_t step, int64_t s, int64_t end) {
        const CollectiveKind kind = issueKind(name);
        if (step >= 0 && kind != CollectiveKind::Other) {
            FsdpCollectiveUse c;
            c.kind = kind;
            c.issueEvent = e;
            c.step = step;
            c.microBatch = std::max(0, microOfStep[static_cast<size_t>(step)] - 1);
            c.startNs = s;
            c.endNs = end;
            if (auto it = t.opInputs.find(e); it != t.opInputs.end()) {
                const auto& in = it->second;
                // c10d::_allgather_base_(output, input), _reduce_scatter_base_(output, input),
                // allreduce_(tensors): sizes from the shapes; the group from their ratio.
                if (!in.dims.empty()) c.outputElements = product(in.dims[0]);
                c.inputElements = in.dims.size() > 1 ? product(in.dims[1]) : c.outputElements;
                if (kind == CollectiveKind::AllReduce) c.inputElements = c.outputElements;
                if (!in.types.empty()) c.dtype = in.types.size() > 1 ? in.types[1] : in.types[0];
                if (kind == CollectiveKind::AllGather && c.inputElements > 0)
                    c.groupSize = static_cast<int32_t>(c.outputElements / c.inputElements);
                if (kind == CollectiveKind::ReduceScatter && c.outputElements > 0)
                    c.groupSize = static_cast<int32_t>(c.inputElements / c.outputElements);
            }
            c.backward = inBackward;
            if (a.api == "fsdp2") c.issuer = inBackward ? lastPreBackward : lastPreForward;
            // Context from the enclosing ranges.
            for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
                const std::string& h = t.strings.at(t.name[it->event]);
                if (a.api == "fsdp2") {
                    const auto l = parseFsdp2Label(h);
                    if (!l) continue;
                    if (c.unit < 0 &&
                        ((kind == CollectiveKind::AllGather && l->op == "FSDP::all_gather") ||
                         (kind != CollectiveKind::AllGather &&
                          l->op == "FSDP::post_backward_reduce")))
                        c.unit = unitOf(l->fqn);
                    if (l->op == "FSDP::forward_prefetch" || l->op == "FSDP::backward_prefetch")
                        c.prefetch = true;
                } else {
                    if (startsWith(h, "FullyShardedDataParallel.") &&
                        h.find("prefetch") != std::string::npos)
                        c.prefetch = true;
                    if (kind == CollectiveKind::AllGather) {
                        if (h == "FullyShardedDataParallel._pre_backward_prefetch")
                            a.fsdp1BackwardPrefetch = "BACKWARD_PRE";
                        else if (h == "FullyShardedDataParallel._post_backward_prefetch")
                            a.fsdp1BackwardPrefetch = "BACKWARD_POST";
                        else if (h == "FullyShardedDataParallel._pre_forward_prefetch")
                            a.fsdp1ForwardPrefetch = true;
                    }
                }
            }
            if (a.api == "fsdp1") {
                const bool inFsdp = std::any_of(stack.begin(), stack.end(), [&](const Open& op) {
                    return startsWith(t.strings.at(t.name[op.event]), "FullyShardedDataParallel.");
                });
                int32_t open = -1;  // the innermost FSDP forward's unit
                for (auto it = stack.rbegin(); it != stack.rend() && open < 0; ++it)
                    if (auto f = fsdp1UnitOf.find(it->event); f != fsdp1UnitOf.end())
                        open = f->second;
                if (inFsdp && !c.backward && kind == CollectiveKind::AllGather && open >= 0) {
                    // The open forward's unit, or when prefetched the next one in order.
                    c.issuer = open;
                    c.unit = c.prefetch ? unitOf("unit " + std::to_string(fsdp1Forward + 1)) : open;
                } else if (inFsdp) {
                    c.unit = -2;  // backward: matched by order and size below
                    c.issuer = open;
                }
            }
            a.collectives.push_back(std::move(c));
        }
    }

    // FSDP1 backward: all-gathers and reduce-scatters run in reverse forward order; each
    // goes to the next unit (in that order, per micro-batch) with the same shard size.
    void matchFsdp1Backward() {
        for (auto& c : a.collectives) {
            if (c.kind == CollectiveKind::AllGather && !c.backward && c.unit >= 0) {
                FsdpUnit& u = a.units[static_cast<size_t>(c.unit)];
                if (u.shardElements == 0) u.shardElements = c.inputElements;
            }
        }
        std::vector<int32_t> reverse;
        for (size_t i = 0; i < a.units.size(); ++i)
            reverse.push_back(static_cast<int32_t>(i));
        std::sort(reverse.begin(), reverse.end(), [&](int32_t x, int32_t y) {
            return a.units[x].forwardPos > a.units[y].forwardPos;
        });
        std::map<std::tuple<int32_t, int32_t, int>, size_t> next;  // (step, micro, kind) -> pos
        for (auto& c : a.collectives) {
            if (c.unit != -2) continue;
            const int64_t shard =
                c.kind == CollectiveKind::AllGather ? c.inputElements : c.outputElements;
            size_t& pos = next[{c.step, c.microBatch, static_cast<int>(c.kind)}];
            c.unit = -1;
            for (size_t k = pos; k < reverse.size(); ++k)
                if (a.units[static_cast<size_t>(reverse[k])].shardElements == shard) {
                    c.unit = reverse[k];
                    pos = k + 1;
                    break;
                }
        }
    }

    // Where each collective ran: its device kernel, or the Gloo range it issued.
    void locateCollectives() {
        std::vector<int32_t> comm;  // communication events (device kernels or Gloo ranges)
        for (size_t i = 0; i < t.size(); ++i)
            if (t.cls[i] == EventClass::Communication) comm.push_back(static_cast<int32_t>(i));
        // A GPU run: collectives ran as device kernels, or (one rank, which FSDP2 does not
        // gather for) the trace has device work at all.
        a.gpu = std::any_of(comm.begin(), comm.end(),
                            [&](int32_t e) {
                                return t.lanes[static_cast<size_t>(t.lane[e])].kind ==
                                       LaneKind::DeviceStream;
                            }) ||
                (comm.empty() && std::any_of(t.lane.begin(), t.lane.end(), [&](int32_t l) {
                     return t.lanes[static_cast<size_t>(l)].kind == LaneKind::DeviceStream;
                 }));
        std::unordered_map<int32_t, const Collective*> collOfEvent;
        for (const auto& c : t.collectives)
            collOfEvent[c.event] = &c;
        if (a.gpu) {
            // Launch flows: host launch -> device kernel; a collective's kernel is the
            // communication kernel launched from inside its issuing op.
            std::vector<std::pair<int32_t, int32_t>> flows;
            for (const auto& [from, to] : t.flowEvents)
                if (t.cls[static_cast<size_t>(to)] == EventClass::Communication &&
                    std::find(a.hostLanes.begin(), a.hostLanes.end(),
                              t.lane[static_cast<size_t>(from)]) != a.hostLanes.end())
                    flows.emplace_back(from, to);
            std::sort(flows.begin(), flows.end(), [&](const auto& x, const auto& y) {
                return t.start[x.first] < t.start[y.first];
            });
            for (auto& c : a.collectives) {
                auto it = std::lower_bound(
                    flows.begin(), flows.end(), c.startNs,
                    [&](const auto& f, int64_t ts) { return t.start[f.first] < ts; });
                for (; it != flows.end() && t.start[it->first] < c.endNs; ++it) {
                    c.commEvent = it->second;
                    break;
                }
            }
        } else {
            std::sort(comm.begin(), comm.end(),
                      [&](int32_t x, int32_t y) { return t.start[x] < t.start[y]; });
            std::vector<bool> used(comm.size(), false);
            size_t firstFree = 0;
            for (auto& c : a.collectives) {
                while (firstFree < comm.size() && used[firstFree])
                    ++firstFree;
                for (size_t k = firstFree; k < comm.size() && k < firstFree + 64; ++k) {
                    if (used[k]) continue;
                    const int32_t e = comm[k];
                    if (t.start[e] + 1000 < c.startNs) continue;  // began before it was issued
                    const auto cit = collOfEvent.find(e);
                    if (cit == collOfEvent.end()) continue;
                    const Collective& g = *cit->second;
                    const CollectiveKind gk = collectiveKindOf(g.name);
                    // Gloo runs a reduce-scatter as an all-reduce of the full input.
                    const bool kindOk = gk == c.kind || (c.kind == CollectiveKind::ReduceScatter &&
                                                         gk == CollectiveKind::AllReduce);
                    const bool sizeOk = g.elements == 0 || c.inputElements == 0 ||
                                        g.elements == c.inputElements ||
                                        g.elements == c.outputElements;
                    if (!kindOk || !sizeOk) continue;
                    used[k] = true;
                    c.commEvent = e;
                    // c10d::allgather_ takes tensor lists: the dtype is the Gloo call's.
                    if (c.dtype.empty() || c.dtype == "TensorList") c.dtype = g.dtype;
                    if (c.inputElements == 0) c.inputElements = g.elements;
                    break;
                }
            }
        }
    }

    void exposedTimes() {
        // Exposed time: the collective's interval less the busy union.
        std::vector<Interval> busy;
        if (a.gpu) {
            std::vector<Interval> v;
            for (size_t i = 0; i < t.size(); ++i)
                if (t.cls[i] == EventClass::Computation)
                    v.emplace_back(t.start[i], t.start[i] + t.dur[i]);
            busy = mergeIntervals(std::move(v));
        } else {
            busy = hostBusy(t, a.hostLanes);
        }
        std::vector<Interval> allComm;
        for (auto& c : a.collectives) {
            if (c.commEvent < 0) {
                ++a.unmatched;
                continue;
            }
            c.startNs = t.start[c.commEvent];
            c.endNs = c.startNs + t.dur[c.commEvent];
            const std::vector<Interval> one{{c.startNs, c.endNs}};
            c.exposedNs = (c.endNs - c.startNs) - intersectionLength(one, busy);
            if (c.unit >= 0) allComm.emplace_back(c.startNs, c.endNs);
        }
        const auto commU = mergeIntervals(allComm);
        a.commNs = totalLength(commU) / a.steps;
        a.exposedNs = (totalLength(commU) - intersectionLength(commU, busy)) / a.steps;
        if (a.unmatched > 0)
            a.notes.push_back(std::to_string(a.unmatched) +
                              " collectives were issued but where they ran was not found in the "
                              "trace (their time is not counted)");
    }

    void perUnit() {
        for (auto& c : a.collectives) {
            if (c.unit < 0) continue;
            FsdpUnit& u = a.units[static_cast<size_t>(c.unit)];
            FsdpPhaseStats& p = c.backward ? u.backward : u.forward;
            const int64_t dur = c.commEvent >= 0 ? c.endNs - c.startNs : 0;
            if (c.kind == CollectiveKind::AllGather) {
                ++p.allGathers;
                p.allGatherNs += dur;
                p.allGatherExposedNs += c.exposedNs;
                if (c.issuer >= 0) {
                    const FsdpUnit& by = a.units[static_cast<size_t>(c.issuer)];
                    c.prefetchDistance =
                        c.backward ? u.backwardPos - by.backwardPos : u.forwardPos - by.forwardPos;
                    if (!p.sawAllGather) p.minDistance = p.maxDistance = c.prefetchDistance;
                    p.minDistance = std::min(p.minDistance, c.prefetchDistance);
                    p.maxDistance = std::max(p.maxDistance, c.prefetchDistance);
                }
                p.sawAllGather = true;
                if (c.backward) {
                    if (u.backwardGroup == 0) u.backwardGroup = c.groupSize;
                } else {
                    if (u.forwardGroup == 0) u.forwardGroup = c.groupSize;
                    if (u.shardElements == 0) u.shardElements = c.inputElements;
                    if (u.allGatherDtype.empty()) u.allGatherDtype = c.dtype;
                }
            } else if (c.kind == CollectiveKind::ReduceScatter) {
                ++p.reduceScatters;
                p.reduceScatterNs += dur;
                p.reduceScatterExposedNs += c.exposedNs;
                if (u.reduceDtype.empty()) u.reduceDtype = c.dtype;
            } else if (c.kind == CollectiveKind::AllReduce) {
                ++p.allReduces;
                p.allReduceNs += dur;
                p.allReduceExposedNs += c.exposedNs;
            }
        }
        for (auto& u : a.units)
            for (FsdpPhaseStats* p : {&u.forward, &u.backward}) {
                for (int64_t* x :
                     {&p->allGathers, &p->allGatherNs, &p->allGatherExposedNs, &p->reduceScatters,
                      &p->reduceScatterNs, &p->reduceScatterExposedNs, &p->allReduces,
                      &p->allReduceNs, &p->allReduceExposedNs})
                    *x /= a.steps;
            }
    }

    // Units in forward order; the collectives' unit indices follow.
    void sortUnits() {
        std::stable_sort(a.units.begin(), a.units.end(), [](const FsdpUnit& x, const FsdpUnit& y) {
            const int32_t px = x.forwardPos < 0 ? INT32_MAX : x.forwardPos;
            const int32_t py = y.forwardPos < 0 ? INT32_MAX : y.forwardPos;
            return px < py;
        });
        // Unit indices in collectives follow the sort.
        std::unordered_map<std::string, int32_t> sorted;
        for (size_t i = 0; i < a.units.size(); ++i)
            sorted[a.units[i].name] = static_cast<int32_t>(i);
        std::vector<std::string> before(unitIndex.size());
        for (const auto& [n, i] : unitIndex)
            before[static_cast<size_t>(i)] = n;
        for (auto& c : a.collectives) {
            if (c.unit >= 0) c.unit = sorted[before[static_cast<size_t>(c.unit)]];
            if (c.issuer >= 0) c.issuer = sorted[before[static_cast<size_t>(c.issuer)]];
        }
    }

    void batchAndSeq() {
        for (int32_t e : walk.order) {
            if (t.strings.at(t.name[e]) != "aten::embedding" || stepOf(t.start[e]) < 0) continue;
            const auto it = t.opInputs.find(e);
            if (it == t.opInputs.end() || it->second.dims.size() < 2) continue;
            const auto& idx = it->second.dims[1];
            if (idx.size() == 2) {
                a.microBatchSize = idx[0];
                a.seqLen = idx[1];
            } else if (idx.size() == 1) {
                a.microBatchSize = 1;
                a.seqLen = idx[0];
            }
            break;
        }
    }

    const Trace& t;
    FsdpTraceAnalysis a;
    MainThreadWalk walk;
    std::unordered_map<std::string, int32_t> unitIndex;
    // FSDP1: units numbered by the order of _pre_forward within a forward.
    int32_t fsdp1Forward = 0;
    std::vector<int32_t> microOfStep;  // micro-batches seen in each step
    int32_t fwdCounter = 0, bwdCounter = 0, postFwdCounter = 0;
    int32_t lastPreForward = -1, lastPreBackward = -1;  // the latest pre hook's unit
    bool inBackward = false;            // since the micro-batch's first backward hook
    std::vector<int32_t> forwardStack;  // units between their pre_forward and post_forward
    struct Open {
        int32_t event;
        int64_t end;
    };
    std::vector<Open> stack;
    std::unordered_map<int32_t, int32_t> fsdp1UnitOf;  // FSDP1 forward / hook range -> unit
    int32_t fsdp1Hook = 0;                             // pre-backward hooks this micro-batch
    int32_t fsdp1LastPreBackward = -1;                 // the unit of the latest one
};
}  // namespace

FsdpTraceAnalysis analyzeFsdp(const Trace& t) {
    return FsdpAnalyzer(t).run();
}

PeerWaitFit fillPeerWaits(const std::vector<FsdpTraceAnalysis*>& ranks) {
    // A group DeviceMesh made (its description "mesh_<dimension name>").
    auto isMeshGroup = [](const Trace::ProcessGroup& g) { return g.desc.rfind("mesh_", 0) == 0; };
    // Made first: the smaller of two numeric pg_names (c10d numbers its groups as it makes
    // them), else the one the trace lists first.
    auto createdBefore = [&](const Trace::ProcessGroup& x, const Trace::ProcessGroup& y) {
        const auto number = [](const std::string& s) -> int64_t {
            int64_t v = -1;
            const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
            return ec == std::errc() && end == s.data() + s.size() ? v : -1;
        };
        const int64_t nx = number(x.name), ny = number(y.name);
        if (nx >= 0 && ny >= 0) return nx < ny;
        return &x < &y;  // both in the rank's own pg_config, in its order
    };
    PeerWaitFit fit;
    fit.clockOffsetNs.assign(ranks.size(), 0);
    const auto n = static_cast<int32_t>(ranks.size());
    if (n < 2) return fit;
    // Each collective's group, as indices into `ranks`: every rank given when its size says
    // so; else the group of that size the rank's trace lists (Kineto's pg_config), told
    // apart by the mesh dimension's name where two have the size (HSDP's all-reduce runs
    // over the replicate dimension, its all-gathers and reduce-scatters over the shard one).
    std::map<int64_t, int32_t> indexOfRank;
    for (size_t r = 0; r < ranks.size(); ++r)
        indexOfRank.emplace(ranks[r]->rank, static_cast<int32_t>(r));
    const bool distinctRanks = indexOfRank.size() == ranks.size();
    std::vector<int32_t> everyone(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r)
        everyone[r] = static_cast<int32_t>(r);
    auto groupOf = [&](const FsdpTraceAnalysis& a,
                       const FsdpCollectiveUse& c) -> std::optional<std::vector<int32_t>> {
        const std::optional<std::vector<int32_t>> all =
            c.groupSize == n ? std::optional(everyone) : std::nullopt;
        if (!distinctRanks) return all;
        std::vector<const Trace::ProcessGroup*> candidates;
        for (const auto& g : a.processGroups) {
            if (g.size == a.worldSize || g.ranks.empty() ||
                g.size != static_cast<int64_t>(g.ranks.size()))
                continue;  // the default group, or one the trace does not spell out
            if (c.groupSize > 0 && g.size != c.groupSize) continue;
            const bool replicate = g.desc.find("replicate") != std::string::npos;
            const bool shard = g.desc.find("shard") != std::string::npos;
            if ((c.kind == CollectiveKind::AllReduce && shard && !replicate) ||
                (c.kind != CollectiveKind::AllReduce && replicate && !shard))
                continue;
            candidates.push_back(&g);
        }
        const Trace::ProcessGroup* pick = candidates.size() == 1 ? candidates.front() : nullptr;
        if (candidates.size() == 2 && isMeshGroup(*candidates[0]) && isMeshGroup(*candidates[1])) {
            // Two dimensions of one DeviceMesh of the same size, named neither "shard" nor
            // "replicate" ("mesh_dim_0" and "mesh_dim_1" when unnamed). HSDP replicates over
            // the mesh's dimension 0 and shards over dimension 1 (FSDP2's HSDPMeshInfo,
            // FSDP1's hybrid device mesh), and DeviceMesh makes the groups of its dimensions
            // in that order.
            const bool firstIsDim0 = createdBefore(*candidates[0], *candidates[1]);
            const bool wantDim0 = c.kind == CollectiveKind::AllReduce;
            pick = candidates[firstIsDim0 == wantDim0 ? 0 : 1];
        }
        if (!pick) return all;
        // The group the trace lists, also when its size is the number of traces given (two
        // traces of four ranks need not be one group).
        std::vector<int32_t> members;
        for (int64_t r : pick->ranks) {
            const auto it = indexOfRank.find(r);
            if (it == indexOfRank.end()) return std::nullopt;  // a member's trace not given
            members.push_back(it->second);
        }
        return members;
    };
    bool subgroups = false;  // a collective of a smaller group on any rank
    for (const FsdpTraceAnalysis* a : ranks)
        for (const auto& c : a->collectives)
            subgroups = subgroups || (c.groupSize > 0 && c.groupSize != n);
    std::vector<std::vector<PeerSpan>> spans(ranks.size());
    std::vector<std::vector<size_t>> of(ranks.size());  // per rank: span -> collective
    std::vector<std::vector<int32_t>> groups;           // the smaller groups seen
    std::map<std::vector<int32_t>, int32_t> groupIndex;
    for (size_t r = 0; r < ranks.size(); ++r) {
        const auto& cs = ranks[r]->collectives;
        for (size_t i = 0; i < cs.size(); ++i) {
            const auto& c = cs[i];
            if (c.commEvent < 0 || c.unit < 0) continue;
            std::optional<std::vector<int32_t>> g = groupOf(*ranks[r], c);
            // Of unknown size and no subgroup listed for it: every rank, when no collective
            // shows a smaller group.
            if (!g && c.groupSize == 0 && !subgroups) g = everyone;
            if (!g) continue;
            int32_t group = -1;
            if (*g != everyone) {
                auto [it, fresh] = groupIndex.try_emplace(*g, static_cast<int32_t>(groups.size()));
                if (fresh) groups.push_back(*g);
                group = it->second;
            }
            // Units by name: each rank's unit indices follow its own sort.
            spans[r].push_back({std::to_string(static_cast<int>(c.kind)) + "|" +
                                    ranks[r]->units[static_cast<size_t>(c.unit)].name + "|" +
                                    (c.backward ? "b" : "f") + "|" + std::to_string(c.step) + "|" +
                                    std::to_string(c.microBatch),
                                c.startNs, c.endNs, group});
            of[r].push_back(i);
        }
    }
    const PeerWaits w = peerWaits(spans, groups);
    fit.matched = w.matched;
    fit.clockOffsetNs = w.clockOffsetNs;
    for (size_t r = 0; r < ranks.size(); ++r)
        for (size_t k = 0; k < of[r].size(); ++k)
            if (w.waitNs[r][k] >= 0) ranks[r]->collectives[of[r][k]].peerWaitNs = w.waitNs[r][k];
    if (fit.matched == 0) {
        for (FsdpTraceAnalysis* a : ranks)
            a->notes.push_back(
                "no collective could be matched across the " + std::to_string(n) +
                " ranks given (" +
                (subgroups ? "their collectives run in smaller groups the traces do not list"
                           : "none in common") +
                "): the wait for peers is not known");
        return fit;
    }
    for (FsdpTraceAnalysis* a : ranks) {
        a->peerWaits = true;
        int64_t total = 0;
        std::vector<int64_t> forward(a->units.size()), backward(a->units.size());
        for (const auto& c : a->collectives) {
            if (c.peerWaitNs < 0) continue;
            total += c.peerWaitNs;
            (c.backward ? backward : forward)[static_cast<size_t>(c.unit)] += c.peerWaitNs;
        }
        const int64_t steps = std::max(1, a->steps);
        a->peerWaitNs = total / steps;
        for (size_t u = 0; u < a->units.size(); ++u) {
            a->units[u].forward.peerWaitNs = forward[u] / steps;
            a->units[u].backward.peerWaitNs = backward[u] / steps;
        }
    }
    return fit;
}

namespace {

nlohmann::json phaseJson(const FsdpPhaseStats& p) {
    nlohmann::json j = {{"all_gathers", p.allGathers},
                        {"all_gather_ns", p.allGatherNs},
                        {"all_gather_exposed_ns", p.allGatherExposedNs},
                        {"reduce_scatters", p.reduceScatters},
                        {"reduce_scatter_ns", p.reduceScatterNs},
                        {"reduce_scatter_exposed_ns", p.reduceScatterExposedNs},
                        {"all_reduces", p.allReduces},
                        {"all_reduce_ns", p.allReduceNs},
                        {"all_reduce_exposed_ns", p.allReduceExposedNs}};
    if (p.sawAllGather) j["prefetch_distance"] = {{"min", p.minDistance}, {"max", p.maxDistance}};
    j["peer_wait_ns"] = p.peerWaitNs;
    return j;
}

const char* kindName(CollectiveKind k) {
    switch (k) {
        case CollectiveKind::AllGather:
            return "all_gather";
        case CollectiveKind::ReduceScatter:
            return "reduce_scatter";
        case CollectiveKind::AllReduce:
            return "all_reduce";
        case CollectiveKind::Other:
            break;
    }
    return "other";
}

}  // namespace

nlohmann::json fsdpAnalysisToJson(const FsdpTraceAnalysis& a) {
    nlohmann::json units = nlohmann::json::array();
    for (const auto& u : a.units)
        units.push_back({{"unit", u.name},
                         {"modules", u.modules},
                         {"forward", phaseJson(u.forward)},
                         {"backward", phaseJson(u.backward)},
                         {"forward_prefetch", u.forwardPrefetch},
                         {"backward_prefetch", u.backwardPrefetch},
                         {"shard_elements", u.shardElements},
                         {"all_gather_dtype", u.allGatherDtype},
                         {"reduce_dtype", u.reduceDtype}});
    nlohmann::json colls = nlohmann::json::array();
    for (const auto& c : a.collectives)
        colls.push_back({{"kind", kindName(c.kind)},
                         {"unit", c.unit >= 0 ? nlohmann::json(a.units[c.unit].name) : nullptr},
                         {"phase", c.backward ? "backward" : "forward"},
                         {"step", c.step},
                         {"micro_batch", c.microBatch},
                         {"prefetch", c.prefetch},
                         {"prefetch_distance", c.prefetchDistance},
                         {"start_ns", c.startNs},
                         {"end_ns", c.endNs},
                         {"exposed_ns", c.exposedNs},
                         {"input_elements", c.inputElements},
                         {"output_elements", c.outputElements},
                         {"dtype", c.dtype},
                         {"peer_wait_ns", c.peerWaitNs >= 0 ? nlohmann::json(c.peerWaitNs)
                                                            : nlohmann::json(nullptr)},
                         {"found", c.commEvent >= 0}});
    return {{"api", a.api},
            {"gpu", a.gpu},
            {"steps", a.steps},
            {"micro_batches", a.microBatches},
            {"step_ns", a.stepNs},
            {"comm_ns", a.commNs},
            {"exposed_ns", a.exposedNs},
            {"peer_wait_ns", a.peerWaits ? nlohmann::json(a.peerWaitNs) : nlohmann::json(nullptr)},
            {"unmatched_collectives", a.unmatched},
            {"micro_batch_size", a.microBatchSize},
            {"seq_len", a.seqLen},
            {"world_size", a.worldSize},
            {"units", units},
            {"collectives", colls},
            {"notes", a.notes}};
}

namespace {

// FSDP1: the module class whose units have the trace's shard sizes, unit for unit.
void recoverFsdp1Units(const FsdpTraceAnalysis& a, const ModelGraph* model, RecoveredPlan& r) {
    Plan& p = r.plan;
    p.wrap.kind = WrapPolicySpec::Kind::None;
    std::vector<int64_t> shards;  // forward order, the root first
    for (const auto& u : a.units)
        shards.push_back(u.shardElements);
    if (!model) {
        r.error =
            "FSDP1 does not name its units in the trace; give --model to find the wrap "
            "policy whose units have the sizes the trace's all-gathers show";
        return;
    }
    std::vector<std::string> classes;
    for (const auto& m : model->modules())
        if (!m.fqn.empty() && std::find(classes.begin(), classes.end(), m.cls) == classes.end())
            classes.push_back(m.cls);
    for (const auto& cls : classes) {
        Plan candidate = p;
        candidate.wrap.kind = WrapPolicySpec::Kind::ModuleClass;
        candidate.wrap.classes = {cls};
        const ResolvedPlan rp = resolvePlan(*model, candidate, nullptr, "recovered plan");
        if (rp.hasErrors() || rp.units.size() != shards.size()) continue;
        bool same = true;
        for (size_t i = 0; i < shards.size() && same; ++i)
            same = shards[i] == 0 || rp.units[i].shardedNumel == shards[i];
        if (!same) continue;
        p.wrap = candidate.wrap;
        r.inferred.push_back("wrap: module_class [" + cls + "] (its " +
                             std::to_string(shards.size()) +
                             " FSDP1 units have the trace's all-gather sizes, unit for unit)");
        return;
    }
    r.error = "no module class of the model gives FSDP1 units with the sizes the trace shows (" +
              std::to_string(shards.size()) + " units); is it the model that ran?";
}

}  // namespace

namespace {
// The mesh: the all-gathers' group is the shard dimension; an all-reduce after the
// reduce-scatter is HSDP's replicate dimension. Returns whether there is one.
bool recoverMesh(const FsdpTraceAnalysis& a, RecoveredPlan& r) {
    Plan& p = r.plan;
    int32_t shard = 0;
    bool replicate = false;
    for (const auto& u : a.units) {
        if (shard == 0 && u.forwardGroup > 0) shard = u.forwardGroup;
        replicate = replicate || u.backward.allReduces > 0;
    }
    const int64_t world = a.worldSize > 0 ? a.worldSize : shard;
    if (shard > 0 && replicate && world % shard == 0 && world / shard > 1) {
        p.meshShape = {world / shard, shard};
        p.meshDimNames = {"replicate", "shard"};
        r.inferred.push_back("mesh: [" + std::to_string(world / shard) + ", " +
                             std::to_string(shard) + "] (HSDP: all-gathers over " +
                             std::to_string(shard) + " ranks, gradients all-reduced across the " +
                             std::to_string(world) + "-rank job)");
    } else if (shard > 0) {
        p.meshShape = {shard};
        r.inferred.push_back("mesh: [" + std::to_string(shard) +
                             "] (the all-gathers' output / input sizes)");
    } else if (world == 1 && std::any_of(a.units.begin(), a.units.end(), [](const FsdpUnit& u) {
                   return u.forwardLocalCopies > 0;
               })) {
        p.meshShape = {1};
        r.inferred.push_back(
            "mesh: [1] (one rank: FSDP2 copied the parameters into their storage, no all-gather)");
    } else if (world > 0) {
        p.meshShape = {world};
        r.defaulted.push_back("mesh: the trace's world size " + std::to_string(world) +
                              " (no all-gather shapes: profile with record_shapes=True)");
    } else {
        r.defaulted.push_back(
            "mesh: unknown (no shapes, no distributedInfo); given by the "
            "cluster when simulated");
    }

    return replicate;
}

// FSDP1's units, sharding strategy and prefetch settings.
void recoverFsdp1(const FsdpTraceAnalysis& a, const ModelGraph* model, bool replicate,
                  RecoveredPlan& r) {
    Plan& p = r.plan;
    recoverFsdp1Units(a, model, r);
    bool fullShard = false;
    for (const auto& u : a.units)
        fullShard = fullShard || u.backward.allGathers > 0;
    p.fsdp1.shardingStrategy = replicate   ? (fullShard ? "HYBRID_SHARD" : "_HYBRID_SHARD_ZERO2")
                               : fullShard ? "FULL_SHARD"
                                           : "SHARD_GRAD_OP";
    r.inferred.push_back(
        "fsdp1.sharding_strategy: " + p.fsdp1.shardingStrategy +
        " (all-gathers in backward: " + (fullShard ? "yes" : "no") +
        "; gradients all-reduced after the reduce-scatter: " + (replicate ? "yes" : "no") + ")");
    p.fsdp1.backwardPrefetch = a.fsdp1BackwardPrefetch.empty() ? "NONE" : a.fsdp1BackwardPrefetch;
    p.fsdp1.forwardPrefetch = a.fsdp1ForwardPrefetch;
    r.inferred.push_back("fsdp1.backward_prefetch: " + p.fsdp1.backwardPrefetch +
                         ", forward_prefetch: " + (p.fsdp1.forwardPrefetch ? "true" : "false") +
                         " (the prefetch ranges the all-gathers ran under)");
    r.defaulted.push_back("fsdp1.limit_all_gathers, use_orig_params: defaults");
}

// FSDP2's units in forward order with their reshard and prefetch settings (FSDP1's come
// from its wrap policy). Returns whether parameters were copied in, not gathered (one rank).
bool recoverUnits(const FsdpTraceAnalysis& a, RecoveredPlan& r) {
    Plan& p = r.plan;
    // Units in forward order (the root, always a unit, implicitly).
    if (a.api == "fsdp2") p.wrap.kind = WrapPolicySpec::Kind::None;
    int trueCount = 0, falseCount = 0;
    // Without any all-gather (one rank: FSDP2 gathers nothing) the trace cannot show it:
    // PyTorch's default stands.
    bool anyAllGather = false;
    for (const auto& u : a.units)
        anyAllGather = anyAllGather || u.forward.allGathers > 0 || u.backward.allGathers > 0;
    // Over one rank FSDP2 copies each parameter into its storage where it would gather: in a
    // pre-backward only after resharding.
    bool anyLocalCopy = false;
    for (const auto& u : a.units)
        anyLocalCopy = anyLocalCopy || u.forwardLocalCopies > 0;
    const bool local = !anyAllGather && anyLocalCopy;
    auto reshardOf = [&](const FsdpUnit& u) -> ReshardSetting {
        if (local) return ReshardSetting::ofBool(u.backwardLocalCopies > 0);
        if (!anyAllGather) return ReshardSetting::ofBool(true);
        if (u.backward.allGathers == 0) return ReshardSetting::ofBool(false);
        if (u.backwardGroup > 0 && u.forwardGroup > 0 && u.backwardGroup < u.forwardGroup)
            return ReshardSetting::ofInt(u.backwardGroup);
        return ReshardSetting::ofBool(true);
    };
    for (const auto& u : a.units)
        (reshardOf(u) == ReshardSetting::ofBool(false) ? falseCount : trueCount)++;
    const ReshardSetting majority = ReshardSetting::ofBool(trueCount >= falseCount);
    p.defaults.reshardAfterForward = majority;
    // FSDP2's implicit backward prefetch: the unit before, in post-forward order. A unit
    // with an explicit list prefetches only that list (FSDPState._pre_backward:
    // default_prefetch = not _states_to_backward_prefetch), so a unit's list is explicit
    // exactly when what it prefetched differs from the implicit target.
    auto implicitTargets = [&](const FsdpUnit& u) {
        std::vector<std::string> implicit;
        if (u.postForwardPos > 0)
            for (const auto& v : a.units)
                if (v.postForwardPos == u.postForwardPos - 1) implicit.push_back(v.name);
        return implicit;
    };
    bool explicitBackward = false;
    // A plan names a unit by its first module; FSDP labels a unit of several "a, b".
    auto planName = [&](const std::string& label) { return splitUnitModules(label).front(); };
    auto planNames = [&](const std::vector<std::string>& labels) {
        std::vector<std::string> out;
        for (const auto& l : labels)
            out.push_back(planName(l));
        return out;
    };
    for (const auto& u : a.units) {
        if (a.api != "fsdp2") break;  // FSDP1's units come from its wrap policy
        UnitSpec s;
        s.modules = u.modules;
        const ReshardSetting rs = reshardOf(u);
        if (!(rs == majority)) s.settings.reshardAfterForward = rs;
        if (!u.forwardPrefetch.empty()) s.forwardPrefetch = planNames(u.forwardPrefetch);
        if (!u.backwardPrefetch.empty() && u.backwardPrefetch != implicitTargets(u)) {
            s.backwardPrefetch = planNames(u.backwardPrefetch);
            explicitBackward = true;
        }
        if (u.name.empty() && !s.settings.reshardAfterForward && !s.forwardPrefetch &&
            !s.backwardPrefetch)
            continue;
        p.units.push_back(std::move(s));
    }
    if (a.api == "fsdp2") {
        r.inferred.push_back("units: " + std::to_string(a.units.size()) +
                             " in forward order (FSDP::pre_forward labels)");
        if (anyAllGather)
            r.inferred.push_back(
                "reshard_after_forward: per unit, from whether it all-gathers again in backward "
                "(and over how many ranks)");
        else if (local)
            r.inferred.push_back(
                "reshard_after_forward: per unit, from whether its pre-backward copies its "
                "parameters again (one rank gathers nothing: FSDP2 copies them into their "
                "storage instead)");
        else
            r.defaulted.push_back(
                "reshard_after_forward: true, PyTorch's default (no all-gather in the trace: "
                "one rank gathers nothing, so it cannot show)");
    } else {
        p.defaults.reshardAfterForward.reset();  // FSDP1: the sharding strategy says it
    }
    if (a.api == "fsdp2") {
        bool anyForward = false;
        for (const auto& u : a.units)
            anyForward = anyForward || !u.forwardPrefetch.empty();
        r.inferred.push_back(
            std::string("forward_prefetch: ") +
            (anyForward ? "explicit lists (FSDP::forward_prefetch for ... ranges)" : "none seen"));
        r.inferred.push_back(std::string("backward_prefetch: ") +
                             (explicitBackward ? "explicit lists (targets differ from FSDP2's "
                                                 "implicit previous-unit prefetch)"
                                               : "FSDP2's implicit previous-unit prefetch"));
    }

    return local;
}

// Mixed precision from the collectives' dtypes (the masters are taken to be fp32).
void recoverMixedPrecision(const FsdpTraceAnalysis& a, bool local, RecoveredPlan& r) {
    Plan& p = r.plan;
    std::string ag, rs, copied, chunkCat;
    for (const auto& u : a.units) {
        if (ag.empty()) ag = u.allGatherDtype;
        if (rs.empty()) rs = u.reduceDtype;
        if (copied.empty()) copied = u.localCopyDtype;
        if (chunkCat.empty()) chunkCat = u.chunkCatDtype;
    }
    // One rank: the dtype parameters were copied in and fsdp::chunk_cat's output.
    const bool fromCopies = ag.empty() && local && !copied.empty();
    if (fromCopies) {
        ag = copied;
        if (rs.empty()) rs = chunkCat;
    }
    const auto agT = dtypeOf(ag), rsT = dtypeOf(rs);
    if (agT && *agT != DType::Float32) {
        MixedPrecisionSpec mp;
        mp.paramDtype = agT;
        if (rsT && *rsT != *agT) mp.reduceDtype = rsT;
        p.defaults.mixedPrecision = mp;
        r.inferred.push_back(
            std::string("mixed_precision: param_dtype ") + std::string(dtypeName(*agT)) +
            (rsT ? ", reduce " + std::string(dtypeName(*rsT)) : std::string()) +
            (fromCopies ? " (the dtype parameters were copied in, fsdp::chunk_cat's output)"
                        : " (the collectives' dtypes)"));
    } else if (fromCopies) {
        r.inferred.push_back("mixed_precision: none (parameters copied in " +
                             (agT ? std::string(dtypeName(*agT)) : ag) + ")");
    } else {
        r.inferred.push_back("mixed_precision: none (all-gathers in " +
                             (ag.empty() ? std::string("an unknown dtype") : ag) + ")");
    }
}

// Gradient accumulation, micro-batch size and sequence length.
void recoverTraining(const FsdpTraceAnalysis& a, RecoveredPlan& r) {
    Plan& p = r.plan;
    p.microBatches = a.microBatches;
    r.inferred.push_back("gradient_accumulation.micro_batches: " + std::to_string(a.microBatches) +
                         " (forwards per ProfilerStep)");
    if (a.microBatches > 1) {
        int64_t rsPerStep = 0;
        for (const auto& u : a.units)
            rsPerStep = std::max(rsPerStep, u.backward.reduceScatters);
        p.syncEveryMicroBatch = rsPerStep >= a.microBatches;
        r.inferred.push_back(std::string("gradient_accumulation.sync_every_micro_batch: ") +
                             (p.syncEveryMicroBatch ? "true" : "false") + " (" +
                             std::to_string(rsPerStep) + " reduce-scatters per unit and step)");
    }
    if (a.microBatchSize > 0) {
        p.microBatchSize = a.microBatchSize;
        p.seqLen = a.seqLen;
        p.seqLenDefaulted = false;
        r.inferred.push_back("training: micro_batch_size " + std::to_string(a.microBatchSize) +
                             ", seq_len " + std::to_string(a.seqLen) +
                             " (aten::embedding's input shape)");
    } else {
        r.defaulted.push_back(
            "training: micro_batch_size and seq_len (no aten::embedding "
            "shapes: profile with record_shapes=True)");
    }
}

void recoverCheckpointing(const FsdpTraceAnalysis& a, RecoveredPlan& r) {
    Plan& p = r.plan;
    // A unit whose forward-only ops all run again in its backward recomputes its forward:
    // torch.utils.checkpoint enters each op of the recompute, the one its early stop ends
    // at included. Op-level selective policies (torchtitan's, "attention") enter the
    // same ops and hand back the kept ones' outputs; their dispatch mode shows in nested
    // records of mm and SDPA (FsdpUnit::policyForwardMm), which tell what was kept.
    const bool fsdp1 = a.api == "fsdp1";
    int64_t full = 0, partial = 0, units = 0;
    std::vector<std::string> fullUnits;
    int64_t policyMm = 0, policyMmAgain = 0, policySdpa = 0, policySdpaAgain = 0;
    int64_t policyUnits = 0;
    // A checkpointed attention module ("attention", as samples/apply_plan.py and the
    // engine run it): every SDPA call of the unit and some of its other forward ops ran
    // again, not all of them (the MLP's did not).
    std::vector<std::string> attentionUnits;
    int64_t withAttention = 0;
    for (const auto& u : a.units) {
        // The root is not checkpointed (FSDP1 numbers it unit 0).
        if (u.name.empty() || (fsdp1 && u.name == "unit 0")) continue;
        ++units;
        withAttention += u.forwardAttention > 0;
        if (u.forwardAttention > 0 && u.recomputedAttention >= u.forwardAttention &&
            u.recomputedOps > 0 && u.recomputedOps < u.forwardOps && u.policyForwardNested == 0) {
            attentionUnits.push_back(splitUnitModules(u.name).front());
            continue;
        }
        const bool all = u.forwardOps > 0 && u.recomputedOps >= u.forwardOps &&
                         u.recomputedAttention >= u.forwardAttention;
        if (all) {
            ++full;
            fullUnits.push_back(splitUnitModules(u.name).front());
            if (u.policyForwardNested > 0) ++policyUnits;
            policyMm += u.policyForwardMm;
            policyMmAgain += u.policyRecomputedMm;
            policySdpa += u.policyForwardSdpa;
            policySdpaAgain += u.policyRecomputedSdpa;
        } else if (u.recomputedOps > 0 || u.recomputedAttention > 0) {
            ++partial;
        }
    }
    // Which policy: torchtitan's preset runs about every second mm again and no SDPA; a
    // list that keeps every mm runs none; "attention" keeps all but SDPA.
    AcSpec mode(AcMode::Full);
    std::string modeText = "full";
    std::string policyText;
    if (policyUnits > 0 && policyUnits == full) {
        const bool sdpaKept = policySdpa > 0 && policySdpaAgain == 0;
        const bool mmAllKept = policyMm > 0 && policyMmAgain == 0;
        const bool mmSomeKept = policyMm > 0 && policyMmAgain > 0 && policyMmAgain < policyMm;
        policyText = " (an op-level selective policy: " + std::to_string(policyMmAgain) + " of " +
                     std::to_string(policyMm) + " mm calls and " + std::to_string(policySdpaAgain) +
                     " of " + std::to_string(policySdpa) +
                     " SDPA calls ran again in the recompute)";
        if (mmSomeKept && (sdpaKept || policySdpa == 0)) {
            mode = AcSpec(AcMode::SelectiveOp);
            modeText = "selective_op (torchtitan's preset: every second mm and SDPA kept)";
        } else if (mmAllKept && policySdpa > 0 && !sdpaKept) {
            mode = AcSpec(AcMode::Attention);
            modeText = "attention (everything kept but SDPA)";
        } else {
            mode = AcSpec(AcMode::SelectiveOp);
            if (mmAllKept) mode.save.push_back("mm");
            if (sdpaKept) mode.save.push_back("sdpa");
            modeText = mode.toString();
        }
    }
    // `mode` on the units whose first modules are `names`: the plan's default when they
    // are all the units that could take it.
    auto checkpoint = [&](const std::vector<std::string>& names, bool everyUnit,
                          const AcSpec& mode) {
        if (everyUnit) {
            p.defaults.activationCheckpointing = mode;
            return;
        }
        for (auto& spec : p.units)
            if (!spec.modules.empty() &&
                std::find(names.begin(), names.end(), spec.modules.front()) != names.end())
                spec.settings.activationCheckpointing = mode;
    };
    const std::string fullOn = "activation_checkpointing: " + modeText + " on " +
                               std::to_string(full) + " of " + std::to_string(units) + " units";
    if (full == 0) {
        if (attentionUnits.empty())
            r.inferred.push_back(
                "activation_checkpointing: none (no forward op of a unit ran again in its "
                "backward)");
    } else if (full < units && fsdp1) {
        // FSDP1 names no unit in its trace: the units cannot be listed in the plan.
        r.defaulted.push_back(fullOn + " by the trace, which FSDP1 does not name: left unset");
    } else {
        checkpoint(fullUnits, full == units, mode);
        r.inferred.push_back(fullOn +
                             " (each forward op ran again in the unit's backward: a "
                             "recompute" +
                             (policyText.empty() ? std::string(")") : ")" + policyText));
    }
    if (!attentionUnits.empty()) {
        const std::string on = "activation_checkpointing: attention on " +
                               std::to_string(attentionUnits.size()) + " of " +
                               std::to_string(units) + " units";
        if (fsdp1) {
            r.defaulted.push_back(on + " by the trace, which FSDP1 does not name: left unset");
        } else {
            checkpoint(attentionUnits,
                       full == 0 && static_cast<int64_t>(attentionUnits.size()) == withAttention,
                       AcSpec(AcMode::Attention));
            r.inferred.push_back(on +
                                 " (every SDPA call and some of the unit's other forward "
                                 "ops ran again in its backward, not all: a checkpointed "
                                 "attention module)");
        }
    }
    if (partial > 0)
        r.defaulted.push_back("activation_checkpointing: " + std::to_string(partial) +
                              " unit(s) recomputed part of their forward (a checkpointed "
                              "submodule): left unset");
}
}  // namespace

RecoveredPlan recoverPlan(const FsdpTraceAnalysis& a, const std::string& source,
                          const ModelGraph* model) {
    RecoveredPlan r;
    Plan& p = r.plan;
    p.name = "recovered from " + source;
    p.api = a.api == "fsdp1" ? PlanApi::Fsdp1 : PlanApi::Fsdp2;
    r.inferred.push_back("api: " + a.api + " (its record_function labels)");
    const bool replicate = recoverMesh(a, r);
    if (a.api == "fsdp1") recoverFsdp1(a, model, replicate, r);
    const bool local = recoverUnits(a, r);
    recoverMixedPrecision(a, local, r);
    recoverTraining(a, r);
    recoverCheckpointing(a, r);
    r.defaulted.push_back("offload, reshard_after_backward, gradient_divide_factor: defaults");
    return r;
}

}  // namespace shardscope
