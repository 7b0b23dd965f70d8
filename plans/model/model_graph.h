// SPDX-License-Identifier: Apache-2.0
#pragma once
// The module tree of a model as FSDP sees it: fully qualified names (as
// `named_modules()` yields them), class names, parameters with shapes and dtypes, buffers,
// tied parameters recorded once with every owner, and per-module compute and activation
// costs.
//
// Modules are stored in pre-order (the order of `named_modules()`), so the subtree of a
// module is the contiguous index range [id, subtreeEnd(id)). Parameters are stored in the
// order `named_parameters()` yields them (first owner wins for tied parameters).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "plans/core/dtype.h"
#include "plans/core/expected.h"
#include "plans/core/ids.h"

namespace shardscope {

using Shape = std::vector<int64_t>;

// numel of a shape; nullopt on overflow of int64 or a negative dimension.
[[nodiscard]] std::optional<int64_t> checkedNumel(const Shape& shape);
[[nodiscard]] std::string shapeToString(const Shape& shape);

// A cost that scales with the work of one micro-batch:
//   value(b, s) = (perToken + fixedPerToken)·(b·s) + (perTokenSeq + fixedPerTokenSeq)·(b·s)·s
//                 + perPosition·s
// The seq terms carry attention's quadratic dependence on sequence length; the last is
// bytes per sequence position whatever the batch and the dtype (tensors built from
// position_ids, whose batch is 1: Ernie-4.5's per-layer fp32 cos and sin).
//
// Bytes of activations come in two kinds. perToken and perTokenSeq are counted at the
// model's activation dtype and follow the dtype the unit computes in (a bf16
// MixedPrecisionPolicy halves fp32 figures). fixedPerToken is bytes whose dtype PyTorch
// keeps whatever the compute dtype: RMSNorm's fp32 upcast input and rstd, SDPA's fp32
// logsumexp, the loss's fp32 log-probabilities, int64 token ids. at(b, s, scale) applies
// a dtype ratio to the first kind only. FLOP costs never use fixedPerToken.
struct ScaledCost {
    double perToken = 0;
    double perTokenSeq = 0;
    double fixedPerToken = 0;
    double perPosition = 0;
    double fixedPerTokenSeq = 0;  // in a fixed dtype: MPT's fp32 probabilities, a bool mask
    [[nodiscard]] double at(int64_t batch, int64_t seq) const { return at(batch, seq, 1.0); }
    [[nodiscard]] double at(int64_t batch, int64_t seq, double dtypeScale) const {
        const double t = static_cast<double>(batch) * static_cast<double>(seq);
        return (perToken * dtypeScale + fixedPerToken) * t +
               (perTokenSeq * dtypeScale + fixedPerTokenSeq) * t * static_cast<double>(seq) +
               perPosition * static_cast<double>(seq);
    }
    ScaledCost& operator+=(const ScaledCost& o) {
        perToken += o.perToken;
        perTokenSeq += o.perTokenSeq;
        fixedPerToken += o.fixedPerToken;
        perPosition += o.perPosition;
        fixedPerTokenSeq += o.fixedPerTokenSeq;
        return *this;
    }
    [[nodiscard]] bool isZero() const {
        return perToken == 0 && perTokenSeq == 0 && fixedPerToken == 0 && perPosition == 0 &&
               fixedPerTokenSeq == 0;
    }
    friend bool operator==(const ScaledCost&, const ScaledCost&) = default;
};

// Costs of the operators a module runs itself, not counting its children.
// FLOPs count matrix multiplications and attention as torch.utils.flop_counter does;
// memory-bound operators (norms, activations, RoPE, residual adds) are counted as bytes
// read and written. Activation bytes are at the model's activation dtype.
struct ModuleCost {
    ScaledCost fwdFlops;
    ScaledCost bwdFlops;
    ScaledCost fwdMemBytes;
    ScaledCost bwdMemBytes;
    ScaledCost savedBytes;  // tensors saved for backward, attributed to the first saver
    // What a sliding-window layer's attention saves besides savedBytes once the sequence
    // reaches the model's window (ModelGraph::slidingWindow), when transformers gives SDPA a
    // (b, 1, s, s) boolean mask: SDPA converts it to the query's dtype and keeps that copy
    // (perTokenSeq), and with a mask transformers repeats K and V to every query head
    // instead of SDPA's GQA, so SDPA keeps the repeated copies (perToken). The resolver adds
    // it to savedBytes when the plan's seq_len reaches the window.
    ScaledCost windowSavedBytes;
    // savedBytes at (batch, seq), with windowSavedBytes once seq reaches `window` (> 0).
    [[nodiscard]] double savedAt(int64_t batch, int64_t seq, int64_t window) const {
        return savedBytes.at(batch, seq) +
               (window > 0 && seq >= window ? windowSavedBytes.at(batch, seq) : 0.0);
    }
    // The module's whole subtree when torch.compile traces it as one region (a decoder
    // layer compiled per block); all zero where not known, and a compiled unit keeps the
    // eager figures (plans/README.md, `compile`).
    //  - savedBytes: what AOT autograd's min-cut partitioner keeps for backward: each GEMM's
    //    input, the GEMM outputs a norm or an activation reads, SDPA's inputs, output and
    //    logsumexp, each norm's fp32 rstd and the block input (the casts, norms and
    //    pointwise ops between them are recomputed);
    //  - fwd/bwdMemBytes and fwd/bwdMemKernels: Inductor's fused memory-bound kernels, one
    //    per chain of pointwise and reduction ops between GEMMs and attention, each reading
    //    its external inputs and writing its outputs once.
    struct Compiled {
        ScaledCost savedBytes;
        ScaledCost fwdMemBytes, bwdMemBytes;
        int32_t fwdMemKernels = 0, bwdMemKernels = 0;
        [[nodiscard]] bool known() const { return !savedBytes.isZero(); }
        friend bool operator==(const Compiled&, const Compiled&) = default;
    };
    Compiled compiled;
    ScaledCost outputBytes;  // the module's forward output
    // The module's forward input, as a checkpoint of the module keeps it: an embedding's
    // int64 token ids (fixedPerToken 8). Zero: a hidden state the size of its output.
    ScaledCost inputBytes;
    // Outputs of the ops op-level selective checkpointing can keep (AcMode::SelectiveOp):
    // aten.mm (nn.Linear on 3-D input), aten.addmm (GPT-2's Conv1D), SDPA's output and
    // logsumexp. mmCount: mm calls, for torchtitan's "every second mm is recomputed".
    ScaledCost mmOutputBytes;
    ScaledCost addmmOutputBytes;
    ScaledCost sdpaOutputBytes;
    int32_t mmCount = 0;
    // The causal-LM loss over this vocabulary (transformers' ForCausalLMLoss), 0 for none.
    // Its forward holds the logits in the compute dtype, their fp32 upcast (the same tensor
    // in fp32) and the fp32 log-probabilities (saved) at once: the step program adds the
    // first two as forward working memory, once the compute dtype is known.
    double lossVocab = 0;
    // The loss runs compiled (torch.compile on the loss function, as torchtitan does with
    // compile on since April 2025): Inductor reads the logits once forward for each row's
    // max and log-sum-exp and once backward to write their gradient in the compute dtype;
    // no fp32 copy of the logits exists and what backward keeps is the logits themselves
    // (tests/python/test_compiled_loss_peer.py). Set by the resolver from the plan.
    bool lossCompiled = false;
    // Elements per token the module casts to fp32 and back when it runs in a compute dtype
    // below fp32 (LlamaRMSNorm: hidden.to(float32), ..., .to(input_dtype)), 0 for none: the
    // step program adds the two casts forward and their two backward (each reading one dtype
    // and writing the other) once the compute dtype is known; in fp32 there are none.
    double upcastElems = 0;
    // Saved bytes that exist only when the module computes below fp32, added to savedBytes
    // once the compute dtype is known: copies its code makes between fp32 and the compute
    // dtype that autograd keeps, which in fp32 are the tensor itself (`.float()` and
    // `.to(dtype)` return it), counted where it is first saved. Ernie-4.5's router input
    // (hidden_states.float(): 4 B a hidden element, fixedPerToken); MPT's probabilities cast
    // back from its fp32 softmax (perTokenSeq, in the compute dtype).
    ScaledCost belowFp32SavedBytes;
    // The kernels eager PyTorch launches for the module's own operators, per call (counted
    // on transformers' modules with a dispatch mode; docs/kernel-model.md):
    //  - GEMMs: one per nn.Linear/Conv1D call forward, two backward (input and weight
    //    gradients), each m x n x k with m = tokens x mPerToken (an expert sees its share);
    //  - attention: SDPA calls, one kernel forward and one backward each, priced by the
    //    perTokenSeq FLOPs;
    //  - memory-bound kernels (norms, rotary, activations, adds, casts, the loss) sharing
    //    fwdMemBytes / bwdMemBytes.
    // A module with none of these (an exported model without kernel counts) is priced as
    // one kernel of its FLOPs and one of its bytes per phase.
    struct Gemm {
        double mPerToken = 1;
        double n = 0, k = 0;
        int32_t calls = 1;
        bool backward = true;  // false: nothing it reads needs a gradient (RoPE's table)
        bool float8 = false;   // an nn.Linear a plan's float8 option converts (torchao)
        friend bool operator==(const Gemm&, const Gemm&) = default;
    };
    std::vector<Gemm> gemms;
    int32_t attentionCalls = 0;
    // Of attentionCalls, those of sliding-window layers: from the window's length on
    // transformers gives them a mask, and SDPA's masked kernels do all s x s of the work
    // (a causal one skips half) and read the mask.
    int32_t windowAttentionCalls = 0;
    // Attention written out in PyTorch operators (transformers' eager_attention_forward,
    // gpt-oss's with its sinks): per call two batched GEMMs forward (q x k^T and the
    // probabilities x v) and four backward, sharing the perTokenSeq FLOPs; the s x s
    // scores' memory-bound kernels are in fwd/bwdMemBytes.perTokenSeq. Not in
    // attentionCalls (no SDPA kernel runs).
    int32_t eagerAttentionCalls = 0;
    int32_t fwdMemKernels = 0, bwdMemKernels = 0;
    [[nodiscard]] bool hasKernels() const {
        return !gemms.empty() || attentionCalls > 0 || eagerAttentionCalls > 0 ||
               fwdMemKernels > 0 || bwdMemKernels > 0;
    }
    void addGemm(const Gemm& gm);  // merges with an equal shape
    ModuleCost& operator+=(const ModuleCost& o);
};

struct ParamOwner {
    ModuleId module;
    std::string localName;  // "weight"
};

struct ParamInfo {
    std::string name;  // canonical fully qualified name (first owner)
    Shape shape;
    DType dtype = DType::Float32;
    bool requiresGrad = true;
    int64_t numel = 0;
    std::vector<ParamOwner> owners;  // size() > 1 for tied parameters
    [[nodiscard]] int64_t bytes() const { return numel * dtypeSize(dtype); }
    [[nodiscard]] bool tied() const { return owners.size() > 1; }
};

struct BufferInfo {
    std::string name;  // local name
    Shape shape;
    DType dtype = DType::Float32;
    bool persistent = true;
};

struct ModuleNode {
    std::string fqn;   // "" for the root
    std::string name;  // local name within the parent
    std::string cls;   // class name, e.g. "LlamaDecoderLayer"
    // Base classes (nearest first) for isinstance-style policy matching, e.g. a
    // BatchNorm2d lists "_BatchNorm"; containers list "ModuleList".
    std::vector<std::string> bases;
    ModuleId parent;
    std::vector<ModuleId> children;
    std::vector<ParamId> params;  // direct parameters, tied ones included for every owner
    std::vector<BufferInfo> buffers;
    ModuleCost cost;
    // The module computes in fp32 whatever the model's dtype (transformers'
    // _keep_in_fp32_modules_strict: Ernie-4.5's router gate casts its input with .float() and
    // runs with autocast off). Its parameters must reach it in fp32: under a lower FSDP
    // param_dtype it needs a unit of its own with param_dtype float32 (resolvePlan checks).
    bool keepFp32 = false;
    int32_t depth = 0;
    int32_t subtreeEnd = 0;  // one past the last module of the subtree (pre-order)
};

class ModelGraph {
public:
    std::string name;
    std::string source;  // where it came from: "hf:llama", "shardscope.model", ...
    DType activationDtype = DType::Float32;
    // The longest sequence the model's positions cover (max_position_embeddings,
    // n_positions); 0 when unknown. Learned positions (GPT-2's wpe table) cannot go past
    // it; rotary ones can, untrained.
    int64_t maxPositions = 0;
    bool learnedPositions = false;
    // Why a model with learnedPositions fails past maxPositions, for messages (a loader
    // whose bound is something else says so: MPT's ALiBi table).
    std::string positionLimit = "a learned position table: PyTorch fails with an index error";
    // Sliding-window attention's window (Phi-3's sliding_window); 0 when none. Below it
    // attention is plain causal (SDPA's is_causal); from seq_len == window on transformers
    // builds a (b, 1, s, s) mask, and each sliding-window layer's SDPA keeps a copy of it in
    // the compute dtype (ModuleCost::windowSavedBytes, counted then). Attention is still
    // priced over the whole causal triangle: SDPA's kernels with a mask skip no blocks.
    int64_t slidingWindow = 0;
    // The micro-batch the costs were measured at (exporter); 0 when costs are formulas.
    int64_t measuredBatch = 0;
    int64_t measuredSeq = 0;

