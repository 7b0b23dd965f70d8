// SPDX-License-Identifier: Apache-2.0
#pragma once
// Resolves a plan against a model (and optionally a cluster): which modules form units,
// which parameters each unit manages, each unit's effective settings, and its sharded and
// unsharded sizes per rank. Every rule violation becomes a Problem naming the plan field;
// resolution continues past errors so `plan validate` reports all of them at once.
//
// Semantics follow PyTorch (torch/distributed/fsdp; plans/README.md):
//  - FSDP2: parameters are chunked on dim 0 across the shard group with torch.chunk sizes
//    c = ceil(d0/N); every rank holds c·R elements (zero-padded), the all-gather output is
//    N·c·R (FSDPParam._init_sharded_param, init_all_gather_outputs).
//  - FSDP1: one FlatParameter per unit; with use_orig_params each parameter starts at a
//    16-byte-aligned offset and the total is padded to a multiple of N; the shard is
//    ceil(T/N) (FlatParamHandle._init_flat_param_and_metadata, _get_shard).
//  - reshard_after_forward None means True except on the root, which becomes False; an int
//    k must divide the shard size, 1 behaves as False and the shard size as True
//    (_fsdp_init._get_post_forward_mesh_info); the copy kept after forward holds
//    ceil(d0/k)·R elements per parameter in param_dtype (checked against fully_shard in
//    tests/python/test_fsdp2_sizes.py).
#include <optional>
#include <string>
#include <vector>

#include "plans/cluster/cluster.h"
#include "plans/model/model_graph.h"
#include "plans/plan/plan.h"

