// SPDX-License-Identifier: Apache-2.0
#include "engine/search/search.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "engine/schedule/step_program.h"
#include "plans/plan/resolve.h"

namespace shardscope {

std::vector<ModuleId> findBlocks(const ModelGraph& g) {
    // Parameter elements per subtree, from prefix sums over the pre-order module index.
    std::vector<int64_t> prefix(g.moduleCount() + 1, 0);
    for (size_t i = 0; i < g.moduleCount(); ++i) {
        int64_t own = 0;
        for (ParamId p : g.module(ModuleId(static_cast<int32_t>(i))).params)
            own += g.param(p).numel;
        prefix[i + 1] = prefix[i] + own;
    }
    auto subtree = [&](ModuleId m) {
        return prefix[static_cast<size_t>(g.module(m).subtreeEnd)] - prefix[m.index()];
    };
    // The list holding most parameters wins, then the longer one: a mixture-of-experts
    // layer's experts (128 in Qwen3-30B-A3B, more than its 48 layers) are not the blocks.
    std::vector<ModuleId> best;
    int64_t bestParams = -1;
    for (size_t i = 0; i < g.moduleCount(); ++i) {
        const ModuleId m(static_cast<int32_t>(i));
        const auto& node = g.module(m);
        if (!g.isContainer(m) || node.children.size() < 2) continue;
        const std::string& cls = g.module(node.children[0]).cls;
        bool same = true;
        for (ModuleId c : node.children)
            same = same && g.module(c).cls == cls && !g.isContainer(c);
        if (!same) continue;
        const int64_t params = subtree(m);
        if (params > bestParams || (params == bestParams && node.children.size() > best.size())) {
            best.assign(node.children.begin(), node.children.end());
            bestParams = params;
        }
    }
    return best;
}

namespace {

struct Structure {
    int blocksPerUnit = 1;      // 0: attention and MLP of each block as separate units
    bool separateEnds = false;  // embeddings and head as units of their own
    int hsdpNodes = 0;          // 0: 1D; k: shard across k nodes, replicate across the rest
    bool offload = false;
    bool float8 = false;  // torchao float8 (tensorwise, float8 all-gather, precomputed scales)
};

struct Choice {
    size_t structure = 0;
    PlanVariant variant;
    int64_t microBatch = 1;
    bool syncEvery = false;  // reduce-scatter every micro-batch instead of accumulating unsharded
    int64_t stepNs = 0;
    int64_t peakReserved = 0;
    bool fits = false;
    uint64_t order = 0;  // deterministic tie-break, whatever thread found it
};

// Modules before the blocks (embeddings) and after them (final norm, head), as direct
// children of the blocks' ancestors that hold parameters.
void endModules(const ModelGraph& g, const std::vector<ModuleId>& blocks,
                std::vector<std::string>& first, std::vector<std::string>& last) {
    if (blocks.empty()) return;
    const ModuleId container = g.module(blocks[0]).parent;
    for (ModuleId a = container; a.valid(); a = g.module(a).parent) {
        const ModuleId parent = g.module(a).parent;
        if (!parent.valid()) break;
        for (ModuleId c : g.module(parent).children) {
            if (c == a || g.subtreeNumel(c) == 0) continue;
            (c < a ? first : last).push_back(g.module(c).fqn);
        }
    }
    // Ancestors are visited inner to outer; outer modules come first in forward order.
    std::sort(first.begin(), first.end(), [&](const std::string& x, const std::string& y) {
        return *g.findModule(x) < *g.findModule(y);
    });
    std::sort(last.begin(), last.end(), [&](const std::string& x, const std::string& y) {
        return *g.findModule(x) < *g.findModule(y);
    });
}

// How many micro-batch sizes the search tries (powers of two from 1) and how many
// micro-batches of a long accumulation it simulates before extrapolating.
constexpr size_t kMaxMicroBatchCandidates = 8;
constexpr int64_t kSimulatedMicroBatches = 16;

}  // namespace

int64_t searchGlobalBatch(const ClusterSpec& c, const SearchOptions& o) {
    const int64_t world = c.worldSize();
    const int64_t tokens = int64_t{1} << 22;
    const int64_t gb =
        o.globalBatch > 0 ? o.globalBatch : std::max<int64_t>(world, tokens / o.seqLen);
    return (gb + world - 1) / world * world;
}

namespace {

class Searcher {
public:
    Searcher(const ModelGraph& g, const ClusterSpec& c, const SearchOptions& o)
        : g(g), c(c), o(o), fp32Modules(g.keepFp32Modules()) {}

