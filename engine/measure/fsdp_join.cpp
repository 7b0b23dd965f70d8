// SPDX-License-Identifier: Apache-2.0
#include "engine/measure/fsdp_join.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <unordered_map>

#include "profiler/analysis/fsdp_trace.h"

namespace shardscope {

namespace {

bool startsWith(std::string_view s, std::string_view p) {
    return s.substr(0, p.size()) == p;
}

struct Item {
    OpKind kind;
    Phase phase;
    int32_t unit = -1;  // into the plan
    int32_t step = 0, microBatch = 0;
    int64_t start = 0, end = 0;
};

// A unit's region less its children's spans: the part before the first child and the part
// after the last (what runs between two children is FSDP's and Python's, not the unit's
// modules), or the whole region without children.
void selfSegments(const Interval& region, const std::vector<Interval>& childSpans,
                  std::vector<Interval>& out) {
    int64_t firstChild = INT64_MAX, lastChild = INT64_MIN;
    for (const auto& c : childSpans)
        if (c.first >= region.first && c.second <= region.second) {
            firstChild = std::min(firstChild, c.first);
            lastChild = std::max(lastChild, c.second);
        }
    if (firstChild == INT64_MAX) {
        if (region.second > region.first) out.push_back(region);
        return;
    }
    if (firstChild > region.first) out.emplace_back(region.first, firstChild);
    if (region.second > lastChild) out.emplace_back(lastChild, region.second);
}

// A unit's recompute in its backward `window`: from the first to the last forward-only op
// (`ops`, by start) that ran in it outside the nested units' spans (`children`, as
// selfSegments counts them: those inside the window); {-1, -1} when none did.
// Non-reentrant checkpointing recomputes in one go, at the first saved tensor it needs, and
// stops at the last one forward saved.
Interval recomputeIn(const std::map<std::pair<int32_t, int32_t>, std::vector<Interval>>& ops,
                     std::pair<int32_t, int32_t> slot, Interval window,
                     const std::vector<Interval>& children) {
    Interval recompute{-1, -1};
    const auto it = ops.find(slot);
    if (it == ops.end()) return recompute;
    for (const Interval& op : it->second) {
        if (op.first < window.first || op.second > window.second) continue;
        const bool inChild = std::any_of(children.begin(), children.end(), [&](const Interval& c) {
            return c.first >= window.first && c.second <= window.second && op.first >= c.first &&
                   op.second <= c.second;
        });
        if (inChild) continue;
        recompute.first = recompute.first < 0 ? op.first : std::min(recompute.first, op.first);
        recompute.second = std::max(recompute.second, op.second);
    }
    return recompute;
}

// FSDP1's compute and optimizer step, from its own ranges (its copies are not labelled, so
// the program's copy-in and copy-out ops stay unjoined). Forward: each
// FullyShardedDataParallel.forward range is a unit (the outermost the root, nested ones in order);
// its compute runs from the end of its _pre_forward to the start of its _post_forward, less the
// nested units' forwards. Backward: the pre-backward hooks fire for the root and then the units in
// reverse forward order, the post-backward hooks for the units in reverse order and then
// the root; a unit's backward runs from its pre hook's end to its post hook's start, less
// the nested units' backwards.
void fsdp1ComputeItems(const Trace& t, const FsdpTraceAnalysis& a, const ResolvedPlan& plan,
                       std::vector<Item>& items) {
    const MainThreadWalk walk = mainThreadWalk(t, a.hostLanes);
    struct Times {
        int64_t fwdStart = -1, fwdEnd = -1, preEnd = -1, postStart = -1;
        int64_t bwdPreStart = -1, bwdPreEnd = -1, bwdPostStart = -1, bwdPostEnd = -1;
    };
    // (step, micro-batch, unit) -> times
    std::map<std::tuple<int32_t, int32_t, int32_t>, Times> times;
    struct Open {
        int32_t event;
        int64_t end;
        int32_t unit;  // an FSDP forward range's unit, else -1
    };
    std::vector<Open> stack;
    std::vector<int32_t> micro(walk.steps.size(), -1);
    int32_t nested = 0, preHooks = 0, postHooks = 0;
    // Forward-only ops after the micro-batch's first backward hook: a checkpoint's recompute.
    std::map<std::pair<int32_t, int32_t>, std::vector<Interval>> recomputedOps;
    for (int32_t e : walk.order) {
        const int64_t s = t.start[e], end = s + t.dur[e];
        while (!stack.empty() && stack.back().end <= s)
            stack.pop_back();
        const int32_t step = walk.stepOf(s);
        const std::string& name = t.strings.at(t.name[e]);
        int32_t unit = -1;
        if (step >= 0 && startsWith(name, "Optimizer.step#"))
            items.push_back({OpKind::OptimizerStep, Phase::Optimizer, 0, step, 0, s, end});
        if (step >= 0 && (preHooks > 0 || postHooks > 0) && isForwardOnlyOp(name))
            recomputedOps[{step, std::max(0, micro[static_cast<size_t>(step)])}].emplace_back(s,
                                                                                              end);
        if (step >= 0 && startsWith(name, "FullyShardedDataParallel.")) {
            int32_t& m = micro[static_cast<size_t>(step)];
            int32_t openUnit = -1;
            for (auto it = stack.rbegin(); it != stack.rend() && openUnit < 0; ++it)
                openUnit = it->unit;
            if (name == "FullyShardedDataParallel.forward") {
                if (openUnit < 0) {
                    ++m;
                    nested = preHooks = postHooks = 0;
                    unit = 0;
                } else {
                    unit = ++nested;
                }
                Times& x = times[{step, std::max(0, m), unit}];
                x.fwdStart = s;
                x.fwdEnd = end;
            } else if (name == "FullyShardedDataParallel._pre_forward" && openUnit >= 0) {
                Times& x = times[{step, std::max(0, m), openUnit}];
                if (x.preEnd < 0) x.preEnd = end;
            } else if (name == "FullyShardedDataParallel._post_forward" && openUnit >= 0) {
                times[{step, std::max(0, m), openUnit}].postStart = s;
            } else if (name == "FullyShardedDataParallel._pre_backward_hook") {
                const int32_t j = preHooks++;
                const int32_t u = j == 0 ? 0 : nested + 1 - j;
                if (u >= 0) {
                    Times& x = times[{step, std::max(0, m), u}];
                    x.bwdPreStart = s;
                    x.bwdPreEnd = end;
                }
            } else if (name == "FullyShardedDataParallel._post_backward_hook") {
                const int32_t j = postHooks++;
                const int32_t u = j < nested ? nested - j : 0;
                Times& x = times[{step, std::max(0, m), u}];
                if (x.bwdPostStart < 0) x.bwdPostStart = s;
                x.bwdPostEnd = end;
            }
        }
        stack.push_back({e, end, unit});
    }
    std::map<std::pair<int32_t, int32_t>, std::vector<std::pair<int32_t, Times>>> bySlot;
    for (const auto& [k, x] : times)
        bySlot[{std::get<0>(k), std::get<1>(k)}].emplace_back(std::get<2>(k), x);
    for (const auto& [slot, units] : bySlot) {
        std::vector<Interval> fwdSpans, bwdSpans;
        for (const auto& [_, x] : units) {
            if (x.fwdStart >= 0) fwdSpans.emplace_back(x.fwdStart, x.fwdEnd);
            if (x.bwdPreStart >= 0 && x.bwdPostEnd >= 0)
                bwdSpans.emplace_back(x.bwdPreStart, x.bwdPostEnd);
        }
        for (const auto& [u, x] : units) {
            if (u >= static_cast<int32_t>(plan.units.size())) continue;
            std::vector<Interval> segs, children;
            if (x.preEnd >= 0 && x.postStart >= 0) {
                for (const auto& c : fwdSpans)
                    if (c != Interval{x.fwdStart, x.fwdEnd}) children.push_back(c);
                selfSegments({x.preEnd, x.postStart}, children, segs);
                for (const auto& g : segs)
                    items.push_back({OpKind::Forward, Phase::Forward, u, slot.first, slot.second,
                                     g.first, g.second});
            }
            segs.clear();
            children.clear();
            if (x.bwdPreEnd >= 0 && x.bwdPostStart >= 0) {
                for (const auto& c : bwdSpans)
                    if (c != Interval{x.bwdPreStart, x.bwdPostEnd}) children.push_back(c);
                // A recompute, as in FSDP2's join: the unit's own forward-only ops between its
                // pre-backward hook and its post-backward hook, outside nested units.
                const Interval window{x.bwdPreEnd, x.bwdPostStart};
                const Interval recompute = recomputeIn(recomputedOps, slot, window, children);
                int64_t backwardFrom = window.first;
                if (recompute.first >= 0) {
                    items.push_back({OpKind::Recompute, Phase::Backward, u, slot.first, slot.second,
                                     window.first, recompute.second});
                    backwardFrom = recompute.second;
                }
                selfSegments({backwardFrom, x.bwdPostStart}, children, segs);
                for (const auto& g : segs)
                    items.push_back({OpKind::Backward, Phase::Backward, u, slot.first, slot.second,
                                     g.first, g.second});
            }
        }
    }
}

// Per (step, micro-batch): a unit's forward and backward label times.
struct UnitTimes {
    Interval preForward{-1, -1}, postForward{-1, -1}, preBackward{-1, -1};
    int64_t accumulateStart = -1, backwardEnd = -1;
};

// One rank's FSDP work as items (itemsOf).
class RankItems {
public:
    RankItems(const Trace& trace, const FsdpTraceAnalysis& analysis, const ResolvedPlan& p,
              std::vector<std::string>& n)
        : t(trace), a(analysis), plan(p), notes(n) {}