namespace shardscope {

struct Problem {
    enum class Severity { Error, Warning } severity = Severity::Error;
    std::string where;  // "plan.json:/units/2/modules/0"
    std::string message;
    [[nodiscard]] std::string toString() const;
};

enum class Reshard { True, False, Int };

struct ResolvedUnit {
    std::string name;  // "" for the root
    std::vector<ModuleId> modules;
    bool isRoot = false;
    bool fromPolicy = false;     // chosen by the wrap policy rather than listed
    bool batchNormRule = false;  // FSDP1 wraps BatchNorm alone under mixed precision
    // Every module of the unit computes in fp32 whatever the model's dtype
    // (ModuleNode::keepFp32): a search's variants keep its own fp32 precision, leave it
    // uncheckpointed and out of their prefetch chains.
    bool keepsFp32 = false;
    std::string pointer;          // plan field that defined it, for messages
    std::vector<ParamId> params;  // managed parameters, in named_parameters order
    int64_t numel = 0;
    int64_t frozenNumel = 0;
    int64_t paramBytes = 0;    // unsharded, original dtype, no padding
    int64_t shardedNumel = 0;  // per rank, with padding
    int64_t shardedBytes = 0;  // per rank, original dtype, with padding
    // What the optimizer sees per rank (original dtype, padded): the trainable part of
    // shardedBytes, and its largest single parameter (a FlatParameter is one).
    int64_t trainableShardedBytes = 0;
    int64_t largestShardBytes = 0;
    int64_t unshardedBytes = 0;    // all-gather output per rank, all-gather dtype, padded
    int64_t postForwardBytes = 0;  // int reshard: the copy kept after forward, per rank
    ReshardSetting reshardDeclared;
    Reshard reshard = Reshard::True;
    int64_t reshardK = 0;  // group size of the post-forward copy when reshard == Int
    bool reshardAfterBackward = true;
    AcMode activationCheckpointing = AcMode::None;
    std::vector<std::string> acSave;    // SelectiveOp: the save list; empty: torchtitan's preset
    MixedPrecisionSpec mixedPrecision;  // after PyTorch's normalisation
    DType allGatherDtype = DType::Float32;
    DType reduceDtype = DType::Float32;
    OffloadSpec offload;
    CompileMode compile = CompileMode::None;
    Float8Spec float8;                    // the unit's torchao float8 training, if enabled
    std::vector<ModuleId> float8Linears;  // the unit's nn.Linear layers it converts
    int64_t float8WeightNumel = 0;        // their weights' elements (unsharded)
    std::vector<UnitId> forwardPrefetch;  // explicit lists only
    std::vector<UnitId> backwardPrefetch;
    bool explicitForwardPrefetch = false;
    bool explicitBackwardPrefetch = false;
    [[nodiscard]] std::string displayName() const { return isRoot ? "<root>" : name; }
};

// The model's modules in post-order (a module's own work, e.g. the loss or residual adds,
// runs after its children's), without the ones that cost nothing, grouped into runs of
// consecutive modules of one unit with their costs summed. The step program builds its
// compute segments from these, so a plan variant's program does not walk every module.
struct ModuleRun {
    int32_t unit = 0;
    ModuleCost cost;  // summed over the run's modules
    // Attention-only checkpointing wraps each module whose class names attention in
    // torch.utils.checkpoint (samples/apply_plan.py; the engine's checkpoint): its subtree
    // runs again, its projections included. Its forward FLOPs, the GEMMs and memory-bound
    // bytes and kernels of its subtree, what the checkpoint frees (the subtree's saved bytes
    // but its first module's, the module's input, which the checkpoint keeps), and the
    // GEMM non-reentrant early stop ends before (the last one, o_proj: its input is the last
    // tensor saved).
    ScaledCost attnFwdFlops;
    ScaledCost attnSavedBytes;
    std::vector<ModuleCost::Gemm> attnGemms, attnStopGemms;
    ScaledCost attnMemBytes;
    int32_t attnMemKernels = 0;
    // ModuleCost::upcastElems of the attention subtrees (Qwen3's q and k norms).
    double attnUpcastElems = 0;
    int32_t kernels = 0;  // modules with forward FLOPs
    // Trainable parameter elements of the run's unit whose gradient backward produces first
    // here: those whose last forward use is in this run (a tied weight at its last user).
    int64_t gradNumel = 0;
    // Trainable parameter elements of the run's unit used again later in forward (a tied
    // embedding before its lm_head): autograd holds the later use's gradient until this
    // run's backward makes another and sums them, three gradients of the weight alive at
    // once (FSDPMemTracker: GPT-2's wte, 3 x 0.30 GiB of temporaries at the embedding's
    // backward).
    int64_t tiedGradNumel = 0;
    // The largest module output of the run (each term's maximum): its gradient and the
    // gradient of its input are backward's working memory.
    ScaledCost peakOutputBytes;
    // When a module's weight gradient is made, its output's gradient is still alive (the
    // GEMM reads it), beside the run's gradients made so far (backward runs the run's
    // modules last to first). Two moments bound it: at the first module in forward with
    // gradients (all of the run's gradients by then) and at the one with the largest output
    // (the gradients from it to the run's end: largestOutGradNumel). fp32 Llama-3.1-8B:
    // lm_head's weight gradient (1.96 GiB) is made while the logits' gradient (0.98 GiB) is
    // alive; FSDPMemTracker peaks there.
    ScaledCost firstGradOutput, largestGradOutput;
    int64_t largestOutGradNumel = 0;
    // At each moment, backward has already freed what the modules after that one in forward
    // saved (the loss's log-probabilities and a softcap's tanh output when lm_head's weight
    // gradient is made in the same run, as with tied embeddings): GPT-2's and Gemma's root.
    ScaledCost firstGradSavedAfter, largestGradSavedAfter;
    // What comes after the run's last attention module in forward (a decoder layer's
    // post-attention norm and MLP): backward handles it before it reaches the attention, so
    // under selective checkpointing these are freed and produced before the recompute.
    ScaledCost savedAfterAttn;
    int64_t gradNumelAfterAttn = 0;
    bool hasAttn = false;
    // A loop of alike modules after the last attention (a mixture-of-experts block's
    // experts, siblings of one class in a ModuleList): backward makes one member's
    // gradients while its own activations are alive and earlier members' are freed, so the
    // loop's activations and gradients never all live at once (FSDPMemTracker peaks inside
    // Mixtral's expert loop). Its members' saved bytes and gradient elements, summed; the
    // list with the most gradient elements when a run has several.
    ScaledCost loopSaved;
    int64_t loopGradNumel = 0;
    int32_t loopMembers = 0;
    // Op-level selective checkpointing (AcMode::SelectiveOp): the outputs torchtitan's preset
    // keeps (SDPA's, and each odd-numbered mm of the unit's forward), and per op kind.
    ScaledCost sacPresetSaved;
    ScaledCost mmSaved, addmmSaved, sdpaSaved;
    // Full checkpointing's recompute stops as soon as it has remade every tensor the
    // forward saved (torch.utils.checkpoint's early stop, non-reentrant): a GEMM saves its
    // inputs before it runs, so a checkpointed region whose last saving op is a GEMM never
    // runs that GEMM again. An H200 trace of Llama-3.1-8B under full checkpointing shows
    // those mm calls with no kernel: each layer's down_proj and the lm_head. One entry per
    // such region of the run (recomputeStopGemm), merged by shape.
    std::vector<ModuleCost::Gemm> recomputeSkips;
    // Op-level selective checkpointing's recompute does not run a kept op again
    // (torch.utils.checkpoint hands back its stored output): the GEMMs whose outputs the
    // preset keeps (each odd-numbered mm of a checkpointed module's forward), all mm GEMMs
    // and all addmm GEMMs (for an explicit save list), merged by shape. On an H200, Llama-3.1-8B
    // under torchtitan's preset ran 3 of a layer's 7 GEMMs again (k, o and up), no SDPA.
    std::vector<ModuleCost::Gemm> sacKeptGemms, mmGemms, addmmGemms;
    // The first run whose kernels are the same as this one's (its own index if none).
    int32_t kernelSignature = -1;
};

// The device optimizer's foreach kernels (torch.optim.AdamW's default on a GPU): each
// _foreach_* op runs multi_tensor_apply over the per-rank trainable tensors, one kernel per
// 320 chunks of 65,536 elements, or sooner when a kernel's tensor list is full (110, 96,
// 64 or 48 tensors by the op's depth; ATen's MultiTensorApply.cuh). Offloaded units' step
// runs on the host and is not counted.
struct ForeachShape {
    int64_t bytes = 0;    // the tensors' bytes per rank (the trainable shards on the device)
    int64_t tensors = 0;  // how many
    // Kernels of one _foreach_* op over them, by its tensor-list limit 110, 96, 64 and 48.
    int32_t kernels[4] = {0, 0, 0, 0};
};
[[nodiscard]] int32_t foreachKernels(const std::vector<int64_t>& numels, int32_t maxTensors);
// ForeachShape::kernels' tensor-list limits, in order.
inline constexpr int32_t kForeachTensorLimits[4] = {110, 96, 64, 48};

// torch.optim.AdamW's foreach path (_multi_tensor_adamw, not capturable): its _foreach_* ops
// in order, each with its kernels' tensor-list limit (an index into kForeachTensorLimits:
// 0 for 110 tensors, 1 for a scalar list's 96, 2 for depth 2's 64, 3 for depth 3's 48) and
// the bytes it moves per byte of parameters, 20 in all (weight decay p *= (1 - lr wd) 2,
// exp_avg.lerp_(g) 3, exp_avg_sq *= beta2 2, exp_avg_sq.addcmul_(g, g) 3, sqrt 2, / bias
// correction 2, + eps 2, p.addcdiv_ 4). The step program prices the optimizer with it, and
// `calibrate --from-trace` sizes a trace's foreach kernels with it.
struct AdamWForeachOp {
    const char* op;  // as the profiler names it
    int limit;
    double perByte;
};
inline constexpr AdamWForeachOp kAdamWForeach[] = {
    {"aten::_foreach_mul_", 0, 2},      // _foreach_mul_(params, 1 - lr wd)
    {"aten::_foreach_lerp_", 2, 3},     // _foreach_lerp_(exp_avgs, grads, 1 - beta1)
    {"aten::_foreach_mul_", 0, 2},      // _foreach_mul_(exp_avg_sqs, beta2)
    {"aten::_foreach_addcmul_", 3, 3},  // _foreach_addcmul_(exp_avg_sqs, grads, grads, ...)
    {"aten::_foreach_sqrt", 2, 2},      // _foreach_sqrt(exp_avg_sqs)
    {"aten::_foreach_div_", 1, 2},      // _foreach_div_(sqrt, bias_correction2_sqrt)
    {"aten::_foreach_add_", 0, 2},      // _foreach_add_(sqrt, eps)
    {"aten::_foreach_addcdiv_", 3, 4},  // _foreach_addcdiv_(params, exp_avgs, sqrt, step_size)
};

struct ResolvedPlan {
    Plan plan;
    const ModelGraph* model = nullptr;
    std::string planFile;
    int64_t worldSize = 0;
    int64_t replicateSize = 1;  // HSDP replicas (mesh dim 0 of a 2D mesh)
    int64_t shardSize = 0;      // ranks a parameter is sharded over
    bool hsdp = false;
    bool flatParams = false;          // FSDP1/fairscale FlatParameter
    bool noShard = false;             // FSDP1 NO_SHARD: all-reduce instead of AG/RS
    std::vector<ResolvedUnit> units;  // forward (pre-)order; units[0] is the root
    std::vector<UnitId> unitOfParam;  // invalid for ignored parameters
    std::vector<ParamId> ignoredParams;
    std::vector<Problem> problems;
    std::vector<ModuleRun> moduleRuns;  // moduleRunsOf(*model, *this), set by resolvePlan
    ForeachShape optimizerForeach;      // set by resolvePlan