    SearchResult run() {
        SearchResult res;
        const int64_t world = c.worldSize();
        const int64_t gb = searchGlobalBatch(c, o);
        res.globalBatch = gb;
        perRank = gb / world;
        // Micro-batches: the powers of two dividing the per-rank batch, from 1 up, however
        // many accumulation steps that takes (a long accumulation is simulated over a few
        // micro-batches and extrapolated: see simulateAccumulated). Larger micro-batches
        // than kMaxMicroBatchCandidates allow are left out: memory grows with them, and the
        // search stops at the first that does not fit anyway.
        for (int64_t m = 1; m <= perRank && microBatches.size() < kMaxMicroBatchCandidates; m *= 2)
            if (perRank % m == 0) microBatches.push_back(m);
        if (microBatches.empty()) microBatches.push_back(perRank);
        if (o.microBatch) microBatches = {*o.microBatch};
        res.memoryBudget = static_cast<int64_t>(static_cast<double>(c.device.memoryBytes) *
                                                (1.0 - o.memoryHeadroom));
        budget = res.memoryBudget;
        blocks = findBlocks(g);
        endModules(g, blocks, firstEnds, lastEnds);

        for (bool offload : {false, true}) {
            if (offload && !o.allowOffload) break;
            structures.clear();
            for (int k : {1, 2, 4, 0}) {
                if (k > 1 && (blocks.empty() || static_cast<size_t>(k) > blocks.size() / 2))
                    continue;
                if (k > 1 && o.fsdp1Compatible) continue;
                if (k == 0 && (blocks.empty() || splitChildren(blocks[0]).size() < 2)) continue;
                for (bool ends : {false, true}) {
                    if (ends && firstEnds.empty() && lastEnds.empty()) continue;
                    if (ends && o.fsdp1Compatible && firstEnds.size() + lastEnds.size() > 1)
                        continue;
                    for (int hn : {0, 1, 2, 4}) {
                        if (hn > 0 && (c.nodes < 2 || hn >= c.nodes || c.nodes % hn != 0)) continue;
                        if (hn > 1 && o.fsdp1Compatible) continue;
                        structures.push_back({k, ends, hn, offload, false});
                        if (o.allowFloat8) structures.push_back({k, ends, hn, offload, true});
                    }
                }
            }
            variants.clear();
            const int maxDepth = o.fsdp1Compatible ? 0 : 2;
            for (int rs = 0; rs < (o.fsdp1Compatible ? 2 : 3); ++rs)
                for (int fwd = 0; fwd <= maxDepth; ++fwd)
                    for (int bwd = 0; bwd <= maxDepth; ++bwd)
                        for (DType reduce : o.reduceDtypes)
                            for (AcMode ac : {AcMode::None, AcMode::SelectiveOp, AcMode::Full})
                                for (CompileMode cm : o.compileModes) {
                                    if (o.activationCheckpointing &&
                                        ac != *o.activationCheckpointing)
                                        continue;
                                    PlanVariant v;
                                    if (o.compileModes.size() > 1) v.compile = cm;
                                    v.reshard = rs == 0 ? ReshardSetting::ofBool(true)
                                                : rs == 1
                                                    ? ReshardSetting::ofBool(false)
                                                    : ReshardSetting::ofInt(c.node.devicesPerNode);
                                    v.forwardPrefetchDepth = fwd;
                                    v.backwardPrefetchDepth = bwd;
                                    v.paramDtype = paramDtype();
                                    v.reduceDtype = reduce;
                                    v.ac = ac;
                                    variants.push_back(v);
                                }
            // Variants that share a compile setting run one after another: changing it
            // rebuilds the resolved plan's module runs (applyVariant).
            std::stable_sort(variants.begin(), variants.end(),
                             [](const PlanVariant& x, const PlanVariant& y) {
                                 return x.compile.value_or(CompileMode::None) <
                                        y.compile.value_or(CompileMode::None);
                             });
            size_t perVariant = 0;
            for (int64_t mb : microBatches)
                perVariant += perRank / mb > 1 ? 2 : 1;
            for (const Structure& st : structures)
                res.total += (st.separateEnds ? (o.fsdp1Compatible ? 3 : 4) : 1) * variants.size() *
                             perVariant;
            evaluate(res);
            if (res.cancelled ||
                std::any_of(choices.begin(), choices.end(), [](const Choice& x) { return x.fits; }))
                break;
        }

        // Baseline: each block a unit, reshard True (root False), implicit prefetch,
        // bf16/fp32, no checkpointing; the largest micro-batch that fits.
        res.baseline = baselineCandidate();

        std::vector<const Choice*> sorted;
        for (const auto& ch : choices)
            sorted.push_back(&ch);
        std::sort(sorted.begin(), sorted.end(), [](const Choice* a, const Choice* b) {
            if (a->stepNs != b->stepNs) return a->stepNs < b->stepNs;
            if (a->peakReserved != b->peakReserved) return a->peakReserved < b->peakReserved;
            return a->order < b->order;
        });
        // The front is chosen on the search's figures (reserved is a lower bound for plans
        // that cannot fit), then checked again on the materialized plans' full simulations.
        int64_t lowestMem = INT64_MAX;
        for (const Choice* ch : sorted)
            if (ch->peakReserved < lowestMem) {
                lowestMem = ch->peakReserved;
                Candidate cand = materialize(*ch);
                if (res.pareto.empty() ||
                    cand.sim.peakReserved < res.pareto.back().sim.peakReserved)
                    res.pareto.push_back(std::move(cand));
            }
        for (const Choice* ch : sorted)
            if (ch->fits) {
                res.best = materialize(*ch);
                break;
            }
        // What each allowed option buys: the fastest plan that fits without it.
        auto bestWithout = [&](auto uses) -> std::optional<Candidate> {
            for (const Choice* ch : sorted)
                if (ch->fits && !uses(*ch)) return materialize(*ch);
            return std::nullopt;
        };
        if (o.compileModes.size() > 1 && res.best)
            res.bestEager = bestWithout([](const Choice& ch) {
                return ch.variant.compile.value_or(CompileMode::None) != CompileMode::None;
            });
        if (o.allowFloat8 && res.best)
            res.bestWithoutFloat8 =
                bestWithout([&](const Choice& ch) { return allStructures[ch.structure].float8; });
        if (!res.best && !sorted.empty()) {
            const Choice* least = *std::min_element(
                sorted.begin(), sorted.end(),
                [](const Choice* a, const Choice* b) { return a->peakReserved < b->peakReserved; });
            res.closest = materialize(*least);
        }
        return res;
    }

private:
    const ModelGraph& g;
    const ClusterSpec& c;
    const SearchOptions& o;