    std::vector<Item> run() {
        for (const auto& c : a.collectives) {
            if (c.unit < 0 || c.commEvent < 0) continue;
            const OpKind k = c.kind == CollectiveKind::AllGather       ? OpKind::AllGather
                             : c.kind == CollectiveKind::ReduceScatter ? OpKind::ReduceScatter
                                                                       : OpKind::AllReduce;
            items.push_back({k, c.backward ? Phase::Backward : Phase::Forward,
                             planUnit(a.units[static_cast<size_t>(c.unit)].name), c.step,
                             c.microBatch, c.startNs, c.endNs});
        }
        if (a.api != "fsdp2") {
            fsdp1ComputeItems(t, a, plan, items);
            return std::move(items);
        }
        walkLabels();
        computeSegments();
        return std::move(items);
    }

private:
    // The plan's unit of a trace's unit label (-1, noted, when it has none).
    int32_t planUnit(const std::string& label) {
        auto [it, fresh] = unitOfName.try_emplace(label, -1);
        if (fresh) {
            if (a.api == "fsdp1") {
                // "unit k": the k-th unit in forward order, as the plan resolves FSDP1 units.
                const int64_t k = std::strtol(label.c_str() + 5, nullptr, 10);
                if (k >= 0 && k < static_cast<int64_t>(plan.units.size()))
                    it->second = static_cast<int32_t>(k);
            } else if (auto u = plan.findUnit(splitUnitModules(label).front())) {
                it->second = static_cast<int32_t>(u->index());
            } else if (plan.model) {
                // FSDP labels a unit of several modules by their names ("model.norm,
                // lm_head"); the plan may name it otherwise ("norm+head").
                if (auto m = plan.model->findModule(splitUnitModules(label).front()))
                    for (size_t k = 0; k < plan.units.size() && it->second < 0; ++k)
                        for (ModuleId x : plan.units[k].modules)
                            if (x == *m) it->second = static_cast<int32_t>(k);
            }
            if (it->second < 0)
                notes.push_back("the trace's unit \"" + label + "\" is not a unit of the plan");
        }
        return it->second;
    }