    ModelGraph();  // creates the root module "" of class "Module"

    // Building. Children must be added in the order named_children() yields them, and a
    // parent's children before its later siblings' descendants are not required: call
    // finalize() once built, which re-sorts into pre-order.
    ModuleId addModule(ModuleId parent, std::string_view localName, std::string_view cls,
                       std::vector<std::string> bases = {});
    ParamId addParam(ModuleId owner, std::string_view localName, Shape shape, DType dtype,
                     bool requiresGrad = true);
    void tieParam(ParamId param, ModuleId owner, std::string_view localName);
    void addBuffer(ModuleId owner, BufferInfo buffer);
    ModuleCost& cost(ModuleId m) { return m_modules[m.index()].cost; }
    void setRootClass(std::string_view cls) { m_modules[0].cls = std::string(cls); }
    void setKeepFp32(ModuleId m) { m_modules[m.index()].keepFp32 = true; }
    void setModuleClass(ModuleId m, std::string cls, std::vector<std::string> bases) {
        m_modules[m.index()].cls = std::move(cls);
        m_modules[m.index()].bases = std::move(bases);
    }
    // Computes pre-order, depths, fqns, and per-subtree parameter counts; returns an
    // error for inconsistent input (duplicate names, parameter overflow).
    [[nodiscard]] Status finalize();