    const std::vector<ModuleId> fp32Modules;  // ModelGraph::keepFp32Modules

    // bf16 parameters, but fp32 for FSDP1-compatible plans of a model with modules that
    // compute in fp32 (ModuleNode::keepFp32): FSDP1 gives every unit one MixedPrecision, so
    // a bf16 param_dtype would reach those modules in bf16 (resolvePlan refuses it).
    DType paramDtype() const {
        return o.fsdp1Compatible && !fp32Modules.empty() ? DType::Float32 : DType::BFloat16;
    }
    int64_t perRank = 1, budget = 0;
    std::vector<int64_t> microBatches;
    std::vector<ModuleId> blocks;
    std::vector<std::string> firstEnds, lastEnds;
    std::vector<Structure> structures;
    std::vector<PlanVariant> variants;
    std::vector<Choice> choices;
    std::vector<Structure> allStructures;  // indexed by Choice::structure

    // A block's children worth a unit of their own: those with parameters that are not norms.
    std::vector<ModuleId> splitChildren(ModuleId block) const {
        std::vector<ModuleId> out;
        for (ModuleId ch : g.module(block).children)
            if (g.subtreeNumel(ch) > 0 && g.module(ch).cls.find("Norm") == std::string::npos &&
                !g.isContainer(ch))
                out.push_back(ch);
        return out;
    }