    // The main thread's FSDP2 labels in order: each unit's label times per (step,
    // micro-batch), FSDP's copies, the optimizer steps, and the forward-only ops run again in
    // backward (a checkpoint's recompute).
    void walkLabels() {
        const MainThreadWalk walk = mainThreadWalk(t, a.hostLanes);
        struct Open {
            int32_t event;
            int64_t end;
        };
        std::vector<Open> stack;
        std::vector<int32_t> micro(walk.steps.size(), -1);
        bool inBackward = false;
        for (int32_t e : walk.order) {
            const int64_t s = t.start[e], end = s + t.dur[e];
            while (!stack.empty() && stack.back().end <= s)
                stack.pop_back();
            const int32_t step = walk.stepOf(s);
            const std::string& name = t.strings.at(t.name[e]);
            if (step >= 0) {
                int32_t& m = micro[static_cast<size_t>(step)];
                if (name == "FSDP::root_pre_forward") {
                    ++m;
                    inBackward = false;
                }
                const int32_t mb = std::max(0, m);
                const Phase phase = inBackward ? Phase::Backward : Phase::Forward;
                auto enclosing = [&](std::string_view op) -> std::optional<std::string> {
                    for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
                        const auto l = parseFsdp2Label(t.strings.at(t.name[it->event]));
                        if (l && l->op == op) return l->fqn;
                    }
                    return std::nullopt;
                };
                // The root's post-backward callback runs every group's post_backward again
                // (no-ops for those that ran): only the root's own count there.
                const bool inRootCallback =
                    std::any_of(stack.begin(), stack.end(), [&](const Open& op) {
                        return t.strings.at(t.name[op.event]) ==
                               "FSDP::root_post_backward_callback";
                    });
                if (const auto l = parseFsdp2Label(name);
                    l && !(inRootCallback && !l->fqn.empty() &&
                           startsWith(l->op, "FSDP::post_backward"))) {
                    UnitTimes& u = times[{step, mb, l->fqn}];
                    if (l->op == "FSDP::pre_forward") u.preForward = {s, end};
                    if (l->op == "FSDP::post_forward") u.postForward = {s, end};
                    if (l->op == "FSDP::pre_backward") {
                        u.preBackward = {s, end};
                        inBackward = true;
                    }
                    if (l->op == "FSDP::post_backward_accumulate") {
                        if (u.accumulateStart < 0) u.accumulateStart = s;
                        inBackward = true;
                    }
                    if (startsWith(l->op, "FSDP::post_backward"))
                        u.backwardEnd = std::max(u.backwardEnd, end);
                    if (l->op == "FSDP::all_gather_copy_out")
                        items.push_back(
                            {OpKind::CopyOut, phase, planUnit(l->fqn), step, mb, s, end});
                } else if (name == "fsdp::all_gather_copy_in") {
                    if (auto fqn = enclosing("FSDP::all_gather"))
                        items.push_back({OpKind::CopyIn, phase, planUnit(*fqn), step, mb, s, end});
                } else if (name == "fsdp::chunk_cat") {
                    if (auto fqn = enclosing("FSDP::post_backward_reduce"))
                        items.push_back({OpKind::ReduceScatterCopyIn, Phase::Backward,
                                         planUnit(*fqn), step, mb, s, end});
                } else if (inBackward && isForwardOnlyOp(name)) {
                    recomputedOps[{step, mb}].emplace_back(s, end);
                } else if (startsWith(name, "Optimizer.step#")) {
                    items.push_back({OpKind::OptimizerStep, Phase::Optimizer, 0, step, 0, s, end});
                }
            }
            stack.push_back({e, end});
        }
    }

