// SPDX-License-Identifier: Apache-2.0
#include "engine/schedule/run_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace shardscope {

void addKernels(KernelMix& m, KernelKind kind, double perKernel, int64_t count, bool masked,
                GemmShape shape) {
    if (count <= 0 || !(perKernel > 0)) return;
    m.kernels += count;
    for (KernelEntry& e : m.entries)
        if (e.kind == kind && e.perKernel == perKernel && e.masked == masked && e.shape == shape) {
            e.count += static_cast<int32_t>(count);
            return;
        }
    m.entries.push_back({kind, static_cast<int32_t>(count), perKernel, masked, shape});
}

namespace {

// Takes back up to `count` kernels addKernels put in (a recompute's early stop).
void removeKernels(KernelMix& m, KernelKind kind, double perKernel, int64_t count,
                   GemmShape shape = {}) {
    for (size_t i = 0; i < m.entries.size(); ++i) {
        KernelEntry& e = m.entries[i];
        if (e.kind != kind || e.perKernel != perKernel || e.masked || e.shape != shape) continue;
        const auto n = static_cast<int32_t>(std::min<int64_t>(count, e.count));
        e.count -= n;
        m.kernels -= n;
        if (e.count == 0) m.entries.erase(m.entries.begin() + static_cast<std::ptrdiff_t>(i));
        return;
    }
}

// One call of a GEMM at `tokens` tokens.
double gemmFlopsOf(const ModuleCost::Gemm& gm, double tokens) {
    return 2.0 * tokens * gm.mPerToken * gm.n * gm.k;
}

// Its forward shape, and its two backward GEMMs' (a linear layer, y = x W^T: the input
// gradient dy W is M x N by N x K; the weight gradient, as PyTorch's mm backward makes it
// for a transposed weight, dy^T x: N x M by M x K). 0s where M is not a whole number (a
// mixture-of-experts expert's share of the tokens) and for RoPE's table (no backward), a
// batched outer product whose shape takes batch and sequence apart.
struct GemmShapes {
    GemmShape fwd, dgrad, wgrad;
};
GemmShapes gemmShapesOf(const ModuleCost::Gemm& gm, double tokens) {
    const bool f8 = gm.float8;
    const GemmShapes none{{0, 0, 0, f8}, {0, 0, 0, f8}, {0, 0, 0, f8}};
    if (!gm.backward) return none;
    const double m = tokens * gm.mPerToken;
    const auto whole = [](double v) { return v >= 1 && v == std::floor(v) && v < 9e15; };
    if (!whole(m) || !whole(gm.n) || !whole(gm.k)) return none;
    const auto M = static_cast<int64_t>(m), N = static_cast<int64_t>(gm.n),
               K = static_cast<int64_t>(gm.k);
    return {{M, N, K, f8}, {M, K, N, f8}, {N, K, M, f8}};
}

}  // namespace

SacKept sacKept(const ModuleRun& run, const std::vector<std::string>& save) {
    SacKept k;
    if (save.empty()) {  // torchtitan's preset: every second mm, SDPA
        k.gemms[0] = &run.sacKeptGemms;
        k.sdpa = true;
        return k;
    }
    const auto has = [&](const char* op) {
        return std::find(save.begin(), save.end(), op) != save.end();
    };
    if (has("mm")) k.gemms[0] = &run.mmGemms;
    if (has("addmm")) k.gemms[1] = &run.addmmGemms;
    k.sdpa = has("sdpa");
    return k;
}