    Plan structuralPlan(const Structure& s) const {
        Plan p;
        p.name = "recommended";
        p.api = PlanApi::Fsdp2;
        if (s.hsdpNodes > 0)
            p.meshShape = {c.nodes / s.hsdpNodes, s.hsdpNodes * c.node.devicesPerNode};
        else
            p.meshShape = {c.worldSize()};
        p.defaults.mixedPrecision = MixedPrecisionSpec{paramDtype(), DType::Float32, {}, true};
        if (s.offload) p.defaults.offload = OffloadSpec{true, true};
        // torchtitan's float8 recipe for FSDP2: tensorwise scaling, weights all-gathered in
        // float8, their scales precomputed once a step.
        if (s.float8) p.defaults.float8 = Float8Spec{true, "tensorwise", true, true};
        if (s.blocksPerUnit == 0) {
            // Attention and MLP (the block's children with parameters other than norms)
            // as units; norms stay with the enclosing unit.
            for (ModuleId b : blocks)
                for (ModuleId ch : splitChildren(b)) {
                    UnitSpec u;
                    u.modules = {g.module(ch).fqn};
                    p.units.push_back(std::move(u));
                }
        }
        for (size_t i = 0; s.blocksPerUnit > 0 && i < blocks.size();
             i += static_cast<size_t>(s.blocksPerUnit)) {
            UnitSpec u;
            for (size_t k = i;
                 k < std::min(blocks.size(), i + static_cast<size_t>(s.blocksPerUnit)); ++k)
                u.modules.push_back(g.module(blocks[k]).fqn);
            p.units.push_back(std::move(u));
        }
        // Modules that compute in fp32 whatever the model's dtype (Ernie-4.5's router gates)
        // gather in fp32 as units of their own; their block's checkpoint covers them.
        for (size_t k = 0; k < fp32Modules.size() && paramDtype() != DType::Float32; ++k) {
            UnitSpec u;
            u.modules = {g.module(fp32Modules[k]).fqn};
            u.settings.mixedPrecision =
                MixedPrecisionSpec{DType::Float32, DType::Float32, {}, true};
            u.settings.activationCheckpointing = AcSpec(AcMode::None);
            p.units.push_back(std::move(u));
        }
        if (s.separateEnds) {
            // Tied embeddings and head must share a unit under FSDP2.
            bool tied = false;
            for (const auto& prm : g.params())
                if (prm.tied()) tied = true;
            if (tied) {
                UnitSpec u;
                u.name = "ends";
                u.modules = firstEnds;
                u.modules.insert(u.modules.end(), lastEnds.begin(), lastEnds.end());
                if (!u.modules.empty()) p.units.push_back(u);
            } else {
                if (!firstEnds.empty()) p.units.push_back({"", firstEnds, {}, {}, {}, ""});
                if (!lastEnds.empty()) p.units.push_back({"", lastEnds, {}, {}, {}, ""});
            }
        }
        p.seqLen = o.seqLen;
        p.seqLenDefaulted = false;
        return p;
    }

    // Structures are independent: they are spread over the machine's cores, each thread
    // with its own results, merged in a deterministic order.
    void evaluate(SearchResult& res) {
        const size_t first = allStructures.size();
        for (const auto& s : structures)
            allStructures.push_back(s);
        std::atomic<size_t> next{0}, evaluated{0}, simulated{0};
        std::atomic<bool> cancelled{false};
        const unsigned cores =
            o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
        const unsigned threads =
            static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(cores, structures.size())));
        std::vector<std::vector<Choice>> local(threads);
        auto worker = [&](unsigned t) {
            for (size_t i; !cancelled && (i = next++) < structures.size();)
                evaluateStructure(first + i, local[t], evaluated, simulated, cancelled,
                                  t == 0 ? &res : nullptr);
        };
        std::vector<std::thread> pool;
        for (unsigned t = 1; t < threads; ++t)
            pool.emplace_back(worker, t);
        worker(0);
        for (auto& th : pool)
            th.join();
        for (auto& l : local)
            choices.insert(choices.end(), l.begin(), l.end());
        res.evaluated += evaluated;
        res.simulated += simulated;
        res.cancelled = res.cancelled || cancelled;
        if (o.progress) o.progress(res.evaluated, res.total);
    }