    // Compute segments per (step, micro-batch): what each unit ran between its labels, less
    // the other units' spans inside.
    void computeSegments() {
        std::map<std::pair<int32_t, int32_t>, std::vector<std::pair<std::string, UnitTimes>>>
            bySlot;
        for (const auto& [key, u] : times)
            bySlot[{std::get<0>(key), std::get<1>(key)}].emplace_back(std::get<2>(key), u);
        for (const auto& [slot, units] : bySlot) {
            std::vector<Interval> forwardSpans, backwardSpans;
            for (const auto& [_, u] : units) {
                if (u.preForward.first >= 0 && u.postForward.first >= 0)
                    forwardSpans.emplace_back(u.preForward.first, u.postForward.second);
                if (u.preBackward.first >= 0 && u.backwardEnd >= 0)
                    backwardSpans.emplace_back(u.preBackward.first, u.backwardEnd);
            }
            for (const auto& [fqn, u] : units) {
                const int32_t unit = planUnit(fqn);
                std::vector<Interval> segs;
                if (u.preForward.first >= 0 && u.postForward.first >= 0) {
                    std::vector<Interval> children;
                    for (const auto& c : forwardSpans)
                        if (c != Interval{u.preForward.first, u.postForward.second})
                            children.push_back(c);
                    selfSegments({u.preForward.second, u.postForward.first}, children, segs);
                    for (const auto& g : segs)
                        items.push_back({OpKind::Forward, Phase::Forward, unit, slot.first,
                                         slot.second, g.first, g.second});
                }
                segs.clear();
                if (u.preBackward.first >= 0 && u.accumulateStart >= 0) {
                    std::vector<Interval> children;
                    for (const auto& c : backwardSpans)
                        if (c != Interval{u.preBackward.first, u.backwardEnd})
                            children.push_back(c);
                    // A recompute: the forward ops that ran again in this unit's own backward.
                    const Interval recompute = recomputeIn(
                        recomputedOps, slot, {u.preBackward.second, u.accumulateStart}, children);
                    // The recompute runs first (from the unit's pre-backward: its norms come
                    // before the first forward op counted); the backward is the rest, in one piece.
                    int64_t backwardFrom = u.preBackward.second;
                    if (recompute.first >= 0) {
                        items.push_back({OpKind::Recompute, Phase::Backward, unit, slot.first,
                                         slot.second, u.preBackward.second, recompute.second});
                        backwardFrom = recompute.second;
                    }
                    selfSegments({backwardFrom, u.accumulateStart}, children, segs);
                    for (const auto& g : segs)
                        items.push_back({OpKind::Backward, Phase::Backward, unit, slot.first,
                                         slot.second, g.first, g.second});
                }
            }
        }
    }