namespace {

// Calls f(gemm, calls) for each GEMM shape a recompute does not run: the kept ones (`kept`,
// may be null) and, with early stop, ModuleRun::recomputeSkips; a shape in both counts the
// larger number (the region's last GEMM is often kept as well).
template <class F>
void notRecomputed(const ModuleRun& run, const SacKept* kept, bool earlyStop, F&& f) {
    const std::vector<ModuleCost::Gemm>* lists[3] = {kept ? kept->gemms[0] : nullptr,
                                                     kept ? kept->gemms[1] : nullptr,
                                                     earlyStop ? &run.recomputeSkips : nullptr};
    const auto callsIn = [](const std::vector<ModuleCost::Gemm>* l, const ModuleCost::Gemm& g) {
        if (l)
            for (const ModuleCost::Gemm& x : *l)
                if (x.mPerToken == g.mPerToken && x.n == g.n && x.k == g.k) return x.calls;
        return 0;
    };
    for (int i = 0; i < 3; ++i) {
        if (!lists[i]) continue;
        for (const ModuleCost::Gemm& g : *lists[i]) {
            bool seen = false;
            for (int j = 0; j < i; ++j)
                seen = seen || callsIn(lists[j], g) > 0;
            if (seen) continue;  // counted with the first list that holds its shape
            int32_t keptCalls = 0;
            for (int j = 0; j < 2; ++j)
                keptCalls += callsIn(lists[j], g);
            f(g, std::max(keptCalls, callsIn(lists[2], g)));
        }
    }
}

// Bytes a cast between a compute dtype of e bytes and fp32 moves an element (reads one,
// writes the other); 0 in fp32, where there is no cast.
double fp32CastBytes(double e) {
    return e < 4 ? e + 4.0 : 0.0;
}

}  // namespace

LossKernels lossKernelsPerLogit(double e, bool compiled) {
    if (compiled) return {{e, 0.0}, {2.0 * e, 0.0, 0.0}};
    const double upcast = fp32CastBytes(e);
    return {{upcast, 12.0}, {4.0, 12.0, upcast}};
}

namespace {

void lossKernels(double logits, double e, bool compiled, const RunMixes& out) {
    const LossKernels k = lossKernelsPerLogit(e, compiled);
    for (double b : k.fwd)
        out.forward(KernelKind::MemoryBound, logits * b, b > 0 ? 1 : 0);
    for (double b : k.bwd)
        addKernels(*out.bwd, KernelKind::MemoryBound, logits * b, b > 0 ? 1 : 0);
}

// What torchao's float8 training adds around one converted nn.Linear call of m x n x k
// (tensorwise dynamic scaling, Float8Linear's autograd function), in a compute dtype of
// `e` bytes: forward, the input's amax (a reduction reading it) and its cast to float8
// (reading e, writing 1), and the weight's the same unless FSDP2 gathered it in float8;
// backward, the output gradient's amax and cast, and the float8 transposes the gradient
// GEMMs take (the input and the weight, 1 byte read and written an element). Each a
// memory-bound kernel. Stated in docs/kernel-model.md; not yet checked on a GPU trace.
void float8Kernels(const GemmShape& fwd, double calls, double e, bool weightGathered,
                   const RunMixes& out) {
    const double mk = static_cast<double>(fwd.m) * static_cast<double>(fwd.k);
    const double nk = static_cast<double>(fwd.n) * static_cast<double>(fwd.k);
    const double mn = static_cast<double>(fwd.m) * static_cast<double>(fwd.n);
    const auto n = static_cast<int64_t>(calls);
    out.forward(KernelKind::MemoryBound, mk * e, n);          // amax of the input
    out.forward(KernelKind::MemoryBound, mk * (e + 1.0), n);  // its cast
    if (!weightGathered) {
        out.forward(KernelKind::MemoryBound, nk * e, n);
        out.forward(KernelKind::MemoryBound, nk * (e + 1.0), n);
    }
    addKernels(*out.bwd, KernelKind::MemoryBound, mn * e, n);          // amax of grad output
    addKernels(*out.bwd, KernelKind::MemoryBound, mn * (e + 1.0), n);  // its cast
    addKernels(*out.bwd, KernelKind::MemoryBound, mk * 2.0, n);        // input, transposed
    addKernels(*out.bwd, KernelKind::MemoryBound, nk * 2.0, n);        // weight, transposed
}

}  // namespace