    void evaluateStructure(size_t sIdx, std::vector<Choice>& out, std::atomic<size_t>& evaluated,
                           std::atomic<size_t>& simulated, std::atomic<bool>& cancelled,
                           SearchResult* progressOf) {
        SimOptions so;
        so.keepTimeline = false;
        so.keepOpTimes = false;
        so.reservedBudget = budget;
        so.expandableSegments = o.expandableSegments;
        ResolvedPlan r = resolvePlan(g, structuralPlan(allStructures[sIdx]), &c, "search");
        size_t perVariant = 0;
        for (int64_t mb : microBatches)
            perVariant += perRank / mb > 1 ? 2 : 1;
        if (r.hasErrors()) {
            evaluated += variants.size() * perVariant;
            return;
        }
        // Embedding and head units, when they are units, are a second class whose
        // reshard_after_forward is chosen apart from the blocks'.
        std::vector<int32_t> ends;
        if (allStructures[sIdx].separateEnds)
            for (size_t u = 0; u < r.units.size(); ++u)
                for (ModuleId m : r.units[u].modules) {
                    const std::string& f = g.module(m).fqn;
                    if (std::find(firstEnds.begin(), firstEnds.end(), f) != firstEnds.end() ||
                        std::find(lastEnds.begin(), lastEnds.end(), f) != lastEnds.end()) {
                        ends.push_back(static_cast<int32_t>(u));
                        break;
                    }
                }
        std::vector<std::optional<ReshardSetting>> endChoices{std::nullopt};
        if (!ends.empty()) {
            endChoices.push_back(ReshardSetting::ofBool(true));
            endChoices.push_back(ReshardSetting::ofBool(false));
            if (!o.fsdp1Compatible)
                endChoices.push_back(ReshardSetting::ofInt(c.node.devicesPerNode));
        }
        for (size_t vi = 0; vi < variants.size(); ++vi)
            for (size_t ei = 0; ei < endChoices.size(); ++ei) {
                PlanVariant v = variants[vi];
                v.endUnits = ends;
                v.endsReshard = endChoices[ei];
                if (!applyVariant(r, v)) {
                    evaluated += perVariant;
                    continue;
                }
                // Memory grows with the micro-batch: once one exceeds the budget (in both
                // sync modes), larger ones cannot fit and are not simulated.
                bool overBudget = false;
                for (size_t mi = 0; mi < microBatches.size(); ++mi) {
                    const int64_t mb = microBatches[mi];
                    if (overBudget) {
                        evaluated += perRank / mb > 1 ? 2 : 1;
                        continue;
                    }
                    bool anyFits = false;
                    for (bool syncEvery : {false, true}) {
                        if (syncEvery && perRank / mb == 1) continue;  // one micro-batch: same plan
                        if (cancelled || (o.cancel && o.cancel->load())) {
                            cancelled = true;
                            return;
                        }
                        r.plan.syncEveryMicroBatch = syncEvery;
                        const SimResult sim = simulateAccumulated(r, mb, perRank / mb, so);
                        const bool fits = sim.peakReserved <= budget;
                        anyFits = anyFits || fits;
                        const uint64_t order =
                            (((static_cast<uint64_t>(sIdx) * 4096 + vi) * 4 + ei) * 64 + mi) * 2 +
                            syncEvery;
                        out.push_back(
                            {sIdx, v, mb, syncEvery, sim.stepNs, sim.peakReserved, fits, order});
                        ++simulated;
                        const size_t done = ++evaluated;
                        if (progressOf && done % 64 == 0 && o.progress)
                            o.progress(done, progressOf->total);
                    }
                    overBudget = !anyFits;
                }
            }
    }