    [[nodiscard]] bool hasErrors() const;
    [[nodiscard]] size_t errorCount() const;
    // fully_shard application order: children before parents, the root last.
    [[nodiscard]] std::vector<UnitId> applicationOrder() const;
    [[nodiscard]] std::optional<UnitId> findUnit(std::string_view name) const;
    [[nodiscard]] int64_t totalShardedBytes() const;
    [[nodiscard]] int64_t maxUnshardedBytes() const;
};

// Sliding-window masks (ModuleCost::windowSavedBytes) count when `seqLen` reaches the
// model's window; seqLen < 1 takes the plan's.
[[nodiscard]] std::vector<ModuleRun> moduleRunsOf(const ModelGraph& model, const ResolvedPlan& plan,
                                                  int64_t seqLen = 0);

// The GEMM that full checkpointing's recompute of module `m` (a region torch.utils.checkpoint
// wraps) stops before (ModuleRun::recomputeSkips): a Linear or Conv1D alone, or a dense
// decoder layer ending in its MLP's down projection and residual adds (Llama, Mistral,
// Qwen, Phi-3, DeepSeek's dense layers). None where a saving op follows the last GEMM (a
// post-feed-forward norm, a mixture of experts' weighting, a dropout) or the layout is not
// one we know.
[[nodiscard]] std::optional<ModuleCost::Gemm> recomputeStopGemm(const ModelGraph& model,
                                                                ModuleId m);

[[nodiscard]] ResolvedPlan resolvePlan(const ModelGraph& model, const Plan& plan,
                                       const ClusterSpec* cluster = nullptr,
                                       const std::string& planFile = "plan");

}  // namespace shardscope