void runKernels(const ModuleRun& run, int64_t b, int64_t s, double scale, double computeBytes,
                int64_t window, const RunMixes& out) {
    const ModuleCost& c = run.cost;
    const double tokens = static_cast<double>(b) * static_cast<double>(s);
    if (c.lossVocab > 0) lossKernels(tokens * c.lossVocab, computeBytes, c.lossCompiled, out);
    const double fwdMem = c.fwdMemBytes.at(b, s, scale), bwdMem = c.bwdMemBytes.at(b, s, scale);
    if (!c.hasKernels()) {
        const int32_t k = std::max(1, run.kernels);
        out.forward(KernelKind::Gemm, c.fwdFlops.at(b, s) / k, k);
        addKernels(*out.bwd, KernelKind::Gemm, c.bwdFlops.at(b, s) / k, k);
        out.forward(KernelKind::MemoryBound, fwdMem, 1);
        addKernels(*out.bwd, KernelKind::MemoryBound, bwdMem, 1);
        return;
    }
    double gemmFlops = 0;
    for (const ModuleCost::Gemm& gm : c.gemms) {
        const double f = gemmFlopsOf(gm, tokens);
        const GemmShapes sh = gemmShapesOf(gm, tokens);
        out.forward(KernelKind::Gemm, f, gm.calls, false, sh.fwd);
        if (gm.backward) {
            addKernels(*out.bwd, KernelKind::Gemm, f, gm.calls, false, sh.dgrad);
            addKernels(*out.bwd, KernelKind::Gemm, f, gm.calls, false, sh.wgrad);
        }
        if (gm.float8 && sh.fwd.m > 0)
            float8Kernels(sh.fwd, gm.calls, computeBytes, out.float8Gathered, out);
        gemmFlops += f * gm.calls;
    }
    SacKept kept;
    if (out.sacSave) kept = sacKept(run, *out.sacSave);
    const bool sdpaKept = out.sacSave && kept.sdpa && out.recomputeAll;
    double attnFlops = 0;
    if (c.attentionCalls > 0) {
        const double seq = tokens * static_cast<double>(s);
        const double n = c.attentionCalls;
        attnFlops = c.fwdFlops.perTokenSeq * seq;
        // Sliding-window layers from the window's length on run masked (ModuleCost).
        const int32_t masked = window > 0 && s >= window ? c.windowAttentionCalls : 0;
        for (const auto& [calls, m] :
             {std::pair{c.attentionCalls - masked, false}, std::pair{masked, true}}) {
            if (sdpaKept)  // the recompute hands back SDPA's stored output
                addKernels(*out.fwd, KernelKind::Attention, attnFlops / n, calls, m);
            else
                out.forward(KernelKind::Attention, attnFlops / n, calls, m);
            addKernels(*out.bwd, KernelKind::Attention, c.bwdFlops.perTokenSeq * seq / n, calls, m);
            if (out.recomputeAttention)
                addKernels(*out.recomputeAttention, KernelKind::Attention, attnFlops / n, calls, m);
        }
    }
    if (c.eagerAttentionCalls > 0) {
        // Eager attention (ModuleCost::eagerAttentionCalls): q x k^T and the probabilities x
        // v forward, each one batched GEMM of half the FLOPs; backward two GEMMs for each.
        const double seq = tokens * static_cast<double>(s);
        const int64_t n = c.eagerAttentionCalls;
        attnFlops = c.fwdFlops.perTokenSeq * seq;
        out.forward(KernelKind::Gemm, attnFlops / static_cast<double>(2 * n), 2 * n);
        addKernels(*out.bwd, KernelKind::Gemm,
                   c.bwdFlops.perTokenSeq * seq / static_cast<double>(4 * n), 4 * n);
        if (out.recomputeAttention)
            addKernels(*out.recomputeAttention, KernelKind::Gemm,
                       attnFlops / static_cast<double>(2 * n), 2 * n);
    }
    if (out.recomputeAttention) {  // the rest of the attention modules' subtrees
        for (const ModuleCost::Gemm& gm : run.attnGemms)
            addKernels(*out.recomputeAttention, KernelKind::Gemm, gemmFlopsOf(gm, tokens), gm.calls,
                       false, gemmShapesOf(gm, tokens).fwd);
        if (out.earlyStop)
            for (const ModuleCost::Gemm& gm : run.attnStopGemms)
                removeKernels(*out.recomputeAttention, KernelKind::Gemm, gemmFlopsOf(gm, tokens),
                              gm.calls, gemmShapesOf(gm, tokens).fwd);
        if (run.attnMemKernels > 0)
            addKernels(*out.recomputeAttention, KernelKind::MemoryBound,
                       run.attnMemBytes.at(b, s, scale) / run.attnMemKernels, run.attnMemKernels);
        // The attention subtrees' fp32 round trips (ModuleCost::upcastElems), two casts.
        if (const double cast = tokens * run.attnUpcastElems * fp32CastBytes(computeBytes);
            cast > 0)
            addKernels(*out.recomputeAttention, KernelKind::MemoryBound, cast, 2);
    }
    // FLOPs the GEMM list does not cover (a module without kernel counts beside ones with).
    const double fwdFlops = c.fwdFlops.at(b, s);
    const double rest = fwdFlops - gemmFlops - attnFlops;
    if (rest > 1e-3 * fwdFlops) {
        out.forward(KernelKind::Gemm, rest, 1);
        addKernels(*out.bwd, KernelKind::Gemm, rest, 2);
    }
    const int32_t fk = std::max(1, c.fwdMemKernels), bk = std::max(1, c.bwdMemKernels);
    out.forward(KernelKind::MemoryBound, fwdMem / fk, fk);
    addKernels(*out.bwd, KernelKind::MemoryBound, bwdMem / bk, bk);
    // The module's fp32 round trip (ModuleCost::upcastElems): two casts each way.
    if (const double cast = tokens * c.upcastElems * fp32CastBytes(computeBytes); cast > 0) {
        out.forward(KernelKind::MemoryBound, cast, 2);
        addKernels(*out.bwd, KernelKind::MemoryBound, cast, 2);
    }
    if (out.recomputeAll)
        notRecomputed(run, out.sacSave ? &kept : nullptr, out.earlyStop,
                      [&](const ModuleCost::Gemm& gm, int32_t calls) {
                          removeKernels(*out.recomputeAll, KernelKind::Gemm,
                                        gemmFlopsOf(gm, tokens), calls,
                                        gemmShapesOf(gm, tokens).fwd);
                      });
}

// The FLOPs of a list of GEMMs at micro-batch b x s.
double gemmFlops(const std::vector<ModuleCost::Gemm>& list, int64_t b, int64_t s) {
    const double tokens = static_cast<double>(b) * static_cast<double>(s);
    double f = 0;
    for (const ModuleCost::Gemm& gm : list)
        f += gemmFlopsOf(gm, tokens) * gm.calls;
    return f;
}

// The forward FLOPs a recompute does not redo (notRecomputed), SDPA's when it is kept.
double recomputeSkippedFlops(const ModuleRun& run, int64_t b, int64_t s, const SacKept* kept,
                             bool earlyStop) {
    const double tokens = static_cast<double>(b) * static_cast<double>(s);
    // SDPA's FLOPs are the run's per-token-per-position ones (runKernels); eager attention
    // is no SDPA call and is recomputed.
    double f = kept && kept->sdpa && run.cost.attentionCalls > 0
                   ? run.cost.fwdFlops.perTokenSeq * tokens * static_cast<double>(s)
                   : 0.0;
    notRecomputed(run, kept, earlyStop, [&](const ModuleCost::Gemm& gm, int32_t calls) {
        f += gemmFlopsOf(gm, tokens) * calls;
    });
    return f;
}

}  // namespace shardscope