    // A step of `n` micro-batches. Up to kSimulatedMicroBatches they are simulated as they
    // are; beyond, the step program (which grows with n) is simulated with that many and one
    // fewer, and the step time extrapolated by the marginal micro-batch (the middle ones
    // repeat: same collectives, same compute). Memory after the first micro-batch is steady
    // (gradients accumulate in place), so the peak is the larger of the two.
    SimResult simulateAccumulated(const ResolvedPlan& r, int64_t mb, int64_t n,
                                  const SimOptions& so) const {
        const int64_t k = std::min<int64_t>(n, kSimulatedMicroBatches);
        // One program per thread, rebuilt in place: its storage outlives the call.
        thread_local StepProgram prog;
        buildStepProgram(r, {mb, o.seqLen, k, c.node.devicesPerNode}, prog);
        SimResult a = simulate(prog, c, r.worldSize, so);
        if (n == k) return a;
        buildStepProgram(r, {mb, o.seqLen, k - 1, c.node.devicesPerNode}, prog);
        const SimResult b = simulate(prog, c, r.worldSize, so);
        const int64_t marginal = std::max<int64_t>(0, a.stepNs - b.stepNs);
        a.stepNs += (n - k) * marginal;
        a.peakAllocated = std::max(a.peakAllocated, b.peakAllocated);
        a.peakReserved = std::max(a.peakReserved, b.peakReserved);
        return a;
    }

    static std::string granularity(const Structure& s) {
        if (s.blocksPerUnit == 0) return "attention and MLP as units";
        return std::to_string(s.blocksPerUnit) +
               (s.blocksPerUnit > 1 ? " blocks/unit" : " block/unit");
    }
    std::string hsdpText(const Structure& s) const {
        if (s.hsdpNodes == 0) return "";
        return ", HSDP sharding across " + std::to_string(s.hsdpNodes) + " node" +
               (s.hsdpNodes > 1 ? "s" : "") + " (" +
               std::to_string(s.hsdpNodes * c.node.devicesPerNode) + " GPUs)";
    }

