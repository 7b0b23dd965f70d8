// SPDX-License-Identifier: Apache-2.0
#pragma once
// One plan model for the three APIs our users use: FSDP2 `fully_shard`, FSDP1
// `FullyShardedDataParallel`, and Lightning/fairscale strategies. A plan as written
// (this file) is resolved against a model and optionally a cluster into a ResolvedPlan
// (resolve.h): units with their parameters, sizes and effective settings.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plans/core/dtype.h"

namespace shardscope {

inline constexpr const char* kPlanFormat = "shardscope.plan";
inline constexpr int kPlanVersion = 1;

enum class PlanApi { Fsdp2, Fsdp1, Lightning };
[[nodiscard]] const char* planApiName(PlanApi a);

// reshard_after_forward: None (the default: True, but False for the root), a bool, or an
// int k (keep a 1/k copy after forward; all-gather over a k-rank group in backward).
struct ReshardSetting {
    enum class Kind { Default, Bool, Int } kind = Kind::Default;
    bool value = true;
    int64_t k = 0;
    static ReshardSetting ofBool(bool b) { return {Kind::Bool, b, 0}; }
    static ReshardSetting ofInt(int64_t k) { return {Kind::Int, true, k}; }
    [[nodiscard]] std::string toString() const;  // "None", "True", "False", "8"
    friend bool operator==(const ReshardSetting&, const ReshardSetting&) = default;
};

// Activation checkpointing of a unit's module (never the root's, unless its unit says so):
//  - None;
//  - Full: torch.utils.checkpoint around the module (non-reentrant): keeps its input,
//    recomputes its forward in backward;
//  - SelectiveOp: torchtitan's op-level selective checkpointing (torchtitan
//    distributed/activation_checkpoint.py, _apply_op_sac): the outputs of the ops in a save
//    list are kept, everything else is recomputed. The preset (empty `save`) is torchtitan's
//    default: mm, SDPA (flash, efficient, cuDNN), reduce_scatter and max, with every second
//    mm in a block recomputed;
//  - Attention: only attention's core is recomputed (what ShardScope called "selective"
//    before; plans that say "selective" get it, with a warning).
enum class AcMode { None, Attention, Full, SelectiveOp };
[[nodiscard]] const char* acModeName(AcMode m);

struct AcSpec {
    AcMode mode = AcMode::None;
    int64_t every = 1;              // Full: checkpoint every k-th unit given this spec
    std::vector<std::string> save;  // SelectiveOp: ops kept; empty: torchtitan's preset
    bool legacySelective = false;   // written "selective"
    AcSpec() = default;
    AcSpec(AcMode m) : mode(m) {}                // NOLINT: a bare mode is the common spelling
    [[nodiscard]] std::string toString() const;  // "full", "full every 2", "selective_op [mm]"
    friend bool operator==(const AcSpec&, const AcSpec&) = default;
};

struct MixedPrecisionSpec {
    std::optional<DType> paramDtype;
    std::optional<DType> reduceDtype;
    std::optional<DType> outputDtype;
    bool castForwardInputs = true;
    friend bool operator==(const MixedPrecisionSpec&, const MixedPrecisionSpec&) = default;
};

struct OffloadSpec {
    bool enabled = false;
    bool pinMemory = true;
    friend bool operator==(const OffloadSpec&, const OffloadSpec&) = default;
};

struct WrapPolicySpec {
    enum class Kind { None, Size, ModuleClass, NamePattern } kind = Kind::None;
    int64_t minNumParams = 100000000;  // size_based_auto_wrap_policy default 1e8
    std::vector<std::string> classes;  // ModuleClass
    std::vector<std::string> forceLeafClasses{"MultiheadAttention"};  // FORCE_LEAF_MODULES
    std::vector<std::string> excludeWrapClasses{"ModuleList",
                                                "ModuleDict"};  // EXCLUDE_WRAP_MODULES
    std::vector<std::string> patterns;  // NamePattern: ECMAScript regexes, full match on fqn
    friend bool operator==(const WrapPolicySpec&, const WrapPolicySpec&) = default;
};
[[nodiscard]] const char* wrapPolicyName(WrapPolicySpec::Kind k);

// torch.compile, as torchtitan applies it: each unit's module compiled on its own
// (`per_block`, torchtitan's apply_compile: FSDP's hooks stay eager between the compiled
// blocks), or the whole model compiled once (`full`: torch.compile of the root module; its
// graph breaks at every FSDP hook, so Inductor still sees one block at a time).
enum class CompileMode { None, PerBlock, Full };
[[nodiscard]] const char* compileModeName(CompileMode m);  // "false", "per_block", "full"

// torchao's float8 training (convert_to_float8_training with a Float8LinearConfig): the
// nn.Linear layers whose dimensions are multiples of 16, the output head excepted, run
// their three GEMMs in float8. `fsdpFloat8AllGather` gathers their weights in float8
// (FSDP2 only, tensorwise only: torchao refuses rowwise); `precomputeScales` computes the
// weights' scales for the next all-gather in one all-reduce after the optimizer step
// (precompute_float8_dynamic_scale_for_fsdp).
struct Float8Spec {
    bool enabled = false;               // "float8": false, or an object
    std::string recipe = "tensorwise";  // "tensorwise" | "rowwise" (torchao's recipe names)
    bool fsdpFloat8AllGather = false;   // torchao's default
    bool precomputeScales = false;
    friend bool operator==(const Float8Spec&, const Float8Spec&) = default;
};

// Settings a unit may override; unset fields inherit the plan's defaults.
struct UnitSettings {
    std::optional<ReshardSetting> reshardAfterForward;
    std::optional<bool> reshardAfterBackward;
    std::optional<AcSpec> activationCheckpointing;
    std::optional<MixedPrecisionSpec> mixedPrecision;
    std::optional<OffloadSpec> offload;
    std::optional<CompileMode> compile;
    std::optional<Float8Spec> float8;
    friend bool operator==(const UnitSettings&, const UnitSettings&) = default;
};

struct UnitSpec {
    std::string name;                  // defaults to modules[0]
    std::vector<std::string> modules;  // fully qualified names; "" is the root
    UnitSettings settings;
    std::optional<std::vector<std::string>> forwardPrefetch;   // unit names, explicit
    std::optional<std::vector<std::string>> backwardPrefetch;  // unit names, explicit
    std::string pointer;  // JSON pointer of this unit in the plan file, for messages
    friend bool operator==(const UnitSpec& a, const UnitSpec& b) {
        return a.name == b.name && a.modules == b.modules && a.settings == b.settings &&
               a.forwardPrefetch == b.forwardPrefetch && a.backwardPrefetch == b.backwardPrefetch;
    }
};

struct Fsdp1Options {
    std::string shardingStrategy = "FULL_SHARD";    // FULL_SHARD, SHARD_GRAD_OP, NO_SHARD,
                                                    // HYBRID_SHARD, _HYBRID_SHARD_ZERO2
    std::string backwardPrefetch = "BACKWARD_PRE";  // BACKWARD_PRE, BACKWARD_POST, NONE
    bool forwardPrefetch = false;
    bool limitAllGathers = true;
    bool useOrigParams = true;
    friend bool operator==(const Fsdp1Options&, const Fsdp1Options&) = default;
};

// Lightning's fairscale-based strategy (DDPFullyShardedStrategy) options.
struct LightningOptions {
    bool cpuOffload = false;
    bool flattenParameters = true;
    bool reshardAfterForward = true;
    bool fp32ReduceScatter = false;
    std::optional<DType> computeDtype;
    double bucketCapMb = 25;
    int64_t minNumParams = 100000000;
    std::optional<bool> moveGradsToCpu;  // defaults to cpu_offload
    bool stateDictToCpu = true;
    friend bool operator==(const LightningOptions&, const LightningOptions&) = default;
};

struct Plan {
    std::string name;
    PlanApi api = PlanApi::Fsdp2;
    std::vector<int64_t> meshShape;  // empty: 1D over the cluster's world size
    std::vector<std::string> meshDimNames;
    WrapPolicySpec wrap;
    UnitSettings defaults;
    std::vector<UnitSpec> units;
    int64_t microBatches = 1;          // gradient accumulation steps per optimizer step
    bool syncEveryMicroBatch = false;  // false: set_requires_gradient_sync(False) until the last
    std::optional<double> gradientDivideFactor;
    std::vector<std::string> ignoredParams;
    int64_t microBatchSize = 1;
    int64_t seqLen = 2048;
    bool seqLenDefaulted = true;  // no training.seq_len (nor --seq): the 2048 above
    // training.compile_loss: the training loop compiles its loss function (torchtitan's
    // build_cross_entropy_loss with compile on); see ModuleCost::lossCompiled.
    bool compileLoss = false;
    Fsdp1Options fsdp1;
    LightningOptions lightning;
    friend bool operator==(const Plan&, const Plan&) = default;
};

}  // namespace shardscope