    // Queries.
    [[nodiscard]] ModuleId root() const { return ModuleId(0); }
    [[nodiscard]] size_t moduleCount() const { return m_modules.size(); }
    [[nodiscard]] size_t paramCount() const { return m_params.size(); }
    [[nodiscard]] const ModuleNode& module(ModuleId m) const { return m_modules[m.index()]; }
    [[nodiscard]] const ParamInfo& param(ParamId p) const { return m_params[p.index()]; }
    [[nodiscard]] const std::vector<ModuleNode>& modules() const { return m_modules; }
    [[nodiscard]] const std::vector<ParamInfo>& params() const { return m_params; }
    [[nodiscard]] std::optional<ModuleId> findModule(std::string_view fqn) const;
    [[nodiscard]] std::optional<ParamId> findParam(std::string_view fqn) const;  // any owner's name
    [[nodiscard]] std::vector<std::string> moduleNames() const;
    [[nodiscard]] bool isAncestorOrSelf(ModuleId ancestor, ModuleId m) const {
        return ancestor.value <= m.value && m.value < m_modules[ancestor.index()].subtreeEnd;
    }
    // isinstance-style test: class or any base equals `cls`.
    [[nodiscard]] bool isInstance(ModuleId m, std::string_view cls) const;
    // Containers without forward (ModuleList, ModuleDict).
    [[nodiscard]] bool isContainer(ModuleId m) const;
    // The modules with parameters that compute in fp32 whatever the model's dtype
    // (ModuleNode::keepFp32), in module order: a plan below fp32 needs fp32 units for them.
    [[nodiscard]] std::vector<ModuleId> keepFp32Modules() const;