    // A complete plan for a choice, re-resolved and re-simulated (with the timeline).
    Candidate materialize(const Choice& ch) const {
        const Structure& s = allStructures[ch.structure];
        Plan p = structuralPlan(s);
        p.microBatchSize = ch.microBatch;
        p.microBatches = perRank / ch.microBatch;
        p.syncEveryMicroBatch = ch.syncEvery;
        p.defaults.mixedPrecision =
            MixedPrecisionSpec{ch.variant.paramDtype, ch.variant.reduceDtype, {}, true};
        // Per-unit settings (the root keeps None) and explicit prefetch of the next units.
        const size_t n = p.units.size();
        std::vector<std::string> names;
        for (const auto& u : p.units)
            names.push_back(u.modules[0]);
        // Forward order of units follows their first module.
        std::vector<size_t> order(n);
        for (size_t i = 0; i < n; ++i)
            order[i] = i;
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            return *g.findModule(p.units[a].modules[0]) < *g.findModule(p.units[b].modules[0]);
        });
        // Units that keep fp32 (structuralPlan) keep their settings and stay out of the
        // prefetch chains, as applyVariant leaves them.
        auto keepsFp32 = [&](const UnitSpec& u) {
            return u.modules.size() == 1 && g.module(*g.findModule(u.modules[0])).keepFp32;
        };
        order.erase(std::remove_if(order.begin(), order.end(),
                                   [&](size_t i) { return keepsFp32(p.units[i]); }),
                    order.end());
        const size_t chained = order.size();
        for (size_t pos = 0; pos < chained; ++pos) {
            UnitSpec& u = p.units[order[pos]];
            if (u.name.empty() && u.modules.size() > 1)
                u.name = u.modules.front() + ".." + u.modules.back();
            const bool isEnd =
                ch.variant.endsReshard &&
                std::any_of(u.modules.begin(), u.modules.end(), [&](const std::string& m) {
                    return std::find(firstEnds.begin(), firstEnds.end(), m) != firstEnds.end() ||
                           std::find(lastEnds.begin(), lastEnds.end(), m) != lastEnds.end();
                });
            u.settings.reshardAfterForward = isEnd ? *ch.variant.endsReshard : ch.variant.reshard;
            u.settings.activationCheckpointing = ch.variant.ac;
            u.settings.compile = ch.variant.compile;
        }
        // With its blocks compiled, the loss is too (applyVariant).
        if (ch.variant.compile) p.compileLoss = *ch.variant.compile != CompileMode::None;
        auto unitName = [&](size_t idx) {
            const UnitSpec& u = p.units[idx];
            return u.name.empty() ? u.modules[0] : u.name;
        };
        for (size_t pos = 0; pos < chained; ++pos) {
            UnitSpec& u = p.units[order[pos]];
            if (ch.variant.forwardPrefetchDepth > 0) {
                std::vector<std::string> f;
                for (int d = 1;
                     d <= ch.variant.forwardPrefetchDepth && pos + static_cast<size_t>(d) < chained;
                     ++d)
                    f.push_back(unitName(order[pos + static_cast<size_t>(d)]));
                u.forwardPrefetch = f;
            }
            if (ch.variant.backwardPrefetchDepth > 0) {
                std::vector<std::string> b;
                for (int d = 1;
                     d <= ch.variant.backwardPrefetchDepth && pos >= static_cast<size_t>(d); ++d)
                    b.push_back(unitName(order[pos - static_cast<size_t>(d)]));
                u.backwardPrefetch = b;
            }
        }
        // Every choice that tells two candidates apart: their embedding/head units' own
        // reshard included (two Pareto rows had printed alike).
        const std::string ends =
            !s.separateEnds ? std::string()
            : ch.variant.endsReshard
                ? ", own embedding/head units (reshard " + ch.variant.endsReshard->toString() + ")"
                : ", own embedding/head units (reshard as the blocks)";
        const size_t fp32Units = n - chained;
        const std::string fp32Text = fp32Units == 0
                                         ? std::string()
                                         : ", " + std::to_string(fp32Units) + " fp32 module" +
                                               (fp32Units > 1 ? "s" : "") + " as fp32 units";
        char summary[400];
        std::snprintf(
            summary, sizeof summary,
            "%s%s%s, reshard %s, prefetch fwd %d bwd %d, %s/%s%s, checkpointing %s, "
            "micro-batch %lld x %lld%s%s%s%s",
            granularity(s).c_str(), ends.c_str(), hsdpText(s).c_str(),
            ch.variant.reshard.toString().c_str(), ch.variant.forwardPrefetchDepth,
            ch.variant.backwardPrefetchDepth,
            ch.variant.paramDtype == DType::Float32 ? "fp32 params" : "bf16",
            ch.variant.reduceDtype == DType::Float32 ? "fp32 reduce" : "bf16 reduce",
            fp32Text.c_str(), acModeName(*ch.variant.ac), static_cast<long long>(ch.microBatch),
            static_cast<long long>(perRank / ch.microBatch),
            ch.syncEvery ? " (reduce every micro-batch)" : "", s.offload ? ", CPU offload" : "",
            ch.variant.compile.value_or(CompileMode::None) != CompileMode::None
                ? ", compiled per block"
                : "",
            s.float8 ? ", float8 (tensorwise, float8 all-gather)" : "");
        p.name = std::string("recommended: ") + summary;
        Candidate cand;
        cand.plan = p;
        cand.summary = summary;
        const ResolvedPlan r = resolvePlan(g, p, &c, "recommended");
        const StepOptions st = stepOptionsFor(p, c);
        SimOptions so;
        so.expandableSegments = o.expandableSegments;
        cand.sim = simulate(buildStepProgram(r, st), c, r.worldSize, so);
        cand.fits = cand.sim.peakReserved <= budget;
        return cand;
    }

    Candidate baselineCandidate() {
        Structure s;
        const size_t sIdx = allStructures.size();
        allStructures.push_back(s);
        Choice best{sIdx, {}, 1, false, 0, 0, false, 0};
        best.variant.reshard = ReshardSetting::ofBool(true);
        best.variant.paramDtype = paramDtype();
        best.variant.reduceDtype = DType::Float32;
        best.variant.ac = AcMode::None;
        ResolvedPlan r = resolvePlan(g, structuralPlan(s), &c, "baseline");
        applyVariant(r, best.variant);
        SimOptions so;
        so.keepTimeline = false;
        so.keepOpTimes = false;
        so.expandableSegments = o.expandableSegments;
        for (auto it = microBatches.rbegin(); it != microBatches.rend(); ++it) {
            const SimResult sim = simulateAccumulated(r, *it, perRank / *it, so);
            best.microBatch = *it;
            if (sim.peakReserved <= budget) break;
        }
        return materialize(best);
    }
};

}  // namespace

SearchResult searchPlans(const ModelGraph& model, const ClusterSpec& cluster,
                         const SearchOptions& o) {
    return Searcher(model, cluster, o).run();
}

}  // namespace shardscope
