// SPDX-License-Identifier: Apache-2.0
#pragma once
// The kernels one module run launches in eager PyTorch (docs/kernel-model.md), as the step
// program's kernel mixes: its GEMMs by shape, SDPA and eager attention, the memory-bound
// kernels sharing its bytes, the loss's, torchao float8's and the fp32 casts; what
// activation checkpointing recomputes of them; and the FLOPs a recompute does not redo.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/schedule/step_program.h"
#include "plans/plan/resolve.h"

namespace shardscope {

// Adds `count` kernels of `perKernel` (FLOPs or bytes) to a mix, merged with alike ones.
void addKernels(KernelMix& m, KernelKind kind, double perKernel, int64_t count, bool masked = false,
                GemmShape shape = {});

// What op-level selective checkpointing keeps (ModuleRun::sacKeptGemms): its GEMMs, and
// whether SDPA's outputs.
struct SacKept {
    const std::vector<ModuleCost::Gemm>* gemms[2] = {nullptr, nullptr};
    bool sdpa = false;
};
SacKept sacKept(const ModuleRun& run, const std::vector<std::string>& save);

// The kernels of one module run at micro-batch b x s (docs/kernel-model.md): its GEMMs by
// shape, SDPA calls, and memory-bound kernels sharing the run's bytes. A run whose modules
// carry no kernel counts (a model JSON without them) is one GEMM kernel per module with
// FLOPs and one memory-bound kernel of all its bytes, per phase.
struct RunMixes {
    KernelMix* fwd;
    KernelMix* bwd;
    KernelMix* recomputeAll;        // full or op-level selective checkpointing: all of forward
    KernelMix* recomputeAttention;  // attention-only checkpointing: SDPA forward
    bool earlyStop;                 // checkpointing: ModuleRun::recomputeSkips are not run
    // Op-level selective checkpointing: its save list (empty: torchtitan's preset); the
    // kept ops are not run again (notRecomputed).
    const std::vector<std::string>* sacSave = nullptr;
    bool float8Gathered = false;  // the unit's float8 weights arrive cast (float8 all-gather)
    void forward(KernelKind k, double per, int64_t n, bool masked = false,
                 GemmShape shape = {}) const {
        addKernels(*fwd, k, per, n, masked, shape);
        if (recomputeAll) addKernels(*recomputeAll, k, per, n, masked, shape);
    }
};

// The causal-LM loss's memory-bound kernels (ModuleCost::lossVocab) in a compute dtype of
// `e` bytes, as bytes per logit. Forward: the fp32 upcast reads e and writes 4 (none in
// fp32); log_softmax reads its input twice (the row's max, then the sum of exponentials)
// and writes once. Backward: nll_loss_backward fills the fp32 gradient (4),
// _log_softmax_backward_data reads it and the output and writes (12), the cast back reads 4
// and writes e. On an H200 (4,096 tokens, a vocabulary of 128,256) log_softmax and its
// backward took 2.06 and 2.13 ms, the rate of copies of their size. 0: no such kernel.
// Compiled (ModuleCost::lossCompiled), Inductor's two fused kernels: forward reads the
// logits once (each row's max, log-sum-exp and target logit), backward reads them and
// writes their gradient in the compute dtype.
struct LossKernels {
    double fwd[2], bwd[3];
};
LossKernels lossKernelsPerLogit(double e, bool compiled);

// The kernels of `run` at micro-batch b x s into `out`; `scale` is the unit's activation
// dtype ratio, `computeBytes` its compute dtype's size, `window` the model's sliding window.
void runKernels(const ModuleRun& run, int64_t b, int64_t s, double scale, double computeBytes,
                int64_t window, const RunMixes& out);

// The FLOPs of a list of GEMMs at micro-batch b x s.
double gemmFlops(const std::vector<ModuleCost::Gemm>& list, int64_t b, int64_t s);

// The forward FLOPs a recompute does not redo (the kept GEMMs, SDPA's when it is kept).
double recomputeSkippedFlops(const ModuleRun& run, int64_t b, int64_t s, const SacKept* kept,
                             bool earlyStop);

}  // namespace shardscope