    [[nodiscard]] int64_t totalParams() const {
        return m_subtreeNumel.empty() ? 0 : m_subtreeNumel[0];
    }
    [[nodiscard]] int64_t totalParamBytes() const;
    [[nodiscard]] int64_t trainableParams() const;
    // Parameters owned by any module of the subtree, each counted once, as
    // module.parameters() yields them.
    [[nodiscard]] int64_t subtreeNumel(ModuleId m) const { return m_subtreeNumel[m.index()]; }
    [[nodiscard]] int64_t subtreeParamBytes(ModuleId m) const { return m_subtreeBytes[m.index()]; }
    [[nodiscard]] std::vector<ParamId> subtreeParams(ModuleId m) const;
    // Cost of the subtree (self plus all descendants); outputBytes is the module's own
    // output, not a sum.
    [[nodiscard]] ModuleCost subtreeCost(ModuleId m) const;
    // Lowest common ancestor of the owners of a parameter.
    [[nodiscard]] ModuleId ownersLca(ParamId p) const;
    [[nodiscard]] ModuleId lca(ModuleId a, ModuleId b) const;

private:
    std::vector<ModuleNode> m_modules;
    std::vector<ParamInfo> m_params;
    std::unordered_map<std::string, int32_t> m_moduleIndex;
    std::unordered_map<std::string, int32_t> m_paramIndex;
    std::vector<int64_t> m_subtreeNumel;
    std::vector<int64_t> m_subtreeBytes;
};

}  // namespace shardscope