    const Trace& t;
    const FsdpTraceAnalysis& a;
    const ResolvedPlan& plan;
    std::vector<std::string>& notes;
    std::vector<Item> items;
    std::unordered_map<std::string, int32_t> unitOfName;
    std::map<std::tuple<int32_t, int32_t, std::string>, UnitTimes> times;
    // Forward-only ops seen in backward (a checkpoint's recompute), per (step, micro-batch).
    std::map<std::pair<int32_t, int32_t>, std::vector<Interval>> recomputedOps;
};

// One rank's FSDP2 work as items.
std::vector<Item> itemsOf(const Trace& t, const FsdpTraceAnalysis& a, const ResolvedPlan& plan,
                          std::vector<std::string>& notes) {
    return RankItems(t, a, plan, notes).run();
}

}  // namespace

Expected<FsdpJoin> joinFsdpTraces(const std::vector<std::pair<std::string, const Trace*>>& ranks,
                                  std::vector<FsdpTraceAnalysis>& analyses,
                                  const ResolvedPlan& plan, const StepProgram& program) {
    FsdpJoin j;
    j.file.producer = "pytorch profiler";
    j.file.path = ranks.empty() ? std::string() : ranks.front().first;
    // The program's ops by (unit, kind, phase, micro-batch), in issue order.
    std::map<std::tuple<int32_t, OpKind, Phase, int32_t>, std::vector<int32_t>> slots;
    for (size_t i = 0; i < program.ops.size(); ++i) {
        const Op& op = program.ops[i];
        // The optimizer runs once a step, whatever micro-batch the program files it under.
        const int32_t micro = op.phase == Phase::Optimizer ? 0 : op.microBatch;
        slots[{static_cast<int32_t>(op.unit.index()), op.kind, op.phase, micro}].push_back(
            static_cast<int32_t>(i));
    }
    double stepMax = 0;
    std::vector<std::string> notes;
    if (analyses.size() != ranks.size())
        return Error{"internal: an FSDP analysis per rank trace expected"};
    std::vector<FsdpTraceAnalysis*> all;
    for (size_t r = 0; r < ranks.size(); ++r) {
        if (analyses[r].api.empty())
            return Error{ranks[r].first +
                         ": no FSDP labels (FSDP::* or FullyShardedDataParallel.*)"};
        all.push_back(&analyses[r]);
    }
    // The measured collectives' time waiting for the last rank to start them: part of what
    // they took, which a simulation of ranks in lockstep has no cause for.
    if (fillPeerWaits(all).matched > 0) {
        // Per step and rank, as `trace overlap` gives it.
        double wait = 0;
        for (const FsdpTraceAnalysis* a : all)
            wait += static_cast<double>(a->peerWaitNs);
        j.peerWaitNsPerStep = wait / static_cast<double>(all.size());
        char b[64];
        std::snprintf(b, sizeof b, "%.2f ms", j.peerWaitNsPerStep * 1e-6);
        notes.push_back(std::string("of the measured collectives, ") + b +
                        " a step and rank was waiting for the last rank to arrive (a straggler, "
                        "not transfer; the simulation runs the ranks in lockstep)");
    }
    for (size_t r = 0; r < ranks.size(); ++r) {
        const Trace& t = *ranks[r].second;
        const FsdpTraceAnalysis& a = analyses[r];
        stepMax = std::max(stepMax, a.stepNs);
        int64_t peak = 0;
        for (const auto& m : a.gpu ? t.memory : t.hostMemory)
            peak = std::max(peak, m.allocated);
        j.file.peakAllocated = std::max(j.file.peakAllocated, static_cast<double>(peak));
        std::vector<Item> items = itemsOf(t, a, plan, notes);
        // A GPU trace's host ranges time the launches: an op took what the work it launched
        // took on the device (collectives are their kernels already).
        if (const DeviceLaunches& launched = a.launched; !launched.empty()) {
            int64_t none = 0;
            for (Item& it : items) {
                if (it.kind == OpKind::AllGather || it.kind == OpKind::ReduceScatter ||
                    it.kind == OpKind::AllReduce)
                    continue;
                const Interval d = launched.spanOf(it.start, it.end);
                if (d.first < 0) {
                    it.end = it.start;  // launched nothing: no device time
                    ++none;
                    continue;
                }
                it.start = d.first;
                it.end = d.second;
            }
            if (none > 0)
                notes.push_back(std::to_string(none) +
                                " host ranges launched no GPU work: 0 ms on the device");
        }
        std::sort(items.begin(), items.end(),
                  [](const Item& x, const Item& y) { return x.start < y.start; });
        std::map<std::tuple<int32_t, int32_t, OpKind, Phase, int32_t>, size_t> next;
        const auto rank = static_cast<int32_t>(r);
        for (const Item& it : items) {
            if (it.unit < 0) {
                ++j.traceOnly;
                continue;
            }
            const auto slot = slots.find({it.unit, it.kind, it.phase, it.microBatch});
            size_t& k = next[{it.step, it.unit, it.kind, it.phase, it.microBatch}];
            if (slot == slots.end() || k >= slot->second.size()) {
                ++j.traceOnly;
                continue;
            }
            const int32_t id = slot->second[k++];
            const Op& op = program.ops[static_cast<size_t>(id)];
            TraceOp m;
            m.opId = id;
            m.rank = rank;
            m.step = it.step;
            m.startNs = it.start;
            m.endNs = it.end;
            m.kind = op.kind;
            m.label = opLabel(plan, op);
            m.unit = plan.units[op.unit.index()].name;
            m.phase = phaseName(op.phase);
            j.file.ops.push_back(std::move(m));
            ++j.joined;
        }
    }
    j.file.ranks = static_cast<int>(ranks.size());
    j.file.stepNs = stepMax;
    std::sort(notes.begin(), notes.end());
    notes.erase(std::unique(notes.begin(), notes.end()), notes.end());
    j.notes = std::move(notes);
    if (j.joined == 0)
        return Error{j.file.path +
                     ": no FSDP op of the trace joins an op of the plan's step program: is it "
                     "the plan that ran? (`shardscope plan recover` reads it from the trace)"};
    return j;
}

TraceFile simulatedStepTrace(const ResolvedPlan& plan, const StepProgram& program,
                             const SimResult& sim, const std::string& what) {
    TraceFile f;
    f.path = what;
    f.producer = "shardscope simulate";
    f.ranks = 1;
    f.stepNs = static_cast<double>(sim.stepNs);
    f.peakAllocated = static_cast<double>(sim.peakAllocated);
    for (size_t i = 0; i < program.ops.size(); ++i) {
        const Op& op = program.ops[i];
        TraceOp m;
        m.opId = static_cast<int32_t>(i);
        m.startNs = sim.start[i];
        m.endNs = sim.end[i];
        m.kind = op.kind;
        m.label = opLabel(plan, op);
        m.unit = plan.units[op.unit.index()].name;
        m.phase = phaseName(op.phase);
        f.ops.push_back(std::move(m));
    }
    return f;
}

}  // namespace shardscope
