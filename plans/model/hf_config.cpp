// SPDX-License-Identifier: Apache-2.0
#include "plans/model/hf_config.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "plans/core/json_reader.h"

namespace shardscope {

namespace {

// Per-token cost formulas. T = b·s tokens, e = bytes per activation element.
// Dtype rule (ScaledCost): bytes written with e follow the unit's compute dtype (the
// MixedPrecisionPolicy's param_dtype, else the parameters' dtype); fp32 statistics and
// upcasts and int64 indices go to fixedPerToken and stay what PyTorch keeps them as.
// FLOPs are counted as torch.utils.flop_counter counts them: matmuls (2·m·n·k, backward
// twice forward) and flash scaled_dot_product_attention (forward 4·b·H·s²·d, backward
// 10·b·H·s²·d, i.e. 2.5x, no causal discount), so the exporter's measured FLOPs and these
// formulas agree exactly for Llama-family models (tests/python/test_export_model.py).
// Elementwise work is memory-bound and counted as bytes read plus written, kernel by kernel as
// `calibrate --from-trace` counts a kernel's (opBytes, engine/calibrate/kernel_samples.cpp:
// its inputs, a broadcast one once, plus an output the size of the largest unless in place),
// so that the efficiencies it fits price them; test_gpu_traces.py checks a Llama layer's
// against an H200 trace.
struct CostBuilder {
    ModelGraph& g;
    double e;  // activation element size

    // nn.Linear / Conv1D, in→out. Backward computes grad-input and grad-weight (2× forward).
    // `savesInput` is false when a sibling already saved the same input tensor (q/k/v
    // projections share the norm output; saved tensors are attributed to the first saver).
    // Kernels: one GEMM forward, two backward; backward adds the bias gradient's sum and,
    // when `sumsInputGrad`, the add that accumulates an input gradient shared with a
    // sibling (k/v projections beside q, up beside gate).
    void linear(ModuleId m, double in, double out, bool savesInput, bool addmm = false,
                bool sumsInputGrad = false) {
        auto& c = g.cost(m);
        c.addGemm({1.0, out, in, 1});
        c.bwdMemKernels += (addmm ? 1 : 0) + (sumsInputGrad ? 1 : 0);
        // The bias gradient's sum over tokens reads and (as counted) writes out·e; the shared
        // input's gradient add reads two and writes one of in·e.
        c.bwdMemBytes.perToken += (addmm ? 2 * out * e : 0) + (sumsInputGrad ? 3 * in * e : 0);
        if (addmm) {
            c.addmmOutputBytes.perToken += out * e;
        } else {
            c.mmOutputBytes.perToken += out * e;
            c.mmCount += 1;
        }
        c.fwdFlops.perToken += 2 * in * out;
        c.bwdFlops.perToken += 4 * in * out;
        if (savesInput) c.savedBytes.perToken += in * e;
        c.outputBytes.perToken += out * e;
    }
    // A mixture's expert GEMM of in→out run once per expert (`experts` calls) on its share
    // of the k routed slots of each token (m = tokens x k / experts): FLOPs, the kernels
    // and, for aten.mm (`mm`; not a batched bmm), the mm output op-level checkpointing can
    // keep.
    void expertGemm(ModuleCost& c, double experts, double k, double in, double out,
                    bool mm = true) {
        c.addGemm({k / experts, out, in, static_cast<int32_t>(experts)});
        c.fwdFlops.perToken += 2 * in * out * k;
        c.bwdFlops.perToken += 4 * in * out * k;
        if (!mm) return;
        c.mmOutputBytes.perToken += k * out * e;
        c.mmCount += static_cast<int32_t>(experts);
    }
    // LlamaRMSNorm: upcasts to fp32, x·rsqrt(mean(x²)+eps), casts back, multiplies by the
    // weight. Saved: fp32 input (4h, whatever the compute dtype), rstd (4), normalized
    // input in e (h·e).
    // Kernels (transformers 4.57): pow, mean, add, rsqrt, mul, mul forward; 14 backward; two
    // casts each way when the compute dtype is not fp32 (ModuleCost::upcastElems).
    // Bytes per token, each kernel's as the trace reader counts them (see the top):
    // forward the casts 2·(4 + e)·h, pow, mean and x·rsqrt 8h each in fp32, the weight's
    // multiply 2·e·h; backward the casts, 60h of fp32 work (the multiplies by rstd and by x,
    // the pow's two, the sum over h, mean's division, the accumulation of x's two gradients)
    // and 7·e·h for the weight (its gradient's multiply and sum over tokens, the input
    // gradient's multiply). Llama-3.1-8B on an H200 at 4,096 tokens: 40h and 86h a norm.
    // `rows` per token: 1 over the hidden size; Qwen3's q_norm and k_norm normalise each
    // head over head_dim, one rstd per head. `weightInFp32`: OLMo-2 multiplies the weight
    // before casting back ((w * x).to(dtype)), so the weight's multiply keeps the fp32
    // normalized input (4h) instead of its cast (h·e).
    void rmsNorm(ModuleId m, double h, double rows = 1, bool weightInFp32 = false) {
        auto& c = g.cost(m);
        c.fwdMemKernels += 6;
        c.bwdMemKernels += 14;
        c.upcastElems += h;  // the casts, once the compute dtype is known
        c.fwdMemBytes.fixedPerToken += 24 * h;
        c.bwdMemBytes.fixedPerToken += 60 * h;
        if (weightInFp32) {  // the weight's multiply in fp32
            c.fwdMemBytes.fixedPerToken += 8 * h;
            c.bwdMemBytes.fixedPerToken += 28 * h;
        } else {
            c.fwdMemBytes.perToken += 2 * e * h;
            c.bwdMemBytes.perToken += 7 * e * h;
        }
        if (weightInFp32)
            c.savedBytes.fixedPerToken += 4 * h;
        else
            c.savedBytes.perToken += h * e;
        c.savedBytes.fixedPerToken += 4 * h + 4 * rows;
        c.outputBytes.perToken += h * e;
    }
    // Llama-4's L2 norm of each query and key head (Llama4TextL2Norm: x.float() times
    // rsqrt(mean(x²) + eps), cast back; no weight) over `w` elements in `rows` heads a token.
    // Saved (saved_tensors_hooks): the fp32 input and the fp32 rsqrt of each head, whatever
    // the compute dtype. Kernels as RMSNorm's without the weight's multiply.
    void l2Norm(ModuleId m, double w, double rows) {
        auto& c = g.cost(m);
        c.fwdMemKernels += 5;
        c.bwdMemKernels += 10;
        c.upcastElems += w;
        c.fwdMemBytes.fixedPerToken += 24 * w;
        c.bwdMemBytes.fixedPerToken += 60 * w;
        c.savedBytes.fixedPerToken += 4 * w + 4 * rows;
        c.outputBytes.perToken += w * e;
    }
    // nn.LayerNorm (weight and bias) over h: native_layer_norm saves input, mean and rstd
    // (fp32). `savesInput` is false when its input is already saved (Falcon's ln_mlp reads
    // what ln_attn does).
    ModuleId layerNorm(ModuleId parent, const char* name, int64_t h, DType pd,
                       bool savesInput = true, bool bias = true) {
        ModuleId m = g.addModule(parent, name, "LayerNorm");
        g.addParam(m, "weight", {h}, pd);
        if (bias) g.addParam(m, "bias", {h}, pd);
        const auto H = static_cast<double>(h);
        auto& c = g.cost(m);
        c.fwdMemKernels += 1;  // native_layer_norm
        c.bwdMemKernels += 1;
        c.fwdMemBytes.perToken += 2 * H * e;
        c.bwdMemBytes.perToken += 4 * H * e;
        if (savesInput) c.savedBytes.perToken += H * e;
        c.savedBytes.fixedPerToken += 8;  // fp32 mean and rstd
        c.outputBytes.perToken += H * e;
        return m;
    }
    // OLMo's LayerNorm without weight or bias, in fp32: F.layer_norm(x.float()).to(dtype).
    // native_layer_norm saves its fp32 input, mean and rstd; reads and writes fp32 (8h),
    // backward reads the gradient and the input and writes one (12h); the casts each way
    // as RMSNorm's (ModuleCost::upcastElems).
    void fp32LayerNorm(ModuleId m, double h) {
        auto& c = g.cost(m);
        c.fwdMemKernels += 1;
        c.bwdMemKernels += 1;
        c.upcastElems += h;
        c.fwdMemBytes.fixedPerToken += 8 * h;
        c.bwdMemBytes.fixedPerToken += 12 * h;
        c.savedBytes.fixedPerToken += 4 * h + 8;
        c.outputBytes.perToken += h * e;
    }
    // Cohere's LayerNorm, written out in fp32 with a weight and no bias: mean, x - mean, its
    // square's mean, rsqrt, (x - mean) again times it, times the weight. Saved in fp32: the
    // pow's input, the second x - mean and the normalized input (4h each) and rstd.
    // Kernels: the casts each way (ModuleCost::upcastElems) and nine forward (mean, two
    // subs, pow, mean, add, rsqrt, two muls), about twice as many backward.
    void cohereLayerNorm(ModuleId m, double h) {
        auto& c = g.cost(m);
        c.fwdMemKernels += 9;
        c.bwdMemKernels += 16;
        c.upcastElems += h;
        c.fwdMemBytes.fixedPerToken += 48 * h;
        c.bwdMemBytes.fixedPerToken += 100 * h;
        c.savedBytes.fixedPerToken += 12 * h + 4;
        c.outputBytes.perToken += h * e;
    }
    // The exact GELU (GELUActivation, GELUTanh: one kernel each way): keeps its input.
    void gelu(ModuleId m, double width) {
        auto& c = g.cost(m);
        c.savedBytes.perToken += width * e;
        c.fwdMemBytes.perToken += 2 * width * e;
        c.bwdMemBytes.perToken += 3 * width * e;
        c.fwdMemKernels += 1;
        c.bwdMemKernels += 1;
        c.outputBytes.perToken += width * e;
    }
    // NewGELUActivation (tanh approximation, unfused: 0.5·x·(1 + tanh(c·(x + a·x³)))) saves
    // four tensors of its width: pow's input x, tanh's result, and both operands of the last
    // mul (0.5·x and 1 + tanh), as autograd lists them (FakeTensorMode, transformers 4.57).
    void unfusedTanhGelu(ModuleId m, double width) {
        auto& c = g.cost(m);
        c.savedBytes.perToken += 4 * width * e;
        c.fwdMemBytes.perToken += 10 * width * e;
        c.bwdMemBytes.perToken += 12 * width * e;
        c.outputBytes.perToken += width * e;
        c.fwdMemKernels += 8;   // mul 4, pow, add 2, tanh
        c.bwdMemKernels += 11;  // mul 7, tanh_backward, pow, add 2
    }
    // `count` multiplies of a `width`-wide tensor by a constant (Gemma's and Granite's scaled
    // embedding, Granite's residual branches and logits, Cohere's logits): one kernel each
    // way each, nothing saved.
    void scaleByConstant(ModuleId m, double width, int count = 1) {
        auto& c = g.cost(m);
        c.fwdMemKernels += count;
        c.bwdMemKernels += count;
        c.fwdMemBytes.perToken += 2 * width * e * count;
        c.bwdMemBytes.perToken += 2 * width * e * count;
    }
    // The output projection `name` under the root (vocab x h, tied to `tiedTo` when given,
    // with a bias when asked), the addmm or mm it runs and the input it saves.
    ModuleId lmHead(const char* name, std::optional<ParamId> tiedTo, int64_t vocab, int64_t h,
                    DType pd, bool bias = false) {
        ModuleId head = g.addModule(g.root(), name, "Linear");
        if (tiedTo)
            g.tieParam(*tiedTo, head, "weight");
        else
            g.addParam(head, "weight", {vocab, h}, pd);
        if (bias) g.addParam(head, "bias", {vocab}, pd);
        linear(head, static_cast<double>(h), static_cast<double>(vocab), true, bias);
        return head;
    }
    // nn.Embedding: a gather; saves the int64 indices.
    void embedding(ModuleId m, double h) {
        auto& c = g.cost(m);
        c.fwdMemKernels += 1;  // embedding / embedding_dense_backward
        c.bwdMemKernels += 1;
        c.fwdMemBytes.perToken += 2 * h * e;
        c.bwdMemBytes.perToken += 2 * h * e;
        c.savedBytes.fixedPerToken += 8;
        c.outputBytes.perToken += h * e;
        c.inputBytes.fixedPerToken += 8;  // the ids
    }
    // nn.Dropout in training: saves a bool mask per element.
    void dropout(ModuleId m, double width, double p) {
        if (p <= 0) return;
        auto& c = g.cost(m);
        c.fwdMemKernels += 3;  // bernoulli_, div_, mul
        c.bwdMemKernels += 1;
        c.fwdMemBytes.perToken += width * (2 * e + 1);
        c.bwdMemBytes.perToken += width * (2 * e + 1);
        c.savedBytes.fixedPerToken += width;
        c.outputBytes.perToken += width * e;
    }
    // Causal attention through SDPA with a flash/efficient kernel: no s×s matrix is kept;
    // saved are q, k and v (grouped-query attention inside SDPA, enable_gqa, as
    // transformers calls it without a padding mask: k and v at their own width), the
    // output and the fp32 logsumexp.
    // `vHeadDim`: the value head size where it differs from the query/key one (DeepSeek's
    // MLA: 192 for q·k, 128 for v); flop_counter's formulas are 2·s²·(d_qk + d_v) forward
    // and 2·s²·(3·d_qk + 2·d_v) backward per head.
    void sdpa(ModuleId m, double heads, double headDim, double savedQkvWidth, double vHeadDim = 0) {
        if (vHeadDim <= 0) vHeadDim = headDim;
        auto& c = g.cost(m);
        c.attentionCalls += 1;
        c.fwdFlops.perTokenSeq += 2 * heads * (headDim + vHeadDim);
        c.bwdFlops.perTokenSeq += 2 * heads * (3 * headDim + 2 * vHeadDim);
        c.savedBytes.perToken += savedQkvWidth * e + heads * vHeadDim * e;
        c.savedBytes.fixedPerToken += 4 * heads;
        c.sdpaOutputBytes.perToken += heads * vHeadDim * e;
        c.sdpaOutputBytes.fixedPerToken += 4 * heads;
    }
    // Residual adds: read two, write one; backward's sum of the two gradient paths likewise.
    void residualAdds(ModuleId m, double h, int count) {
        auto& c = g.cost(m);
        c.fwdMemKernels += count;  // the add; backward sums the two gradient paths
        c.bwdMemKernels += count;
        c.fwdMemBytes.perToken += 3 * h * e * count;
        c.bwdMemBytes.perToken += 3 * h * e * count;
        c.outputBytes.perToken += h * e;
    }
    // A model's rotary embedding, run once per forward: inv_freq @ position_ids (a bmm of
    // k = 1) after the position ids' arange, then cos, sin, two muls, cat, the fp32 expand's
    // copy (and the casts of cos and sin to a lower compute dtype); no gradient. cos and sin
    // are saved (by the attentions) in the compute dtype; DeepSeek-V2 keeps one complex64
    // freqs_cis (fp32 pairs) instead (`complexFreqs`).
    ModuleId rotaryEmbedding(ModuleId parent, const char* name, const std::string& cls,
                             int64_t rotaryDim, int64_t headDim, bool complexFreqs = false) {
        ModuleId m = g.addModule(parent, name, cls);
        g.addBuffer(m, {"inv_freq", {rotaryDim / 2}, DType::Float32, false});
        auto& c = g.cost(m);
        const auto r = static_cast<double>(rotaryDim);
        if (complexFreqs)
            c.savedBytes.fixedPerToken += 4.0 * r;
        else
            c.savedBytes.perToken += 2.0 * r * e;
        c.outputBytes.perToken += 2.0 * r * e;
        c.addGemm({1.0, static_cast<double>(headDim / 2), 1.0, 1, false});
        c.fwdMemKernels += 7 + (e < 4 ? 2 : 0);
        return m;
    }
    // Causal-LM loss of transformers' ForCausalLMLoss (labels=): logits upcast to fp32
    // (whatever the compute dtype), log_softmax (saves its fp32 output) and nll_loss (saves
    // the int64 targets and the same log-probabilities). Its largest output is the fp32
    // log-probabilities: backward holds their gradient and the fp32 logits' gradient at once
    // (FSDPMemTracker: two fp32 b·s·vocab temporaries at the start of backward).
    void causalLmLoss(ModuleId m, double vocab) {
        auto& c = g.cost(m);
        // The step program adds the fp32 upcast, _log_softmax, the gradient's fill,
        // _log_softmax_backward_data and the cast back by their bytes; constant_pad_nd,
        // clone, nll_loss_forward, ones_like (backward's seed) and nll_loss_backward's
        // scatter move next to nothing.
        c.fwdMemKernels += 3;
        c.bwdMemKernels += 2;
        // Its bytes depend on the compute dtype the plan runs in (an fp32 run has no
        // upcast): the step program adds them (ModuleCost::lossVocab).
        c.savedBytes.fixedPerToken += 4 * vocab + 8;
        c.outputBytes.fixedPerToken += 4 * vocab;
        c.lossVocab += vocab;
    }
};

struct LlamaLike {
    std::string family;  // llama, mistral, qwen2, qwen3, olmo2, mixtral, qwen2_moe, qwen3_moe
    std::string prefix;  // Llama, Mistral, Qwen2, Qwen3, Olmo2, Mixtral, Qwen2Moe, Qwen3Moe
    int64_t vocab, hidden, inter, layers, heads, kvHeads, headDim;
    bool tie, qkvBias, oBias, mlpBias;
    bool qkNorm = false;  // Qwen3: RMSNorm of each query and key head over head_dim
    // OLMo-2: q_norm and k_norm over the whole projections, norms after attention and after
    // the MLP instead of before (no input_layernorm), the norm's weight applied in fp32.
    bool olmo2 = false;
    int64_t experts = 0, topK = 0;
    // Mixture of experts. Mixtral: every layer's `block_sparse_moe`, experts w1/w3/w2 of
    // intermediate_size, top-k weights always renormalised. Qwen2-MoE/Qwen3-MoE: the layer's
    // `mlp` is sparse when (i + 1) % decoder_sparse_step == 0 and i is not in
    // mlp_only_layers (else a dense MLP of intermediate_size), experts of
    // moe_intermediate_size named like the dense MLP, renormalised only with norm_topk_prob;
    // Qwen2-MoE adds a shared expert (shared_expert_intermediate_size) scaled by
    // sigmoid(shared_expert_gate(x)).
    int64_t moeInter = 0, sharedInter = 0, sparseStep = 1;
    std::vector<int64_t> mlpOnlyLayers;
    bool normTopK = true;
    // Qwen2-MoE and OLMoE (transformers 4.57) keep their own attention classes
    // (Qwen2MoeSdpaAttention, with an unused per-layer rotary_emb; OlmoeSdpaAttention), and
    // repeat_kv copies K and V to every query head before SDPA, which then saves them at the
    // query width.
    bool legacySdpaAttention = false;
    // DeepSeek-V3: multi-head latent attention (q through a rank-qLora bottleneck unless
    // q_lora_rank is null, k and v from one rank-kvLora latent plus a shared rotary key), and
    // from layer firstDense on an MoE of experts, a sigmoid top-k router with group-limited
    // choice (DeepseekV3TopkRouter) and shared experts.
    bool deepseek = false;
    // DeepSeek-V2 (and V2-Lite): the same attention and expert layout as V3 with a softmax
    // router (DeepseekV2MoEGate: no correction bias, no renormalisation), optional shared
    // experts, complex-number RoPE, and the routed outputs combined by sorting the token
    // slots, one cat and a scatter instead of V3's index_add_ per expert.
    bool deepseekV2 = false;
    // Gemma-2 (gemma2) and Gemma-3's text model (gemma3_text): four RMSNorms per layer
    // (before and after the attention and the MLP) that compute (1 + weight) in fp32, a
    // GELU-tanh MLP, the embedding scaled by sqrt(hidden) (Gemma-3: inside its
    // Gemma3TextScaledWordEmbedding), tied embeddings by default. Gemma-2 caps the final
    // logits with tanh (final_logit_softcapping, 30 by default: tanh keeps its output, one
    // more vocabulary-sized tensor per token); its attention softcapping runs inside
    // flash-attention 2 and is dropped by SDPA, and neither keeps the s x s scores, as the
    // costs assume. Gemma-3 adds q_norm/k_norm per head and a second rotary embedding for
    // its sliding-window layers.
    bool gemma = false, gemma3 = false;
    double finalSoftcap = 0;
    std::string actClass = "SiLUActivation";
    // Phi-3 (and Phi-4, same model_type): fused qkv_proj (registered after o_proj) and
    // gate_up_proj, residual dropouts, RoPE on partial_rotary_factor of each head.
    bool phi3 = false;
    int64_t rotaryDim = 0;  // RoPE's width per head: head_dim x partial_rotary_factor
    int64_t slidingWindow = 0;
    std::vector<char> slidingLayers;  // per layer, when slidingWindow > 0
    double residDropout = 0;
    // Seed-OSS: functional dropout (residual_dropout) on o_proj's and down_proj's outputs,
    // inside the attention and the MLP.
    double branchDropout = 0;
    // Granite: the embedding, each residual branch and the logits scaled by the config's
    // multipliers, always applied (1.0 included): one multiply each way, nothing saved.
    bool granite = false;
    // Exaone-4: OLMo-2's post-norm layout (no input_layernorm) with Qwen3's per-head q/k
    // norms and Llama's RMSNorm (weight applied after the cast back).
    bool postNorms = false;
    // Per layer, whether RoPE is applied (SmolLM3's no_rope_layers, Exaone-4's global layers
    // when a sliding window is set); empty: every layer.
    std::vector<char> ropeLayers;
    // OLMo-3: one rotary embedding per attention type, in a ModuleDict `rotary_embs`.
    bool rotaryPerType = false;
    // OLMo (1): LayerNorms without parameters computed in fp32 (OlmoLayerNorm), and with
    // clip_qkv the q/k/v projections clamped in place.
    bool olmo1 = false;
    double clipQkv = 0;
    // StarCoder2: nn.LayerNorm (weight and bias) for every norm, a GELU MLP (c_fc, act,
    // c_proj), biases on every projection (use_bias), residual dropout after o_proj and
    // c_proj (branchDropout) and dropout on the embedding.
    bool starcoder2 = false;
    double embedDropout = 0;
    // Cohere2 (Command R7B): one Cohere2LayerNorm before a parallel attention and MLP (both
    // read its output), RoPE in fp32 with interleaved halves on the sliding-window layers only,
    // the logits scaled by logit_scale.
    bool cohere = false;
    // GLM-4.5 (glm4_moe): Llama's attention with q/k/v biases, RoPE on partial_rotary_factor
    // of each head through a cat (o_proj then saves a copy of SDPA's output), optional
    // per-head q/k norms, and DeepSeek-V3's mixture of experts from first_k_dense_replace on.
    bool glm = false;
    // gpt-oss: q/k/v/o with biases, a learned sink logit per head, RoPE through chunks and
    // a cat, eager attention (transformers trains it with no SDPA path), RMSNorms that apply
    // the weight in fp32, and GptOssMLP (a biased top-k router and GptOssExperts' fused
    // [E, h, 2I] and [E, I, h] parameters, looped over per expert in training).
    bool gptOss = false;
    // Llama-4's text model (Llama4ForCausalLM): RoPE as complex products in fp32 on the layers
    // no_rope_layers marks (the others, NoPE, scale q by a per-position temperature instead),
    // an L2 norm of q and k on the RoPE layers (use_qk_norm), chunked attention on the RoPE
    // layers (attention_chunk_size, handled as a sliding window: from that length on SDPA
    // gets a mask), and on moe_layers Llama4TextMoe: a sigmoid top-k router, every expert run
    // on every token (the input repeated per expert and scaled by its router score, zero
    // outside the top k) through two batched GEMMs, plus a shared expert; the other layers a
    // dense MLP of intermediate_size_mlp.
    bool llama4 = false;
    int64_t interMlp = 0;
    std::vector<char> moeLayers;  // Llama-4: per layer, whether its feed_forward is the MoE
    bool l2QkNorm = false, temperatureTuning = false;
    // Ernie-4.5-MoE (ernie4_5_moe): Llama's layout with use_bias on every projection, RoPE in
    // fp32 on interleaved pairs (cos and sin repeated per pair in each layer), and on
    // moeLayers (from moe_layer_start_index to moe_layer_end_index, every
    // moe_layer_interval-th) Ernie4_5_MoeSparseMoeBlock: Qwen's expert loop behind a router
    // that runs in fp32 (`gate`, an fp32 nn.Linear fed hidden_states.float() with autocast
    // off; transformers keeps it fp32 in any dtype), a correction bias (moe_statics, not
    // trained) added before the top k, the top-k weights always renormalised, and shared
    // experts (one SwiGLU of moe_intermediate_size x moe_num_shared_experts) added ungated.
    bool ernie = false;
    [[nodiscard]] bool deepseekExperts() const { return deepseek || glm; }
    int64_t qLora = 0, kvLora = 0, ropeDim = 0, nopeDim = 0, vDim = 0, firstDense = 0;
    int64_t sharedExperts = 0;
    int64_t maxPositions = 0;
};

// Sizes beyond these would overflow parameter counts long before they describe a model
// (the largest published decoders have hidden sizes near 2^14 and vocabularies near 2^18).
constexpr int64_t kMaxDim = int64_t{1} << 22;
// Experts over all layers (num_hidden_layers x experts per layer): 4x the largest published
// mixtures, and a graph that builds in about a second.
constexpr int64_t kMaxExperts = int64_t{1} << 16;

int64_t positive(const JsonReader& r, std::string_view key) {
    const JsonReader v = r.at(key);
    const int64_t n = v.asIntAtLeast(1);
    if (n > kMaxDim) v.fail("implausibly large (more than " + std::to_string(kMaxDim) + ")");
    return n;
}

// Builds a Llama-like decoder (transformers' LlamaForCausalLM and the families that share
// its layout, LlamaLike): the module tree in registration order, each module with its
// parameters and the costs of its own operators. One method per part of a decoder layer.
class LlamaLikeBuilder {
public:
    LlamaLikeBuilder(const LlamaLike& config, const HfLoadOptions& o)
        : c(config),
          cb{g, static_cast<double>(dtypeSize(o.activationDtype))},
          pd(o.paramDtype),
          h(c.hidden),
          dq(c.heads * c.headDim),
          dkv(c.kvHeads * c.headDim),
          H(static_cast<double>(h)) {
        g.name = c.family;
        g.maxPositions = c.maxPositions;
        g.slidingWindow = c.slidingWindow;
        g.source = "hf:" + c.family;
        g.activationDtype = o.activationDtype;
        g.setRootClass(c.llama4 ? "Llama4ForCausalLM" : c.prefix + "ForCausalLM");
    }

    Expected<ModelGraph> build(const std::string& file) {
        ModuleId model =
            g.addModule(g.root(), "model", c.prefix + (c.gemma3 ? "TextModel" : "Model"));
        ModuleId embed = g.addModule(model, "embed_tokens",
                                     c.gemma3 ? "Gemma3TextScaledWordEmbedding" : "Embedding");
        ParamId embedW = g.addParam(embed, "weight", {c.vocab, h}, pd);
        cb.embedding(embed, H);
        cb.dropout(embed, H, c.embedDropout);  // StarCoder2's, in its model's forward
        if (c.gemma || c.granite) {
            // The embedding times sqrt(hidden_size) (Granite: embedding_multiplier): a
            // multiply by a constant, nothing saved.
            if (c.gemma3) g.addBuffer(embed, {"embed_scale", {}, DType::Float32, false});
            // Counted at the embedding (Gemma-2 and Granite multiply in their model's
            // forward, right after).
            cb.scaleByConstant(embed, H);
        }
        ModuleId layers = g.addModule(model, "layers", "ModuleList", {"ModuleList"});
        for (int64_t i = 0; i < c.layers; ++i)
            decoderLayer(g.addModule(layers, std::to_string(i), c.prefix + "DecoderLayer"), i);
        rmsNorm(model, "norm");
        if (c.rotaryPerType)
            rotaryPerType(model);
        else {
            const ModuleId rot =
                cb.rotaryEmbedding(model, "rotary_emb", c.prefix + "RotaryEmbedding", c.rotaryDim,
                                   c.headDim, c.deepseekV2 || c.llama4);
            if (c.gptOss) gptOssRotary(rot);
            // Ernie's cos and sin stay fp32 and unsaved: each layer repeats them per pair and
            // keeps its own copies (ModuleCost's perPosition, in attention()).
            if (c.ernie) g.cost(rot).savedBytes = {};
        }
        if (c.gemma3)  // the sliding-window layers' own cos and sin (rope_local_base_freq)
            cb.rotaryEmbedding(model, "rotary_emb_local", c.prefix + "RotaryEmbedding", c.rotaryDim,
                               c.headDim);
        g.cost(model).outputBytes.perToken += H * cb.e;
        cb.lmHead("lm_head", c.tie ? std::optional(embedW) : std::nullopt, c.vocab, h, pd);
        // logits / logits_scaling (Cohere: * logit_scale): the scaled logits replace lm_head's.
        if (c.granite || c.cohere) cb.scaleByConstant(g.root(), static_cast<double>(c.vocab));
        if (c.finalSoftcap > 0) {
            // logits / cap, tanh (keeps its output), * cap, before the loss.
            auto& rc = g.cost(g.root());
            const double V = static_cast<double>(c.vocab);
            rc.savedBytes.perToken += V * cb.e;
            rc.fwdMemKernels += 3;
            rc.bwdMemKernels += 3;
            rc.fwdMemBytes.perToken += 6 * V * cb.e;
            rc.bwdMemBytes.perToken += 7 * V * cb.e;
        }
        cb.causalLmLoss(g.root(), static_cast<double>(c.vocab));
        if (Status s = g.finalize(); !s) return Error{file + ":/: " + s.error()};
        return g;
    }

private:
    // OLMo-3's rotary embeddings, one per attention type (the sliding layers' without
    // rope_scaling): each layer saves its type's cos and sin, so a type no layer has keeps
    // nothing.
    void rotaryPerType(ModuleId model) {
        ModuleId dict = g.addModule(model, "rotary_embs", "ModuleDict", {"ModuleDict"});
        for (const bool sliding : {true, false}) {
            ModuleId m = cb.rotaryEmbedding(dict, sliding ? "sliding_attention" : "full_attention",
                                            c.prefix + "RotaryEmbedding", c.rotaryDim, c.headDim);
            const bool used = std::any_of(c.slidingLayers.begin(), c.slidingLayers.end(),
                                          [&](char s) { return (s != 0) == sliding; }) ||
                              (c.slidingLayers.empty() && !sliding);
            if (!used) g.cost(m).savedBytes = {};
        }
    }

    // gpt-oss's cos and sin are (b, s, head_dim / 2) each (no cat of the halves), scaled by
    // YaRN's attention factor (two more multiplies).
    void gptOssRotary(ModuleId rot) {
        auto& rc = g.cost(rot);
        rc.savedBytes.perToken = static_cast<double>(c.headDim) * cb.e;
        rc.outputBytes.perToken = static_cast<double>(c.headDim) * cb.e;
        rc.fwdMemKernels += 2;
    }

    ModuleId linear(ModuleId parent, const char* name, int64_t in, int64_t out, bool bias,
                    bool savesInput, bool sumsInputGrad = false) {
        ModuleId m = g.addModule(parent, name, "Linear");
        g.addParam(m, "weight", {out, in}, pd);
        if (bias) g.addParam(m, "bias", {out}, pd);
        // With a bias, nn.Linear on 3-D input runs aten.addmm (at::linear folds the batch
        // into one addmm), without one aten.mm: what op-level checkpointing sees.
        cb.linear(m, static_cast<double>(in), static_cast<double>(out), savesInput,
                  /*addmm=*/bias, sumsInputGrad);
        return m;
    }
    // An RMSNorm over `width` (its weight's size), CostBuilder::rmsNorm's costs.
    ModuleId normOf(ModuleId parent, const char* name, int64_t width, bool weightInFp32 = false) {
        if (c.starcoder2) return cb.layerNorm(parent, name, width, pd);
        if (c.cohere) {
            ModuleId m = g.addModule(parent, name, c.prefix + "LayerNorm");
            g.addParam(m, "weight", {width}, pd);
            cb.cohereLayerNorm(m, static_cast<double>(width));
            return m;
        }
        if (c.olmo1) {
            ModuleId m = g.addModule(parent, name, "OlmoLayerNorm");
            cb.fp32LayerNorm(m, static_cast<double>(width));
            return m;
        }
        ModuleId m = g.addModule(parent, name, c.prefix + "RMSNorm");
        g.addParam(m, "weight", {width}, pd);
        cb.rmsNorm(m, static_cast<double>(width), 1, weightInFp32);
        return m;
    }
    ModuleId rmsNorm(ModuleId parent, const char* name) {
        return normOf(parent, name, h, c.olmo2 || c.gemma || c.gptOss);
    }
    // SwiGLU MLP: down(silu(gate(x)) * up(x)). Saved in the MLP itself: gate output (SiLU
    // input), SiLU output and up output (the mul's operands). `tokenShare` is the fraction
    // of tokens routed to this MLP (1 for dense, top_k/num_experts for an expert under
    // balanced routing).
    void swiglu(ModuleId m, const char* gate, const char* up, const char* down, int64_t inter,
                double tokenShare, bool gateSavesInput, const char* actName = "act_fn") {
        const double I = static_cast<double>(inter);
        auto scaled = [&](ModuleId x) {
            auto& cc = g.cost(x);
            for (ScaledCost* sc : {&cc.fwdFlops, &cc.bwdFlops, &cc.fwdMemBytes, &cc.bwdMemBytes,
                                   &cc.savedBytes, &cc.outputBytes, &cc.mmOutputBytes}) {
                sc->perToken *= tokenShare;
                sc->fixedPerToken *= tokenShare;
            }
            for (auto& gm : cc.gemms)
                gm.mPerToken *= tokenShare;
        };
        ModuleId gm, um, dm;
        // transformers registers gate, up, down (Llama) or w1, w2, w3 (Mixtral) in this order.
        if (std::string(gate) == "w1") {
            gm = linear(m, "w1", h, inter, c.mlpBias, gateSavesInput);
            dm = linear(m, "w2", inter, h, c.mlpBias, true);
            um = linear(m, "w3", h, inter, c.mlpBias, false, true);
        } else {
            gm = linear(m, gate, h, inter, c.mlpBias, gateSavesInput);
            um = linear(m, up, h, inter, c.mlpBias, false, true);
            dm = linear(m, down, inter, h, c.mlpBias, true);
        }
        g.addModule(m, actName, c.actClass);
        auto& mc = g.cost(m);
        mc.fwdMemBytes.perToken += 5 * I * cb.e;
        mc.bwdMemBytes.perToken += 9 * I * cb.e;  // three kernels of two inputs and an output
        mc.fwdMemKernels += 2;                    // silu, mul
        mc.bwdMemKernels += 3;                    // mul, mul, silu_backward
        mc.savedBytes.perToken += 3 * I * cb.e;
        mc.outputBytes.perToken += H * cb.e;
        for (ModuleId x : {gm, um, dm, m})
            scaled(x);
    }

    // DeepSeek's multi-head latent attention (DeepseekV3Attention, transformers 4.57, SDPA):
    // q = q_b_proj(q_a_layernorm(q_a_proj(x))) (or q_proj(x)), split into a no-position part
    // and a rotary part; kv_a_proj_with_mqa(x) gives the latent and one rotary key shared by
    // every head; kv_b_proj(kv_a_layernorm(latent)) gives each head's key part and value.
    // SDPA then saves the concatenated q and k (heads x (nope + rope) each), the value, a
    // view whose storage is kv_b_proj's whole output (heads x (nope + v)), its output
    // (heads x v, also o_proj's input) and the fp32 logsumexp. Interleaved RoPE copies q's and
    // k's rotary parts and saves nothing per token.
    void mla(ModuleId attn) {
        const int64_t qk = c.nopeDim + c.ropeDim;
        if (c.qLora > 0) {
            linear(attn, "q_a_proj", h, c.qLora, c.qkvBias, true);
            normOf(attn, "q_a_layernorm", c.qLora);
            linear(attn, "q_b_proj", c.qLora, c.heads * qk, false, true);
        } else {
            linear(attn, "q_proj", h, c.heads * qk, false, true);
        }
        linear(attn, "kv_a_proj_with_mqa", h, c.kvLora + c.ropeDim, c.qkvBias, false, true);
        {
            // Its input is a slice of kv_a_proj_with_mqa's output: under a lower compute
            // dtype the fp32 upcast is a copy (4·kvLora, counted by rmsNorm), in fp32 the
            // upcast is the slice itself and keeps the whole output, rotary key included:
            // 4·rope more bytes only when e = 4, written as 2·rope·e - 4·rope so the
            // simulator's dtype rescaling keeps it exact.
            ModuleId kvNorm = normOf(attn, "kv_a_layernorm", c.kvLora);
            auto& kc = g.cost(kvNorm);
            kc.savedBytes.perToken += 2.0 * static_cast<double>(c.ropeDim) * cb.e;
            kc.savedBytes.fixedPerToken -= 4.0 * static_cast<double>(c.ropeDim);
        }
        linear(attn, "kv_b_proj", c.kvLora, c.heads * (c.nopeDim + c.vDim), false, true);
        linear(attn, "o_proj", c.heads * c.vDim, h, c.oBias, false);
        const double Hq = static_cast<double>(c.heads * qk);
        const double rot = static_cast<double>((c.heads + 1) * c.ropeDim);
        auto& ac = g.cost(attn);
        // Interleave copies, RoPE on the rotary parts, the two cats.
        ac.fwdMemBytes.perToken += (10.0 * rot + 4.0 * Hq) * cb.e;
        ac.bwdMemBytes.perToken += (10.0 * rot + 4.0 * Hq) * cb.e;
        ac.fwdMemKernels += 16;
        ac.bwdMemKernels += 22;
        ac.outputBytes.perToken += H * cb.e;
        cb.sdpa(attn, static_cast<double>(c.heads), static_cast<double>(qk),
                2.0 * Hq + static_cast<double>(c.heads * (c.nopeDim + c.vDim)),
                static_cast<double>(c.vDim));
    }
    // DeepseekV3MoE: experts, then the router (a module with its own weight and the
    // e_score_correction_bias buffer), then the shared experts on every token.
    void deepseekMoe(ModuleId layer) {
        ModuleId moe = g.addModule(layer, "mlp", c.prefix + "MoE");
        ModuleId experts = g.addModule(moe, "experts", "ModuleList", {"ModuleList"});
        const double share = static_cast<double>(c.topK) / static_cast<double>(c.experts);
        for (int64_t x = 0; x < c.experts; ++x) {
            ModuleId ex = g.addModule(experts, std::to_string(x), c.prefix + "MLP");
            swiglu(ex, "gate_proj", "up_proj", "down_proj", c.moeInter, share, true);
        }
        // Router: F.linear on fp32 copies of x and the weight, sigmoid, group-limited top-k
        // (no gradient), gather of the chosen scores, renormalisation with norm_topk_prob.
        // Saved: the fp32 input (a copy, or x itself when it is fp32: 4h either way), the
        // sigmoid's output, the gather's int64 indices, the renormalising sum and scores.
        // Not counted: the weight's fp32 copy under bf16 (experts x h x 4 bytes per layer
        // and micro-batch, not per token).
        // V2's DeepseekV2MoEGate: the same fp32 linear with a softmax, top-k straight from
        // the scores (or by group), no correction bias and no renormalisation.
        ModuleId gate =
            g.addModule(moe, "gate", c.prefix + (c.deepseekV2 ? "MoEGate" : "TopkRouter"));
        g.addParam(gate, "weight", {c.experts, h}, pd);
        if (!c.deepseekV2)
            g.addBuffer(gate, {"e_score_correction_bias", {c.experts}, DType::Float32, true});
        const double E = static_cast<double>(c.experts), k = static_cast<double>(c.topK);
        {
            auto& gc = g.cost(gate);
            gc.addGemm({1.0, E, H, 1});
            gc.fwdFlops.perToken += 2 * H * E;
            gc.bwdFlops.perToken += 4 * H * E;
            gc.savedBytes.fixedPerToken += 4 * H + 4 * E + 8 * k + (c.normTopK ? 4 * k + 4 : 0);
            gc.fwdMemBytes.perToken += 4 * H + 24 * E;
            gc.bwdMemBytes.perToken += 8 * H + 16 * E;
            gc.fwdMemKernels += 14;  // casts, sigmoid, the group top-k and masks, gather, div
            gc.bwdMemKernels += 6;
            gc.outputBytes.fixedPerToken += 12 * k;
        }
        // Shared experts read x itself. Their gate_proj saves x unless x is already the
        // router's saved fp32 input (fp32 compute): h·e bytes when e < 4, none at e = 4,
        // written as 4h - h·e (fixed 4h, and -h per element byte that follows the compute
        // dtype) so the simulator's dtype rescaling keeps it exact.
        if (c.sharedExperts > 0) {
            ModuleId sh = g.addModule(moe, "shared_experts", c.prefix + "MLP");
            swiglu(sh, "gate_proj", "up_proj", "down_proj", c.moeInter * c.sharedExperts, 1.0,
                   false);
            auto& sc = g.cost(g.module(sh).children.front());  // gate_proj
            sc.savedBytes.perToken -= H * cb.e;
            sc.savedBytes.fixedPerToken += 4 * H;
        }
        // Per routed slot: the token and slot indices (int64 each), the fp32 routing weight,
        // and an fp32 copy of the expert outputs: V3's index_add_ keeps the fp32 weighted
        // output (and its multiply the expert's output, in the compute dtype); V2's in-place
        // multiply of the slots' fp32 outputs by their weights keeps a clone of its input
        // (measured with saved_tensors_hooks: 16k + 4k + 4hk bytes per token in fp32 and in
        // bf16).
        auto& mc = g.cost(moe);
        mc.savedBytes.fixedPerToken += 16 * k + 4 * k + 4 * H * k;
        if (!c.deepseekV2) mc.savedBytes.perToken += H * k * cb.e;
        mc.fwdMemBytes.perToken += 2.0 * H * k * cb.e + 8 * H * k;
        mc.bwdMemBytes.perToken += 2.0 * H * k * cb.e + 8 * H * k;
        mc.fwdMemKernels += 4 + 6 * static_cast<int32_t>(c.experts);
        mc.bwdMemKernels += 4 + 10 * static_cast<int32_t>(c.experts);
        mc.outputBytes.perToken += H * cb.e;
    }

    void decoderLayer(ModuleId layer, int64_t i) {
        attention(layer, i);
        const bool sparse = c.ernie ? c.moeLayers[static_cast<size_t>(i)] != 0
                                    : c.experts > 0 && (i + 1) % c.sparseStep == 0 &&
                                          std::find(c.mlpOnlyLayers.begin(), c.mlpOnlyLayers.end(),
                                                    i) == c.mlpOnlyLayers.end();
        if (c.deepseekExperts() && i >= c.firstDense)
            deepseekMoe(layer);
        else if (c.family == "granitemoe")
            parallelMoe(layer);
        else if (c.gptOss)
            gptOssMoe(layer);
        else if (c.llama4)
            llama4FeedForward(layer, c.moeLayers[static_cast<size_t>(i)] != 0);
        else if (sparse && !c.deepseekExperts())
            sparseMoe(layer);
        else
            denseMlp(layer);
        norms(layer);
        cb.residualAdds(layer, H, 2);
        // residual + branch * residual_multiplier, twice.
        if (c.granite) cb.scaleByConstant(layer, H, 2);
        if (!c.deepseek && !sparse && !c.llama4 && !c.legacySdpaAttention && c.residDropout == 0 &&
            !c.starcoder2 && !c.cohere && !c.ernie && c.branchDropout == 0 && c.clipQkv == 0)
            compiledRule(layer, i);
    }

    // The attention module: projections (or MLA), q/k norms, RoPE and SDPA.
    void attention(ModuleId layer, int64_t i) {
        ModuleId attn = g.addModule(
            layer, "self_attn", c.prefix + (c.legacySdpaAttention ? "SdpaAttention" : "Attention"));
        if (c.gptOss) {
            gptOssAttention(attn);
            return;
        }
        if (c.deepseek) {
            mla(attn);
        } else if (c.phi3) {
            // o_proj is registered first but runs last: op-level checkpointing keeps every
            // second mm in execution order (qkv_proj, o_proj, gate_up_proj, down_proj), and
            // the resolver counts mm calls in module order, so the two record each other's
            // mm output (ModuleCost::mmOutputBytes; their GEMMs, FLOPs and saved bytes stay
            // their own).
            // Phi-3's RoPE makes q with a cat (rotated part, pass-through part, even when the
            // latter is empty), so SDPA returns its output in q's (b, h, s, d) memory order
            // (the flash kernels allocate it like q) and merging the heads back copies:
            // o_proj saves that copy.
            ModuleId o = linear(attn, "o_proj", dq, h, false, true);
            ModuleId qkv = linear(attn, "qkv_proj", h, dq + 2 * dkv, false, true);
            std::swap(g.cost(o).mmOutputBytes, g.cost(qkv).mmOutputBytes);
        } else {
            // Gemma's attention_bias covers all four projections, as Llama's does.
            linear(attn, "q_proj", h, dq, c.qkvBias, true);
            linear(attn, "k_proj", h, dkv, c.qkvBias, false, true);
            linear(attn, "v_proj", h, dkv, c.qkvBias, false, true);
            // o_proj's input is SDPA's output transposed back: autograd saves one storage for
            // both, counted at SDPA. GLM's RoPE makes q with a cat, so SDPA's output comes
            // back in (b, h, s, d) order and the merge copies: o_proj saves the copy.
            linear(attn, "o_proj", dq, h, c.oBias, c.glm);
        }
        if (c.family == "qwen2_moe") {
            ModuleId rot = g.addModule(attn, "rotary_emb", c.prefix + "RotaryEmbedding");
            g.addBuffer(rot, {"inv_freq", {c.headDim / 2}, DType::Float32, false});
        }
        if (c.olmo2 || c.family == "olmoe") {
            // q_norm(q_proj(x)) and k_norm(k_proj(x)) before the heads are split (OLMoE's
            // norms apply the weight after the cast back, as Llama's).
            for (auto [name, width] : {std::pair{"q_norm", dq}, std::pair{"k_norm", dkv}})
                normOf(attn, name, width, c.olmo2);
        }
        const bool rope = c.ropeLayers.empty() || c.ropeLayers[static_cast<size_t>(i)];
        if (c.llama4 && c.l2QkNorm && rope) {
            // One parameterless module run on the rotated q, then on the rotated k.
            cb.l2Norm(g.addModule(attn, "qk_norm", "Llama4TextL2Norm"),
                      static_cast<double>(dq + dkv), static_cast<double>(c.heads + c.kvHeads));
        }
        if (c.qkNorm) {
            // q_norm(q_proj(x).view(b, s, heads, head_dim)), the same for k: registered after
            // o_proj; RoPE then runs on their outputs (and saves neither).
            for (auto [name, heads] :
                 {std::pair{"q_norm", c.heads}, std::pair{"k_norm", c.kvHeads}}) {
                ModuleId m = g.addModule(attn, name, c.prefix + "RMSNorm");
                g.addParam(m, "weight", {c.headDim}, pd);
                cb.rmsNorm(m, static_cast<double>(heads * c.headDim), static_cast<double>(heads),
                           c.gemma);
            }
        }
        // RoPE: q·cos + rotate_half(q)·sin saves only cos and sin (they need no gradient,
        // so q and rotate_half(q) are not kept); cos and sin are shared across layers and
        // counted once at rotary_emb. The rotated q and k are saved by SDPA.
        if (c.clipQkv > 0) {
            // clamp_ in place on each projection's output: autograd keeps a copy of the
            // unclamped output for clamp's backward (a clone forward, the clamp, and one
            // masked kernel backward, each).
            const double w = static_cast<double>(dq + 2 * dkv);
            auto& ac = g.cost(attn);
            ac.savedBytes.perToken += w * cb.e;
            ac.fwdMemKernels += 6;
            ac.bwdMemKernels += 3;
            ac.fwdMemBytes.perToken += 4 * w * cb.e;
            ac.bwdMemBytes.perToken += 3 * w * cb.e;
        }
        if (!c.deepseek) {
            auto& ac = g.cost(attn);
            // Per element of q and k: forward the products by cos and by sin (2 each), neg
            // (1), cat (2) and the add (3); backward the products (2 each), neg (1),
            // slice_backward's fills and copies (4), the in-place sums of the halves and of the
            // two paths (4) and SDPA's gradient made contiguous (2). Llama-3.1-8B on an H200
            // at 4,096 tokens: 25h forward, 37.5h backward (within 1 %).
            // A layer without RoPE (NoPE) runs none of it.
            const double ropes = rope && !c.llama4 ? 1 : 0;
            ac.fwdMemBytes.perToken += ropes * 10.0 * (dq + dkv) * cb.e;
            ac.bwdMemBytes.perToken += ropes * 15.0 * (dq + dkv) * cb.e;
            // rotate_half and the products for q and k (mul 4, neg 2, cat 2) and the two adds;
            // backward: mul 4, neg 2, slice_backward 4, add 4, clone 2. transformers fills a
            // DynamicCache in training too unless use_cache=False: two cats forward, the zeros
            // of their backward.
            ac.fwdMemKernels += rope && !c.llama4 ? 12 : 2;
            ac.bwdMemKernels += rope && !c.llama4 ? 18 : 2;
            if (c.llama4) llama4Positions(ac, rope);
            if (c.glm) {
                // The cats of the rotated and passed-through parts of q and k.
                ac.fwdMemKernels += 2;
                ac.bwdMemKernels += 2;
                ac.fwdMemBytes.perToken += 2.0 * (dq + dkv) * cb.e;
                ac.bwdMemBytes.perToken += 2.0 * (dq + dkv) * cb.e;
            }
            // Ernie's cos and sin, sliced and repeated per pair in each layer: two fp32
            // (1, 1, s, rotary) tensors the products keep, whatever the batch.
            if (c.ernie && rope) ac.savedBytes.perPosition += 2.0 * 4.0 * c.rotaryDim;
            if ((c.cohere || c.ernie) && rope && cb.e < 4) {
                // Cohere2's and Ernie's RoPE run in fp32: q and k cast up and back, each way.
                ac.fwdMemKernels += 4;
                ac.bwdMemKernels += 4;
                ac.fwdMemBytes.perToken += 2.0 * (dq + dkv) * (cb.e + 4);
                ac.bwdMemBytes.perToken += 2.0 * (dq + dkv) * (cb.e + 4);
            }
            ac.outputBytes.perToken += H * cb.e;
            const bool repeatKv = c.legacySdpaAttention && c.kvHeads < c.heads;
            // Phi-3's v is a view of qkv_proj's output, so SDPA keeps that whole storage
            // beside the rotated q and k (without a KV cache, as in training; a cache's cat
            // would copy v instead).
            cb.sdpa(attn, static_cast<double>(c.heads), static_cast<double>(c.headDim),
                    static_cast<double>(repeatKv ? 3 * dq
                                        : c.phi3 ? 2 * dq + 3 * dkv
                                                 : dq + 2 * dkv));
            if (!c.slidingLayers.empty() && c.slidingLayers[static_cast<size_t>(i)]) {
                ac.windowSavedBytes.perTokenSeq += cb.e;  // the mask in the compute dtype
                ac.windowAttentionCalls += 1;
                // repeat_kv's copies at the query width replace k and v (Phi-3: replace the
                // rotated k and the qkv_proj output that v is a view of). One key/value head
                // repeats as a view (expand and reshape over a dimension of size 1): no copy.
                if (c.kvHeads > 1 && c.kvHeads < c.heads && !repeatKv)
                    ac.windowSavedBytes.perToken +=
                        static_cast<double>(c.phi3 ? dq - 3 * dkv : 2 * (dq - dkv)) * cb.e;
            }
            if (repeatKv) {
                // repeat_kv's expand + reshape: one copy of K and one of V forward, their
                // gradients summed back over the repeated heads.
                ac.fwdMemKernels += 2;
                ac.bwdMemKernels += 2;
                ac.fwdMemBytes.perToken += 2.0 * (dkv + dq) * cb.e;
                ac.bwdMemBytes.perToken += 2.0 * (dkv + dq) * cb.e;
            }
        }
        cb.dropout(attn, H, c.branchDropout);  // Seed-OSS, on o_proj's output
    }

    // gpt-oss's attention (GptOssAttention on transformers' eager path): q/k/v/o with
    // biases, a sink logit per head (`sinks`, the module's own parameter, so first in
    // named_parameters), RoPE on the two halves of each head (four multiplies, a sub, an add
    // and a cat per tensor; it keeps only cos and sin), then eager_attention_forward:
    // repeat_kv copies k and v to every query head, q x k^T scaled plus the (b, 1, s, s)
    // mask, the sinks concatenated as one more column, minus each row's max, softmax in the
    // compute dtype, the sink column dropped, times v; the heads merged back (a copy).
    // Saved (saved_tensors_hooks, fp32 and bf16): q and the repeated k and v (the query
    // width each), the max's int64 indices (one a head), the probabilities (heads x (s + 1)
    // a token; the second matmul keeps a view of them) and o_proj's input. A sliding-window
    // layer differs only in its mask: eager attention computes every s x s score either way.
    void gptOssAttention(ModuleId attn) {
        g.addParam(attn, "sinks", {c.heads}, pd);
        linear(attn, "q_proj", h, dq, true, true);
        linear(attn, "k_proj", h, dkv, true, false, true);
        linear(attn, "v_proj", h, dkv, true, false, true);
        linear(attn, "o_proj", dq, h, true, true);
        auto& ac = g.cost(attn);
        const double Q = static_cast<double>(dq), KV = static_cast<double>(dkv);
        const double heads = static_cast<double>(c.heads), d = static_cast<double>(c.headDim);
        const double e = cb.e;
        ac.eagerAttentionCalls += 1;
        // Two bmm's of 2·s·s·d a head forward, each twice that backward (flop_counter).
        ac.fwdFlops.perTokenSeq += 4 * heads * d;
        ac.bwdFlops.perTokenSeq += 8 * heads * d;
        ac.savedBytes.perToken += (3 * Q + heads) * e;
        ac.savedBytes.fixedPerToken += 8 * heads;
        ac.savedBytes.perTokenSeq += heads * e;
        // Memory-bound kernels, bytes counted from the operators (not yet checked on a GPU
        // trace). Per token: RoPE (9 elements of q and k forward, 8 backward), repeat_kv's
        // copies and their sums back (when there are fewer key/value heads), the heads
        // merged (2 of the output each way), and the two cache cats transformers runs in
        // training unless use_cache is off. Per token and key position, a head each:
        // forward the scale, the mask's add (reading the mask once), the cat with the sinks,
        // the max, the subtraction and softmax; backward the slice's zero fill and copy,
        // softmax's backward, the max's sum, zero fill, scatter and add, and the scale's.
        const bool repeat = c.kvHeads < c.heads;
        ac.fwdMemBytes.perToken += (9 * (Q + KV) + (repeat ? 2 * (Q + KV) : 0) + 2 * Q) * e;
        ac.bwdMemBytes.perToken += (8 * (Q + KV) + (repeat ? 2 * (Q + KV) : 0) + 2 * Q) * e;
        ac.fwdMemBytes.perTokenSeq += (11 * heads + 1) * e;
        ac.bwdMemBytes.perTokenSeq += 13 * heads * e;
        ac.fwdMemKernels += 14 + (repeat ? 2 : 0) + 1 + 2 + 6;
        ac.bwdMemKernels += 16 + (repeat ? 2 : 0) + 1 + 9;
        ac.outputBytes.perToken += H * e;
    }

    // gpt-oss's mixture of experts (GptOssMLP): the router (GptOssTopKRouter: its own
    // weight [E, h] and bias, F.linear, top k, softmax over the k logits, scattered into a
    // [tokens, E] table), then GptOssExperts (gate_up_proj [E, h, 2I] and down_proj
    // [E, I, h], each with a bias) looped over in training: each expert gathers its tokens,
    // x @ gate_up_proj[e] + bias, gate and up interleaved (::2, 1::2) and clamped at the
    // swiglu limit, gate x sigmoid(1.702 gate), (up + 1) x that, @ down_proj[e] + bias,
    // times the routing weight, index_add_ back.
    // Saved (saved_tensors_hooks, fp32 and bf16): the router's input, its top-k indices
    // (int64) and softmax; per routed slot the token index (a column of torch.where's int64
    // pairs: 16 bytes), the gathered input (h), gate_up (2I, kept by both clamps), the clamped
    // gate, the sigmoid, up + 1, the GLU and their product (I each), the expert's output (h)
    // and its routing weight (kept by the multiply) and the weighted output (h, kept by
    // index_add_).
    void gptOssMoe(ModuleId layer) {
        ModuleId mlp = g.addModule(layer, "mlp", c.prefix + "MLP");
        const double E = static_cast<double>(c.experts), k = static_cast<double>(c.topK);
        const double I = static_cast<double>(c.inter), e = cb.e;
        ModuleId router = g.addModule(mlp, "router", c.prefix + "TopKRouter");
        g.addParam(router, "weight", {c.experts, h}, pd);
        g.addParam(router, "bias", {c.experts}, pd);
        cb.linear(router, H, E, true, /*addmm=*/true);
        auto& rc = g.cost(router);
        rc.savedBytes.perToken += k * e;
        rc.savedBytes.fixedPerToken += 8 * k;
        // topk, softmax, zeros_like and scatter_ forward; backward the scatter's gather,
        // softmax's, topk's zero fill and scatter.
        rc.fwdMemKernels += 4;
        rc.bwdMemKernels += 4;
        rc.fwdMemBytes.perToken += (2 * E + 3 * k) * e;
        rc.bwdMemBytes.perToken += (E + 6 * k) * e;
        ModuleId ex = g.addModule(mlp, "experts", c.prefix + "Experts");
        g.addParam(ex, "gate_up_proj", {c.experts, h, 2 * c.inter}, pd);
        g.addParam(ex, "gate_up_proj_bias", {c.experts, 2 * c.inter}, pd);
        g.addParam(ex, "down_proj", {c.experts, c.inter, h}, pd);
        g.addParam(ex, "down_proj_bias", {c.experts, h}, pd);
        auto& xc = g.cost(ex);
        const auto calls = static_cast<int32_t>(c.experts);
        cb.expertGemm(xc, E, k, H, 2 * I);
        cb.expertGemm(xc, E, k, I, H);
        xc.savedBytes.perToken += k * (3 * H + 7 * I + 1) * e;
        xc.savedBytes.fixedPerToken += 16 * k;
        // Per expert forward: the gather, the two bias adds, two clamps, the scale, sigmoid,
        // two multiplies, the add of 1, the routing weight's gather and multiply, index_add_
        // and torch.where; once, next_states' zeros and the one-hot mask's four ops.
        // Backward per expert about 24: the pointwise ops' gradients, the bias sums, the
        // interleaved slices' fill and copies, and for the gathered input and the routing
        // weight a zero-filled tensor of the full size each, scattered into and added to
        // the gradient so far (4 of h and of E a token, per expert).
        xc.fwdMemKernels += 14 * calls + 5;
        xc.bwdMemKernels += 24 * calls;
        xc.fwdMemBytes.perToken += (k * (9 * H + 20 * I) + H) * e;
        xc.bwdMemBytes.perToken += (k * (7 * H + 34 * I) + E * (4 * H + 4 * E)) * e;
        xc.outputBytes.perToken += H * e;
        g.cost(mlp).outputBytes.perToken += H * e;
    }

    // Llama-4's positions in the attention. A RoPE layer rotates q and k as complex numbers
    // in fp32 (apply_rotary_emb: q.float() viewed as pairs, times freqs_cis, viewed back and
    // cast to the compute dtype); the product keeps only freqs_cis, counted at rotary_emb.
    // A NoPE layer with attn_temperature_tuning scales q by a per-position fp32 factor
    // (which promotes the product to fp32) and casts it back; the factor it keeps is s
    // floats a sequence, left out. Per element forward and backward: the complex multiply
    // (reads 4, writes 4) and, below fp32, the two casts (e + 4 each).
    void llama4Positions(ModuleCost& ac, bool rope) {
        const bool castAround = cb.e < 4;
        const double cast = castAround ? 2.0 * (cb.e + 4) : 0.0;
        if (rope) {
            const double w = static_cast<double>(dq + dkv);
            ac.fwdMemKernels += 2 + (castAround ? 4 : 0);
            ac.bwdMemKernels += 2 + (castAround ? 4 : 0);
            ac.fwdMemBytes.perToken += w * (8.0 + cast);
            ac.bwdMemBytes.perToken += w * (8.0 + cast);
        } else if (c.temperatureTuning) {
            const double w = static_cast<double>(dq);
            // The product written in fp32, then (below fp32) cast back.
            ac.fwdMemKernels += 1 + (castAround ? 1 : 0);
            ac.bwdMemKernels += 1 + (castAround ? 1 : 0);
            ac.fwdMemBytes.perToken += w * (cb.e + 4.0 + (castAround ? cb.e + 4 : 0));
            ac.bwdMemBytes.perToken += w * (cb.e + 4.0 + (castAround ? cb.e + 4 : 0));
        }
    }

    // Llama-4's feed_forward: Llama4TextMoe on the MoE layers, else Llama4TextMLP of
    // intermediate_size_mlp (SwiGLU; its activation module is `activation_fn`).
    // Llama4TextMoe (transformers 4.57, training): Llama4Router (Linear to the experts, top k
    // of the logits, the others -inf, sigmoid in fp32 cast back), the tokens repeated once
    // per expert and multiplied by that expert's score (zero outside the top k), then
    // Llama4TextExperts on all of them: bmm with gate_up_proj [E, h, 2I], SiLU of the gate
    // half times the up half, bmm with down_proj [E, I, h]; the E outputs summed per token
    // and added in place to the shared expert's output. Every expert computes every token.
    // Saved (saved_tensors_hooks, fp32 and bf16): the router's input (also the shared
    // expert's) and its fp32 sigmoid (E) and int64 top-k indices (k); the repeated input and
    // the scores column (E x (h + 1)); the scaled input, gate_up, the SiLU's output and the
    // product (E x (h + 4I)); the shared expert's SwiGLU (4I).
    void llama4FeedForward(ModuleId layer, bool moe) {
        if (!moe) {
            ModuleId mlp = g.addModule(layer, "feed_forward", c.prefix + "MLP");
            swiglu(mlp, "gate_proj", "up_proj", "down_proj", c.interMlp, 1.0, true,
                   "activation_fn");
            return;
        }
        ModuleId ff = g.addModule(layer, "feed_forward", c.prefix + "Moe");
        const double E = static_cast<double>(c.experts), k = static_cast<double>(c.topK);
        const double I = static_cast<double>(c.inter), e = cb.e;
        ModuleId ex = g.addModule(ff, "experts", c.prefix + "Experts");
        g.addParam(ex, "gate_up_proj", {c.experts, h, 2 * c.inter}, pd);
        g.addParam(ex, "down_proj", {c.experts, c.inter, h}, pd);
        g.addModule(ex, "act_fn", c.actClass);
        auto& xc = g.cost(ex);
        // One bmm each way, of E batches of every token (k = E slots a token): priced as E
        // GEMMs of the tokens; op-level checkpointing's mm policy does not keep a bmm.
        cb.expertGemm(xc, E, E, H, 2 * I, /*mm=*/false);
        cb.expertGemm(xc, E, E, I, H, /*mm=*/false);
        xc.savedBytes.perToken += E * (H + 4 * I) * e;
        // silu and the multiply forward; backward the multiply's two products, silu's and
        // the cat of the gate and up gradients.
        xc.fwdMemKernels += 2;
        xc.bwdMemKernels += 4;
        xc.fwdMemBytes.perToken += 5 * E * I * e;
        xc.bwdMemBytes.perToken += 13 * E * I * e;
        xc.outputBytes.perToken += E * H * e;
        ModuleId router = g.addModule(ff, "router", "Llama4Router");
        g.addParam(router, "weight", {c.experts, h}, pd);
        cb.linear(router, H, E, true);
        auto& rc = g.cost(router);
        rc.savedBytes.fixedPerToken += 4 * E + 8 * k;
        // topk, full_like, scatter_, sigmoid (with its casts below fp32) forward; backward
        // sigmoid's, the scatter's gather, topk's zero fill and scatter (and the casts).
        const bool castAround = e < 4;
        rc.fwdMemKernels += 4 + (castAround ? 2 : 0);
        rc.bwdMemKernels += 4 + (castAround ? 2 : 0);
        rc.fwdMemBytes.perToken += (3 * E + 2 * k) * e + 8 * E + (castAround ? 2 * E * (e + 4) : 0);
        rc.bwdMemBytes.perToken +=
            (3 * E + 2 * k) * e + 12 * E + (castAround ? 2 * E * (e + 4) : 0);
        ModuleId sh = g.addModule(ff, "shared_expert", c.prefix + "MLP");
        swiglu(sh, "gate_proj", "up_proj", "down_proj", c.inter, 1.0, false, "activation_fn");
        auto& fc = g.cost(ff);  // adding modules moved the costs
        fc.savedBytes.perToken += E * (H + 1) * e;
        // Forward: the repeat, the scores' column copied out, the multiply, the sum over the
        // experts and the in-place add; backward the multiply's two gradients (a product and
        // a product summed over h), the repeat's sum and the column's copy back.
        fc.fwdMemKernels += 5;
        fc.bwdMemKernels += 5;
        fc.fwdMemBytes.perToken += (4 * E * H + 5 * H + 3 * E) * e;
        fc.bwdMemBytes.perToken += (7 * E * H + H + 4 * E) * e;
        fc.outputBytes.perToken += H * e;
    }

    // Granite-MoE's block (GraniteMoeMoE, `block_sparse_moe`): a router (GraniteMoeTopKGating:
    // Linear to the experts, fp32 logits, top k, softmax over them), the token slots gathered
    // in expert order, each expert's SwiGLU through two GraniteMoeParallelExperts (one
    // [E, 2I, h] and one [E, h, I] parameter, an F.linear per expert on its share of the
    // slots, outputs concatenated), the outputs weighted and index_add'ed back.
    // Saved per token (k slots): the router's topk indices (int64) and fp32 softmax, the
    // slots' sorted order and token index (int64 each), the gathered input (h), the
    // concatenated gate/up output (2I, kept by the SiLU and the multiply), the SiLU output
    // and the product (I each, the product by output_linear), the expert output and its gate
    // (h + 1, by the weighting) and the weighted output (h, by index_add).
    void parallelMoe(ModuleId layer) {
        ModuleId moe = g.addModule(layer, "block_sparse_moe", c.prefix + "MoE");
        g.addModule(moe, "activation", c.actClass);
        const double E = static_cast<double>(c.experts), k = static_cast<double>(c.topK);
        const double I = static_cast<double>(c.inter);
        auto experts = [&](const char* name, int64_t in, int64_t out) {
            ModuleId m = g.addModule(moe, name, c.prefix + "ParallelExperts");
            g.addParam(m, "weight", {c.experts, out, in}, pd);
            auto& x = g.cost(m);
            const double In = static_cast<double>(in), Out = static_cast<double>(out);
            cb.expertGemm(x, E, k, In, Out);
            x.savedBytes.perToken += k * In * cb.e;
            x.outputBytes.perToken += k * Out * cb.e;
            // The per-expert outputs concatenated (backward: the input gradients likewise).
            x.fwdMemKernels += 1;
            x.bwdMemKernels += 1;
            x.fwdMemBytes.perToken += 2 * k * Out * cb.e;
            x.bwdMemBytes.perToken += 2 * k * In * cb.e;
        };
        experts("input_linear", h, 2 * c.inter);
        experts("output_linear", c.inter, h);
        ModuleId router = g.addModule(moe, "router", c.prefix + "TopKGating");
        linear(router, "layer", h, c.experts, false, true);
        auto& rc = g.cost(router);
        rc.savedBytes.fixedPerToken += 8 * k + 4 * k;
        // fp32 cast, topk, softmax, cast back, the one-hot scatter and its sum, the sort, the
        // division and the gates' gather; backward their gradients' casts, softmax's, topk's
        // scatter and the gather's index_put.
        rc.fwdMemKernels += 11;
        rc.bwdMemKernels += 7;
        rc.fwdMemBytes.fixedPerToken += 4 * E * 2 + 24 * k;
        rc.bwdMemBytes.fixedPerToken += 4 * E * 3 + 24 * k;
        auto& mc = g.cost(moe);
        mc.savedBytes.fixedPerToken += 16 * k;
        mc.savedBytes.perToken += k * (2 * I + I + H + 1 + H) * cb.e;
        // Gather, SiLU, multiply, gate multiply, zeros and index_add forward; backward the
        // index_add's gather, the gate multiply's two and its sum, the multiply's two, SiLU's,
        // the chunk's cat and the gather's index_put.
        mc.fwdMemKernels += 6;
        mc.bwdMemKernels += 10;
        mc.fwdMemBytes.perToken += (k * (2 * H + 2 * I + 3 * I + 3 * H + H) + 2 * H) * cb.e;
        mc.bwdMemBytes.perToken += (k * (3 * H + 3 * I + 4 * I + 4 * H + 2 * I) + 2 * H) * cb.e;
        mc.outputBytes.perToken += H * cb.e;
    }

    // A mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): router, experts, shared
    // expert.
    void sparseMoe(ModuleId layer) {
        const bool mixtral = c.family == "mixtral";
        ModuleId moe =
            g.addModule(layer, mixtral ? "block_sparse_moe" : "mlp", c.prefix + "SparseMoeBlock");
        // Router: Linear(h → E), softmax and top-k in fp32.
        if (c.ernie)
            ernieRouter(moe);
        else
            linear(moe, "gate", h, c.experts, false, true);
        auto& mc = g.cost(moe);
        // Saved per token, measured with saved_tensors_hooks on transformers' block (fp32
        // softmax, top-k indices, and with renormalisation the top-k values and their sum)
        // and per routed slot: the token and slot indices (int64 each), the routing
        // weight, the expert's output (kept by the multiply with the weight) and the
        // weighted output (kept by index_add_, whose backward expands to the source). The
        // expert's input is counted by its first projection.
        const double k = static_cast<double>(c.topK);
        // Ernie divides by clamp(sum, min): the clamp keeps the sum as well.
        mc.savedBytes.fixedPerToken += 4.0 * static_cast<double>(c.experts) + 8.0 * k + 16.0 * k +
                                       (c.normTopK ? 4.0 * k + 4.0 : 0.0) + (c.ernie ? 4.0 : 0.0);
        mc.savedBytes.perToken += (2.0 * H * k + k) * cb.e;
        mc.fwdMemBytes.perToken += 2.0 * H * cb.e * static_cast<double>(c.topK);
        mc.bwdMemBytes.perToken += 2.0 * H * cb.e * static_cast<double>(c.topK);
        // Router (softmax, topk, sum, div, one-hot scatter, ...: 11) and per expert the
        // token lookup, gathers, routing multiply and index_add_ (6); backward 8 + 10 per
        // expert (transformers 4.57, counted with a dispatch mode).
        mc.fwdMemKernels += 11 + 6 * static_cast<int32_t>(c.experts) - (c.normTopK ? 0 : 2);
        mc.bwdMemKernels += 8 + 10 * static_cast<int32_t>(c.experts) - (c.normTopK ? 0 : 2);
        mc.outputBytes.perToken += H * cb.e;
        ModuleId experts = g.addModule(moe, "experts", "ModuleList", {"ModuleList"});
        const double share = static_cast<double>(c.topK) / static_cast<double>(c.experts);
        for (int64_t x = 0; x < c.experts; ++x) {
            // Each expert gathers its tokens (hidden_states[top_x], a copy it saves).
            if (mixtral) {
                ModuleId ex = g.addModule(experts, std::to_string(x), "MixtralBlockSparseTop2MLP");
                swiglu(ex, "w1", "w3", "w2", c.inter, share, true);
            } else {
                ModuleId ex = g.addModule(experts, std::to_string(x), c.prefix + "MLP");
                swiglu(ex, "gate_proj", "up_proj", "down_proj", c.moeInter, share, true);
            }
        }
        if (c.ernie && c.sharedInter > 0) {
            // Ernie's shared experts run first on the block's input (their gate_proj keeps
            // it) and their output is added to the routed sum.
            ModuleId sh = g.addModule(moe, "shared_experts", c.prefix + "MLP");
            swiglu(sh, "gate_proj", "up_proj", "down_proj", c.sharedInter, 1.0, true);
            auto& bc = g.cost(moe);
            bc.fwdMemBytes.perToken += 3.0 * H * cb.e;
            bc.fwdMemKernels += 1;
        } else if (c.sharedInter > 0) {
            // Every token also goes through the shared expert; its input is the block's
            // (saved by the router), its output is scaled by sigmoid(shared_expert_gate(x))
            // (the multiply keeps both: the [tokens, 1] sigmoid and the expert's output),
            // then added to the routed sum.
            ModuleId sh = g.addModule(moe, "shared_expert", c.prefix + "MLP");
            swiglu(sh, "gate_proj", "up_proj", "down_proj", c.sharedInter, 1.0, false);
            linear(moe, "shared_expert_gate", h, 1, false, false);
            auto& bc = g.cost(moe);  // adding modules moved the costs
            bc.savedBytes.perToken += (H + 1.0) * cb.e;
            bc.fwdMemBytes.perToken += (3.0 * H + 2.0) * cb.e;
            bc.bwdMemBytes.perToken += (4.0 * H + 2.0) * cb.e;
            bc.fwdMemKernels += 3;  // sigmoid, mul, add
            bc.bwdMemKernels += 4;  // mul x2, the broadcast's sum, sigmoid_backward
        }
    }

    // Ernie's router: moe_statics (its correction bias, fp32 and not trained, added to the
    // softmax before the top k) and `gate`, an fp32 nn.Linear run on hidden_states.float()
    // with autocast off (transformers' _keep_in_fp32_modules_strict keeps both fp32 in any
    // dtype). Under a lower compute dtype the gate must gather in fp32, so plans make it a
    // unit of its own (ModuleNode::keepFp32). Below fp32 the cast's output is a new tensor the
    // gate keeps (4 B an element, ModuleCost::belowFp32SavedBytes); in fp32 it is the block's
    // input itself, which the shared experts' gate_proj keeps, or without shared experts the
    // gate.
    void ernieRouter(ModuleId moe) {
        ModuleId st = g.addModule(moe, "moe_statics", c.prefix + "Statics");
        g.addParam(st, "e_score_correction_bias", {1, c.experts}, DType::Float32, false);
        ModuleId gate = g.addModule(moe, "gate", "Linear");
        g.addParam(gate, "weight", {c.experts, h}, DType::Float32);
        g.setKeepFp32(gate);
        cb.linear(gate, H, static_cast<double>(c.experts), false);
        auto& mc = g.cost(moe);
        if (c.sharedInter > 0)
            mc.belowFp32SavedBytes.fixedPerToken += 4.0 * H;
        else
            g.cost(gate).savedBytes.fixedPerToken += 4.0 * H;
        // The cast up forward and its gradient's cast back: one each way, counted as half
        // the elements of ModuleCost::upcastElems' two casts each way.
        mc.upcastElems += H / 2;
    }

    // The dense MLP (SwiGLU; Phi-3's fused gate_up_proj).
    void denseMlp(ModuleId layer) {
        ModuleId mlp = g.addModule(layer, "mlp", c.prefix + "MLP");
        if (c.starcoder2) {
            // c_fc, the GELU (keeps its input), c_proj (keeps the GELU's output).
            linear(mlp, "c_fc", h, c.inter, c.mlpBias, true);
            linear(mlp, "c_proj", c.inter, h, c.mlpBias, true);
            cb.gelu(g.addModule(mlp, "act", c.actClass), static_cast<double>(c.inter));
            g.cost(mlp).outputBytes.perToken += H * cb.e;
        } else if (c.phi3) {
            // gate_up_proj's output (2I) is chunked into gate and up, views kept by the
            // SiLU and the multiply; the SiLU's output and the product (down_proj's
            // input) are new: 4I per token as SwiGLU's three outputs and down's input.
            const double I = static_cast<double>(c.inter);
            linear(mlp, "gate_up_proj", h, 2 * c.inter, false, true);
            linear(mlp, "down_proj", c.inter, h, false, true);
            g.addModule(mlp, "activation_fn", "SiLUActivation");
            auto& mc = g.cost(mlp);
            mc.fwdMemBytes.perToken += 5 * I * cb.e;
            mc.bwdMemBytes.perToken += 8 * I * cb.e;
            mc.fwdMemKernels += 2;  // silu, mul
            mc.bwdMemKernels += 4;  // mul, mul, silu_backward, the chunk's cat
            mc.savedBytes.perToken += 3 * I * cb.e;
            mc.outputBytes.perToken += H * cb.e;
        } else {
            // Cohere's parallel MLP reads the norm's output that q_proj saves.
            swiglu(mlp, "gate_proj", "up_proj", "down_proj", c.inter, 1.0, !c.cohere);
        }
        cb.dropout(mlp, H, c.branchDropout);  // Seed-OSS, on down_proj's output
    }

    // The layer's own norms (pre-norm, OLMo-2's and Gemma's post-norms) and Phi-3's dropouts.
    void norms(ModuleId layer) {
        if (c.olmo2 || c.postNorms) {
            // x + post_attention_layernorm(attn(x)), then the same around the MLP: q/k/v and
            // gate/up read the residual stream itself (saved by q_proj and gate_proj).
            rmsNorm(layer, "post_attention_layernorm");
            rmsNorm(layer, "post_feedforward_layernorm");
        } else if (c.cohere) {
            rmsNorm(layer, "input_layernorm");  // Cohere2LayerNorm, through normOf
        } else if (c.gemma) {
            // x + post_attention_layernorm(attn(input_layernorm(x))), then
            // x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x))).
            for (const char* name : {"input_layernorm", "post_attention_layernorm",
                                     "pre_feedforward_layernorm", "post_feedforward_layernorm"})
                rmsNorm(layer, name);
        } else {
            rmsNorm(layer, "input_layernorm");
            rmsNorm(layer, "post_attention_layernorm");
        }
        if (c.phi3) {
            cb.dropout(g.addModule(layer, "resid_attn_dropout", "Dropout"), H, c.residDropout);
            cb.dropout(g.addModule(layer, "resid_mlp_dropout", "Dropout"), H, c.residDropout);
        }
    }

    void compiledRule(ModuleId layer, int64_t i) {
        // Compiled as one region, the layer saves (AOT autograd's min-cut partitioner,
        // checked per family by tests/python/test_compiled_saved_peer.py): the block
        // input; each GEMM input that is not it (a pre-norm's output: two, OLMo-2 one,
        // its MLP's input); SDPA's q, k, v, output and logsumexp and o_proj's input (a
        // copy of the output with its heads merged); the o_proj output a norm reads
        // after it (through the residual, or a post-norm); with q/k norms the q and k
        // projections; gate, up and their SwiGLU/GELU product; with a norm after the
        // MLP down_proj's output; and every RMSNorm's fp32 rstd, per row.
        const double Q = static_cast<double>(dq), KV = static_cast<double>(dkv);
        const double I = static_cast<double>(c.inter);
        const bool projNorms = c.qkNorm || c.olmo2;
        const bool post = c.olmo2 || c.postNorms;  // no pre-norms: one GEMM input besides x
        const bool postMlpNorm = c.gemma || post;
        const double elems = H + (post ? 1 : 2) * H + 3 * Q + 2 * KV + H + 3 * I +
                             (projNorms ? Q + KV : 0) + (postMlpNorm ? H : 0);
        const double normRows = (c.gemma ? 4 : 2) + (c.olmo2 ? 2 : 0) +
                                (c.qkNorm ? static_cast<double>(c.heads + c.kvHeads) : 0);
        auto& k = g.cost(layer).compiled;
        k.savedBytes.perToken = elems * cb.e;
        k.savedBytes.fixedPerToken = 4 * normRows + 4 * static_cast<double>(c.heads);
        // OLMo's parameterless fp32 LayerNorms: mean and rstd per row, and the partitioner
        // keeps one hidden-sized fp32 tensor besides (checked at two sizes).
        if (c.olmo1) k.savedBytes.fixedPerToken += 4 * normRows + 4 * H;
        // Inductor's fused memory-bound kernels (counted in its generated code for the
        // layer, tests/python/test_compiled_fusion_peer.py), for the pre-norm layers of
        // Llama's shape. Forward, five: input_layernorm (reads x, writes its output);
        // RoPE on q and k (reads them and cos/sin, writes the rotated pair); the
        // residual add with post_attention_layernorm (reads x and o_proj's output,
        // writes the norm's output: the sum is recomputed, not stored); SiLU(gate) x up;
        // the last residual add (x, o_proj's and down_proj's outputs). Backward, four:
        // SiLU's backward (gate, up and the product's gradient in, two gradients out,
        // beside SDPA's delta: output x its gradient per head); the second norm's
        // backward with the residual (the two MLP input gradients, x, o_proj's output,
        // the output gradient in, the residual gradient out); RoPE's backward; the first
        // norm's backward (the residual gradient, the three projections' input
        // gradients, and the second norm's weight gradient recomputed from x and
        // o_proj's output). Per-head q/k norms (Qwen3) add one kernel each forward,
        // reading its projection, and RoPE's kernel then writes the normalised q and k
        // beside the rotated ones; RoPE's backward reads the projections and writes
        // their gradients besides. q/k/v biases (Qwen2) add the bias gradients' two sums
        // backward. Phi-3's fused projections: RoPE reads the one qkv_proj output and writes v
        // too; backward, RoPE's kernel handles v's gradient as well and each norm's
        // backward reads one input gradient per fused GEMM. Granite's scaled residual
        // branches add a kernel backward.
        const bool rope = c.ropeLayers.empty() || c.ropeLayers[static_cast<size_t>(i)];
        if (!c.gemma && !c.olmo2 && !c.postNorms && !c.olmo1 && rope) {
            const double rd = static_cast<double>(c.rotaryDim);
            double fwd = 8 * H + 2 * Q + 2 * KV + 3 * I + 2 * rd;
            double bwd = 14 * H + 2 * Q + 2 * KV + 4 * I + 2 * rd;
            int32_t fk = 5, bk = 4;
            if (c.qkNorm) {
                fwd += 2 * (Q + KV);
                bwd += 2 * (Q + KV);
                fk += 2;
            }
            if (c.qkvBias) {
                bwd += Q + KV;
                bk += 2;
            }
            if (c.granite) {
                // The residual multiplier's gradient: one more kernel backward, reading and
                // writing about three hidden-sized tensors.
                bwd += 3 * H;
                bk += 1;
            }
            if (c.phi3) {
                fwd += Q + 2 * KV;
                bwd += 2 * KV - 4 * H;
            }
            k.fwdMemBytes.perToken = fwd * cb.e;
            k.fwdMemBytes.fixedPerToken = 4 * normRows;
            k.bwdMemBytes.perToken = bwd * cb.e;
            k.bwdMemBytes.fixedPerToken = 8 * static_cast<double>(c.heads) + 4 * normRows + 12;
            k.fwdMemKernels = fk;
            k.bwdMemKernels = bk;
        }
    }

    const LlamaLike& c;
    ModelGraph g;
    CostBuilder cb;
    const DType pd;
    const int64_t h, dq, dkv;
    const double H;
};

Expected<ModelGraph> buildLlamaLike(const LlamaLike& c, const std::string& file,
                                    const HfLoadOptions& o) {
    return LlamaLikeBuilder(c, o).build(file);
}

// Exaone-4's sliding_window_pattern: every pattern-th layer attends fully (default 4). A
// string such as "LLLG" is the same period written out (its length; the last must be G).
int64_t exaonePattern(const JsonReader& r) {
    if (!r.hasNonNull("sliding_window_pattern")) return 4;
    const JsonReader v = r.at("sliding_window_pattern");
    if (!v.isString()) return positive(r, "sliding_window_pattern");
    const std::string p = v.asString();
    const bool valid = !p.empty() && p.back() == 'G' &&
                       std::count(p.begin(), p.end(), 'L') == static_cast<long>(p.size()) - 1;
    if (!valid)
        v.fail(
            "expected a period such as \"LLLG\" (sliding layers L, then one global G) or "
            "an integer");
    return static_cast<int64_t>(p.size());
}

// The sliding window and the layers that use it, as transformers' configs decide them
// (config.layer_types where the family has it): from seq_len == window on, each such
// layer's SDPA keeps a (b, 1, s, s) mask (ModuleCost::windowSavedBytes).
// no_rope_layers (SmolLM3, Llama-4): despite the name, 1 marks a layer that applies RoPE.
constexpr const char* kRopeFlag = "expected 1 (RoPE) or 0 (no RoPE)";

// A per-layer list (`key`), num_hidden_layers long.
JsonReader perLayerList(const JsonReader& r, const char* key, int64_t layers) {
    const JsonReader list = r.at(key);
    list.requireArray();
    if (static_cast<int64_t>(list.size()) != layers)
        list.fail(std::string(key) + " lists " + std::to_string(list.size()) +
                  " layers, num_hidden_layers is " + std::to_string(layers));
    return list;
}

// A per-layer list of 0/1 flags (`key`); `expected` says what the two mean.
std::vector<char> layerFlags(const JsonReader& r, const char* key, int64_t layers,
                             const char* expected) {
    const JsonReader list = perLayerList(r, key, layers);
    std::vector<char> flags(list.size());
    for (size_t k = 0; k < list.size(); ++k) {
        const int64_t v = list[k].asIntAtLeast(0);
        if (v > 1) list[k].fail(expected);
        flags[k] = static_cast<char>(v);
    }
    return flags;
}

// layer_types: per layer, whether it is `local` (sliding_attention, Llama-4's
// chunked_attention) rather than full_attention.
std::vector<char> localLayerTypes(const JsonReader& r, int64_t layers, const std::string& local) {
    const JsonReader list = perLayerList(r, "layer_types", layers);
    std::vector<char> flags(list.size());
    for (size_t k = 0; k < list.size(); ++k) {
        const std::string t = list[k].asString();
        if (t != local && t != "full_attention")
            list[k].fail("unknown layer type \"" + t + "\" (" + local + " or full_attention)");
        flags[k] = t == local;
    }
    return flags;
}

// A list of layer indices (`key`: mlp_only_layers, moe_layers), each below num_hidden_layers.
std::vector<int64_t> layerIndices(const JsonReader& r, const char* key, int64_t layers) {
    const JsonReader list = r.at(key);
    list.requireArray();
    std::vector<int64_t> out;
    for (size_t k = 0; k < list.size(); ++k) {
        const int64_t layer = list[k].asIntAtLeast(0);
        if (layer >= layers)
            list[k].fail("layer " + std::to_string(layer) +
                         " does not exist (num_hidden_layers is " + std::to_string(layers) + ")");
        out.push_back(layer);
    }
    return out;
}

void readSlidingWindow(const JsonReader& r, const std::string& family, LlamaLike& c) {
    bool everyLayer = false;  // one mask for the whole model (no layer_types)
    int64_t fullBelow = 0;    // Qwen2/Qwen3: the first max_window_layers attend fully
    if (family == "mistral") {
        // MistralConfig's default window is 4096; null turns it off.
        c.slidingWindow = !r.has("sliding_window")         ? 4096
                          : r.hasNonNull("sliding_window") ? positive(r, "sliding_window")
                                                           : 0;
        everyLayer = true;
    } else if (family == "mixtral" || family == "qwen3_moe" || c.phi3 || family == "starcoder2") {
        if (family == "qwen3_moe" && !r.optBool("use_sliding_window").value_or(false))
            c.slidingWindow = 0;
        else if (family == "qwen3_moe")
            c.slidingWindow = r.hasNonNull("sliding_window") ? positive(r, "sliding_window") : 4096;
        else
            c.slidingWindow = r.hasNonNull("sliding_window") ? positive(r, "sliding_window") : 0;
        everyLayer = true;
    } else if (family == "qwen2" || family == "qwen3") {
        c.slidingWindow = !r.optBool("use_sliding_window").value_or(false) ? 0
                          : !r.has("sliding_window")                       ? 4096
                          : r.hasNonNull("sliding_window") ? positive(r, "sliding_window")
                                                           : 0;
        fullBelow =
            r.hasNonNull("max_window_layers") ? r.at("max_window_layers").asIntAtLeast(0) : 28;
    } else if (family == "olmo3" || family == "exaone4" || family == "cohere2") {
        // Both default to a 4096 window; null turns it off.
        c.slidingWindow = !r.has("sliding_window")         ? 4096
                          : r.hasNonNull("sliding_window") ? positive(r, "sliding_window")
                                                           : 0;
    } else if (family == "gpt_oss") {
        // GptOssConfig's default window is 128.
        c.slidingWindow = !r.has("sliding_window")         ? 128
                          : r.hasNonNull("sliding_window") ? positive(r, "sliding_window")
                                                           : 0;
    } else if (family == "smollm3") {
        c.slidingWindow =
            r.optBool("use_sliding_window").value_or(false) && r.hasNonNull("sliding_window")
                ? positive(r, "sliding_window")
                : 0;
    } else if (family == "llama4_text") {
        return;  // readLlama4: chunked attention
    } else if (!c.gemma) {
        c.slidingWindow = 0;
    }
    if (c.slidingWindow > 0) {
        c.slidingLayers.assign(static_cast<size_t>(c.layers), 0);
        const bool listed = !everyLayer && r.hasNonNull("layer_types");
        if (listed) c.slidingLayers = localLayerTypes(r, c.layers, "sliding_attention");
        // Gemma-2 alternates from layer 0; Gemma-3 makes every sliding_window_pattern-th
        // layer (default 6) a full one, Exaone-4 likewise (default 4), OLMo-3 every 4th.
        // SmolLM3 slides on its layers without RoPE.
        const int64_t pattern =
            family == "gemma2" || family == "gpt_oss" ? 2
            : family == "olmo3"                       ? 4
            : family == "cohere2"
                ? (r.hasNonNull("sliding_window_pattern") ? positive(r, "sliding_window_pattern")
                                                          : 4)
            : family == "exaone4"                    ? exaonePattern(r)
            : !c.gemma3                              ? 0
            : r.hasNonNull("sliding_window_pattern") ? positive(r, "sliding_window_pattern")
                                                     : 6;
        for (int64_t i = 0; !listed && i < c.layers; ++i)
            c.slidingLayers[static_cast<size_t>(i)] =
                family == "smollm3" ? !c.ropeLayers[static_cast<size_t>(i)]
                : everyLayer        ? true
                                    : (pattern > 0 ? (i + 1) % pattern != 0 : i >= fullBelow);
    }
}

// The experts of the mixture-of-experts families; returns the key naming their count.
const char* readExperts(const JsonReader& r, const std::string& family, LlamaLike& c) {
    // Each MoE family names its expert count differently.
    const char* expertsKey = family == "mixtral" || family == "granitemoe" || family == "gpt_oss"
                                 ? "num_local_experts"
                             : c.deepseekExperts() ? "n_routed_experts"
                             : c.ernie             ? "moe_num_experts"
                                                   : "num_experts";
    if (family == "mixtral") {
        c.experts = positive(r, expertsKey);
        c.topK = positive(r, "num_experts_per_tok");
    }
    if (c.deepseekExperts()) {
        c.experts = positive(r, expertsKey);
        c.topK = positive(r, "num_experts_per_tok");
        c.moeInter = positive(r, "moe_intermediate_size");
        // V2 may have none (n_shared_experts null: no shared_experts module); V3 has some.
        c.sharedExperts =
            r.hasNonNull("n_shared_experts") ? r.at("n_shared_experts").asIntAtLeast(0) : 0;
        if (c.sharedExperts == 0 && !c.deepseekV2)
            r.at("n_shared_experts")
                .fail("DeepSeek-V3 models have shared experts (n_shared_experts >= 1)");
        if (c.sharedExperts > kMaxDim)
            r.at("n_shared_experts").fail("implausibly many shared experts");
        // DeepseekV2MoEGate reads norm_topk_prob but never renormalises.
        c.normTopK = !c.deepseekV2 && r.optBool("norm_topk_prob").value_or(true);
        c.firstDense = r.hasNonNull("first_k_dense_replace")
                           ? r.at("first_k_dense_replace").asIntAtLeast(0)
                           : 0;
        // V2 groups the experts only with topk_method "group_limited_greedy" (default
        // "greedy"); V3 always.
        const bool grouped =
            !c.deepseekV2 ||
            (r.hasNonNull("topk_method") && r.getString("topk_method") == "group_limited_greedy");
        if (c.deepseekV2 && r.hasNonNull("topk_method")) {
            const std::string m = r.getString("topk_method");
            if (m != "greedy" && m != "group_limited_greedy")
                r.at("topk_method")
                    .fail("unknown topk_method \"" + m +
                          "\" (DeepSeek-V2 has greedy and group_limited_greedy)");
        }
        if (grouped) {
            const int64_t groups = r.hasNonNull("n_group") ? positive(r, "n_group") : 1;
            if (c.experts % groups != 0)
                r.at("n_group").fail("n_group (" + std::to_string(groups) +
                                     ") must divide n_routed_experts (" +
                                     std::to_string(c.experts) + ")");
        }
    }
    if (family == "granitemoe" || family == "gpt_oss") {
        c.experts = positive(r, expertsKey);
        c.topK = positive(r, "num_experts_per_tok");
    }
    if (family == "olmoe") {
        // Every layer sparse, experts of intermediate_size, no shared expert.
        c.experts = positive(r, expertsKey);
        c.topK = positive(r, "num_experts_per_tok");
        c.moeInter = c.inter;
        c.normTopK = r.optBool("norm_topk_prob").value_or(false);
    }
    if (c.ernie) {
        c.experts = positive(r, expertsKey);
        c.topK = positive(r, "moe_k");
        c.moeInter = positive(r, "moe_intermediate_size");
        const int64_t shared = r.hasNonNull("moe_num_shared_experts")
                                   ? r.at("moe_num_shared_experts").asIntAtLeast(0)
                                   : 2;  // Ernie4_5_MoeConfig's default
        if (shared > kMaxDim)
            r.at("moe_num_shared_experts").fail("implausibly many shared experts");
        c.sharedInter = c.moeInter * shared;
        // Layer i is an MoE layer when (i + 1) % interval == 0 and start <= i <= end (-1: the
        // last layer), as Ernie4_5_MoeDecoderLayer decides.
        const int64_t start = r.hasNonNull("moe_layer_start_index")
                                  ? r.at("moe_layer_start_index").asIntAtLeast(0)
                                  : 1;
        int64_t end = c.layers - 1;
        if (r.hasNonNull("moe_layer_end_index")) {
            end = r.at("moe_layer_end_index").asIntAtLeast(-1);
            if (end == -1) end = c.layers - 1;
        }
        const int64_t every =
            r.hasNonNull("moe_layer_interval") ? positive(r, "moe_layer_interval") : 1;
        c.moeLayers.assign(static_cast<size_t>(c.layers), 0);
        for (int64_t i = start; i <= std::min(end, c.layers - 1); ++i)
            c.moeLayers[static_cast<size_t>(i)] = (i + 1) % every == 0;
    }
    if (family == "qwen2_moe" || family == "qwen3_moe") {
        c.experts = r.hasNonNull(expertsKey) ? r.at(expertsKey).asIntAtLeast(0) : 0;
        if (c.experts > 0) {
            c.topK = positive(r, "num_experts_per_tok");
            c.moeInter = positive(r, "moe_intermediate_size");
            c.normTopK = r.optBool("norm_topk_prob").value_or(false);
            if (r.hasNonNull("decoder_sparse_step"))
                c.sparseStep = positive(r, "decoder_sparse_step");
            if (r.hasNonNull("mlp_only_layers"))
                c.mlpOnlyLayers = layerIndices(r, "mlp_only_layers", c.layers);
            if (family == "qwen2_moe")
                c.sharedInter = positive(r, "shared_expert_intermediate_size");
        }
    }
    return expertsKey;
}

// A probability in [0, 1) (dropout), 0 when absent.
double dropoutOf(const JsonReader& r, std::string_view key, double fallback) {
    const double p = r.optNumber(key).value_or(fallback);
    if (p < 0 || p >= 1) r.at(key).fail("a dropout probability must be in [0, 1)");
    return p;
}

// The options of the Llama-derived families that differ from Llama in a few operators:
// Seed-OSS (q/k/v biases by default, attention_out_bias, residual dropout), Granite
// (multipliers), SmolLM3 (layers without RoPE), Exaone-4 (post-norms, per-head q/k norms,
// RoPE on the sliding layers only) and OLMo-3 (OLMo-2 with sliding windows).
void readLlamaVariant(const JsonReader& r, const std::string& family, LlamaLike& c) {
    if (family == "seed_oss") {
        c.qkvBias = r.optBool("attention_bias").value_or(true);
        c.oBias = r.optBool("attention_out_bias").value_or(false);
        c.branchDropout = dropoutOf(r, "residual_dropout", 0.1);
        // Attention dropout (0.1 by default) runs inside the flash kernel on a GPU, which
        // keeps its random state, not a mask: no cost modelled.
        dropoutOf(r, "attention_dropout", 0.1);
    }
    c.granite = family == "granite" || family == "granitemoe";
    if (c.granite)
        for (const char* key : {"embedding_multiplier", "residual_multiplier",
                                "attention_multiplier", "logits_scaling"})
            if (r.hasNonNull(key)) static_cast<void>(r.at(key).asPositiveNumber());
    if (family == "smollm3") {
        c.ropeLayers.assign(static_cast<size_t>(c.layers), 1);
        if (r.hasNonNull("no_rope_layers")) {
            // Despite its name, 1 marks a layer that applies RoPE.
            c.ropeLayers = layerFlags(r, "no_rope_layers", c.layers, kRopeFlag);
        } else {
            const int64_t every =
                r.hasNonNull("no_rope_layer_interval") ? positive(r, "no_rope_layer_interval") : 4;
            for (int64_t i = 0; i < c.layers; ++i)
                c.ropeLayers[static_cast<size_t>(i)] = (i + 1) % every != 0;
        }
    }
    if (family == "exaone4") {
        c.postNorms = true;
        c.qkNorm = true;
    }
    c.rotaryPerType = family == "olmo3";
    c.starcoder2 = family == "starcoder2";
    c.cohere = family == "cohere2";
    c.glm = family == "glm4_moe";
    if (c.glm) {
        c.qkNorm = r.optBool("use_qk_norm").value_or(false);
        const double f = r.optNumber("partial_rotary_factor").value_or(0.5);
        if (!(f > 0 && f <= 1))
            r.at("partial_rotary_factor").fail("partial_rotary_factor must be in (0, 1]");
        c.rotaryDim = static_cast<int64_t>(static_cast<double>(c.headDim) * f);
    }
    if (c.cohere && r.hasNonNull("logit_scale")) static_cast<void>(r.getNumber("logit_scale"));
    if (c.starcoder2) {
        c.qkvBias = c.oBias = c.mlpBias = r.optBool("use_bias").value_or(true);
        c.branchDropout = dropoutOf(r, "residual_dropout", 0.0);
        c.embedDropout = dropoutOf(r, "embedding_dropout", 0.0);
        // Attention dropout runs inside the flash kernel on a GPU (its random state, no mask).
        dropoutOf(r, "attention_dropout", 0.0);
        const std::string act =
            r.hasNonNull("hidden_act") ? r.getString("hidden_act") : "gelu_pytorch_tanh";
        if (act == "gelu_pytorch_tanh")
            c.actClass = "GELUTanh";
        else if (act == "gelu")
            c.actClass = "GELUActivation";
        else
            r.at("hidden_act")
                .fail("unsupported activation \"" + act +
                      "\" for StarCoder2 (gelu_pytorch_tanh or gelu)");
    }
    c.ernie = family == "ernie4_5_moe";
    if (c.ernie) c.qkvBias = c.oBias = c.mlpBias = r.optBool("use_bias").value_or(false);
    c.olmo1 = family == "olmo";
    if ((c.olmo1 || family == "olmoe") && r.hasNonNull("clip_qkv"))
        c.clipQkv = r.at("clip_qkv").asPositiveNumber();
}

// Llama4TextConfig's fields (transformers 4.57 defaults where a key is absent).
void readLlama4(const JsonReader& r, LlamaLike& c) {
    c.llama4 = true;
    c.prefix = "Llama4Text";
    c.qkvBias = c.oBias = false;  // Llama4TextConfig sets attention_bias to false
    c.interMlp =
        r.hasNonNull("intermediate_size_mlp") ? positive(r, "intermediate_size_mlp") : 16384;
    c.experts = r.hasNonNull("num_local_experts") ? positive(r, "num_local_experts") : 16;
    c.topK = r.hasNonNull("num_experts_per_tok") ? positive(r, "num_experts_per_tok") : 1;
    const auto n = static_cast<size_t>(c.layers);
    // no_rope_layers: 1 marks a layer that applies RoPE; absent or empty, every
    // no_rope_layer_interval-th layer (default 4) has none.
    const bool listed =
        r.hasNonNull("no_rope_layers") &&
        (!r.at("no_rope_layers").json().is_array() || !r.at("no_rope_layers").json().empty());
    if (listed) {
        c.ropeLayers = layerFlags(r, "no_rope_layers", c.layers, kRopeFlag);
    } else {
        const int64_t every =
            r.hasNonNull("no_rope_layer_interval") ? positive(r, "no_rope_layer_interval") : 4;
        c.ropeLayers.assign(n, 0);
        for (size_t i = 0; i < n; ++i)
            c.ropeLayers[i] = (static_cast<int64_t>(i) + 1) % every != 0;
    }
    c.moeLayers.assign(n, 0);
    if (r.hasNonNull("moe_layers")) {
        for (const int64_t layer : layerIndices(r, "moe_layers", c.layers))
            c.moeLayers[static_cast<size_t>(layer)] = 1;
    } else {
        const int64_t step = r.hasNonNull("interleave_moe_layer_step")
                                 ? positive(r, "interleave_moe_layer_step")
                                 : 1;
        for (int64_t i = step - 1; i < c.layers; i += step)
            c.moeLayers[static_cast<size_t>(i)] = 1;
    }
    c.l2QkNorm = r.optBool("use_qk_norm").value_or(true);
    // attn_temperature_tuning is read for its truth (published configs write 4).
    if (r.hasNonNull("attn_temperature_tuning")) {
        const JsonReader t = r.at("attn_temperature_tuning");
        c.temperatureTuning = t.json().is_boolean() ? t.asBool() : t.asNumber() != 0;
    } else {
        c.temperatureTuning = !r.has("attn_temperature_tuning");
    }
    // Chunked attention: from attention_chunk_size on, SDPA gets a (b, 1, s, s) mask on the
    // chunked layers (layer_types, by default the RoPE layers), as a sliding window does.
    c.slidingWindow = !r.has("attention_chunk_size")         ? 8192
                      : r.hasNonNull("attention_chunk_size") ? positive(r, "attention_chunk_size")
                                                             : 0;
    if (c.slidingWindow > 0) {
        c.slidingLayers.assign(c.ropeLayers.begin(), c.ropeLayers.end());
        if (r.hasNonNull("layer_types"))
            c.slidingLayers = localLayerTypes(r, c.layers, "chunked_attention");
    }
    if (r.hasNonNull("hidden_act") && r.getString("hidden_act") != "silu")
        r.at("hidden_act")
            .fail("unsupported activation \"" + r.getString("hidden_act") +
                  "\" for Llama 4 (silu)");
    dropoutOf(r, "attention_dropout", 0.0);
    if (r.optBool("output_router_logits").value_or(false))
        r.at("output_router_logits")
            .fail(
                "the router's auxiliary loss is not modelled; set output_router_logits to "
                "false or export the model with scripts/export_model.py");
}

// The attention's head sizes: DeepSeek's latent-attention sizes, else head_dim (each
// family's default where the key is absent, hidden_size // heads where it is null).
void readHeadSizes(const JsonReader& r, const std::string& family, LlamaLike& c) {
    c.deepseekV2 = family == "deepseek_v2";
    c.deepseek = family == "deepseek_v3" || c.deepseekV2;
    if (c.deepseek) {
        // MLA's sizes; head_dim in DeepSeek configs is the rotary part's and unused here.
        c.qLora = r.hasNonNull("q_lora_rank") ? positive(r, "q_lora_rank") : 0;
        c.kvLora = positive(r, "kv_lora_rank");
        c.ropeDim = positive(r, "qk_rope_head_dim");
        c.nopeDim = positive(r, "qk_nope_head_dim");
        c.vDim = positive(r, "v_head_dim");
        if (c.ropeDim % 2 != 0) r.at("qk_rope_head_dim").fail("qk_rope_head_dim must be even");
        c.headDim = c.ropeDim;  // the rotary embedding's size
    } else if (r.hasNonNull("head_dim")) {
        c.headDim = positive(r, "head_dim");
    } else if (family == "gemma2" || family == "gemma3_text") {
        c.headDim = 256;  // Gemma2Config's and Gemma3TextConfig's default
    } else if (family == "gpt_oss" && !r.has("head_dim")) {
        c.headDim = 64;  // GptOssConfig's default (null: hidden_size // heads, below)
    } else if (family == "llama4_text" && !r.has("head_dim")) {
        c.headDim = 128;  // Llama4TextConfig's default
    } else {
        // GLM-4.5's attention takes hidden_size // heads, as Python divides, when the config
        // has no head_dim (its default config: 4096 // 96 = 42).
        if (c.hidden % c.heads != 0 && family != "glm4_moe")
            r.at("hidden_size")
                .fail("hidden_size (" + std::to_string(c.hidden) +
                      ") is not divisible by num_attention_heads (" + std::to_string(c.heads) +
                      ") and no head_dim is given");
        c.headDim = c.hidden / c.heads;
    }
}

Expected<ModelGraph> loadLlamaLike(const JsonReader& r, const std::string& family,
                                   const HfLoadOptions& o) {
    LlamaLike c;
    c.family = family;
    // transformers' class names: the family's CausalLM class without "ForCausalLM".
    const std::string causalLm =
        std::find_if(hfFamilies().begin(), hfFamilies().end(), [&](const HfFamily& f) {
            return family == f.modelType;
        })->causalLm;
    c.prefix = causalLm.substr(0, causalLm.size() - std::string_view("ForCausalLM").size());
    c.vocab = positive(r, "vocab_size");
    c.hidden = positive(r, "hidden_size");
    c.inter = positive(r, "intermediate_size");
    c.layers = positive(r, "num_hidden_layers");
    c.heads = positive(r, "num_attention_heads");
    c.kvHeads = r.hasNonNull("num_key_value_heads") ? positive(r, "num_key_value_heads") : c.heads;
    if (c.heads % c.kvHeads != 0)
        r.at("num_key_value_heads")
            .fail("num_key_value_heads (" + std::to_string(c.kvHeads) +
                  ") must divide num_attention_heads (" + std::to_string(c.heads) + ")");
    readHeadSizes(r, family, c);
    c.rotaryDim = c.headDim;  // Phi-3's partial_rotary_factor narrows it below
    c.gemma3 = family == "gemma3_text";
    c.gemma = family == "gemma2" || c.gemma3;
    // Gemma ties by default, and so does SmolLM3 (PretrainedConfig's default).
    c.tie = r.optBool("tie_word_embeddings")
                .value_or(c.gemma || family == "smollm3" || family == "starcoder2" ||
                          family == "cohere2" || family == "ernie4_5_moe");
    if (r.hasNonNull("max_position_embeddings"))
        c.maxPositions = positive(r, "max_position_embeddings");
    // Qwen2 always has q/k/v biases; Llama and Qwen3 have attention_bias (q, k, v and o),
    // Llama also mlp_bias.
    const bool attnBias = r.optBool("attention_bias").value_or(false);
    // Qwen2-MoE spells its q/k/v bias qkv_bias (default true).
    c.qkvBias = family == "qwen2" || attnBias ||
                (family == "qwen2_moe" && r.optBool("qkv_bias").value_or(true));
    c.oBias =
        (family == "llama" || family == "qwen3" || family == "qwen3_moe" || family == "olmo" ||
         family == "olmoe" || family == "olmo2" || family == "olmo3" || family == "granite" ||
         family == "granitemoe" || family == "smollm3" || family == "cohere2") &&
        attnBias;
    if (c.deepseek) c.qkvBias = c.oBias = attnBias;  // q_a, kv_a and o projections
    if (c.gemma) {
        c.qkvBias = c.oBias = attnBias;
        c.qkNorm = c.gemma3;
        // transformers' ACT2FN classes for the activations Gemma configs use.
        const char* key = r.hasNonNull("hidden_activation") ? "hidden_activation" : "hidden_act";
        const std::string act =
            r.hasNonNull(key) ? r.getString(key) : std::string("gelu_pytorch_tanh");
        if (act == "gelu_pytorch_tanh")
            c.actClass = "GELUTanh";
        else if (act == "gelu")
            c.actClass = "GELUActivation";
        else
            r.at(key).fail("unsupported activation \"" + act +
                           "\" for Gemma (gelu_pytorch_tanh or gelu)");
        // Gemma-2 caps the final logits at 30 unless the config says otherwise (null: off).
        if (family == "gemma2" && !r.has("final_logit_softcapping"))
            c.finalSoftcap = 30;
        else if (r.hasNonNull("final_logit_softcapping"))
            c.finalSoftcap = r.getNumber("final_logit_softcapping");
        if (r.hasNonNull("final_logit_softcapping") && !(c.finalSoftcap > 0))
            r.at("final_logit_softcapping").fail("final_logit_softcapping must be positive");
        // Layers alternate (Gemma-2) or five in six (Gemma-3) attend to a sliding window.
        c.slidingWindow = r.hasNonNull("sliding_window") ? positive(r, "sliding_window") : 4096;
    }
    c.phi3 = family == "phi3";
    if (c.phi3) {
        c.qkvBias = c.oBias = false;
        const double f = r.optNumber("partial_rotary_factor").value_or(1.0);
        if (!(f > 0 && f <= 1))
            r.at("partial_rotary_factor").fail("partial_rotary_factor must be in (0, 1]");
        c.rotaryDim = static_cast<int64_t>(static_cast<double>(c.headDim) * f);
        c.residDropout = r.optNumber("resid_pdrop").value_or(0.0);
        if (c.residDropout < 0 || c.residDropout >= 1)
            r.at("resid_pdrop").fail("resid_pdrop must be in [0, 1)");
    }
    c.gptOss = family == "gpt_oss";
    if (c.gptOss) {
        // GptOssConfig sets attention_bias to true whatever the config says.
        c.qkvBias = c.oBias = true;
        dropoutOf(r, "attention_dropout", 0.0);
        if (r.optBool("output_router_logits").value_or(false))
            r.at("output_router_logits")
                .fail(
                    "the router's auxiliary loss is not modelled; set output_router_logits to "
                    "false or export the model with scripts/export_model.py");
    }
    c.qkNorm = family == "qwen3" || family == "qwen3_moe" || c.gemma3;
    c.olmo2 = family == "olmo2" || family == "olmo3";
    readLlamaVariant(r, family, c);
    if (family == "llama4_text") readLlama4(r, c);
    c.legacySdpaAttention = family == "qwen2_moe" || family == "olmoe";
    if (family == "qwen2_moe" && r.optBool("use_sliding_window").value_or(false))
        r.at("use_sliding_window")
            .fail(
                "sliding-window attention is not modelled for Qwen2-MoE (its legacy attention "
                "builds its own masks); set it to false or export the model with "
                "scripts/export_model.py");
    readSlidingWindow(r, family, c);
    // Exaone-4 with a sliding window applies RoPE on its sliding layers only.
    if (family == "exaone4" && c.slidingWindow > 0)
        c.ropeLayers.assign(c.slidingLayers.begin(), c.slidingLayers.end());
    // Cohere2 applies RoPE on its sliding layers only (none without a window).
    if (c.cohere) {
        c.ropeLayers.assign(static_cast<size_t>(c.layers), 0);
        if (c.slidingWindow > 0)
            c.ropeLayers.assign(c.slidingLayers.begin(), c.slidingLayers.end());
    }
    if (!c.starcoder2 && !c.ernie)  // their use_bias covers the MLP
        c.mlpBias = (family == "llama" || family == "granite" || family == "smollm3" ||
                     family == "seed_oss" || c.deepseekV2) &&
                    r.optBool("mlp_bias").value_or(false);
    const char* expertsKey = readExperts(r, family, c);
    if (c.layers > 10000)
        r.at("num_hidden_layers").fail("implausibly many layers (more than 10000)");
    if (c.experts > 0 && c.topK > c.experts) {
        const char* topKKey = c.ernie ? "moe_k" : "num_experts_per_tok";
        r.at(topKKey).fail(std::string(topKKey) + " exceeds " + expertsKey);
    }
    if (c.experts > 4096) r.at(expertsKey).fail("implausibly many experts (more than 4096)");
    // Each expert is four modules (the MLP and its three projections), about 5 KB of graph:
    // 10,000 layers of 4,096 experts would need over 100 GB before anything is checked.
    // The largest published mixtures have under 16,000 (DeepSeek-V3: 61 x 256).
    if (c.experts > 0 && c.layers * c.experts > kMaxExperts)
        r.at(expertsKey)
            .fail("implausibly many experts in all: " + std::to_string(c.layers) + " layers x " +
                  std::to_string(c.experts) + " = " + std::to_string(c.layers * c.experts) +
                  " (more than " + std::to_string(kMaxExperts) + ")");
    return buildLlamaLike(c, r.file(), o);
}

// A model of the families with loaders of their own: its name and source, the activation
// dtype its costs are counted in and transformers' CausalLM class at the root.
ModelGraph startGraph(const char* family, const char* rootClass, const HfLoadOptions& o) {
    ModelGraph g;
    g.name = family;
    g.source = std::string("hf:") + family;
    g.activationDtype = o.activationDtype;
    g.setRootClass(rootClass);
    return g;
}

Expected<ModelGraph> loadGpt2(const JsonReader& r, const HfLoadOptions& o) {
    const int64_t vocab = positive(r, "vocab_size");
    const int64_t h = positive(r, "n_embd");
    const int64_t layers = positive(r, "n_layer");
    const int64_t heads = positive(r, "n_head");
    const int64_t positions = positive(r, "n_positions");
    const int64_t inner = r.hasNonNull("n_inner") ? positive(r, "n_inner") : 4 * h;
    if (h % heads != 0) r.at("n_head").fail("n_head must divide n_embd");
    if (layers > 10000) r.at("n_layer").fail("implausibly many layers (more than 10000)");
    const bool tie = r.optBool("tie_word_embeddings").value_or(true);
    const double pResid = r.optNumber("resid_pdrop").value_or(0.1);
    const double pEmbd = r.optNumber("embd_pdrop").value_or(0.1);

    ModelGraph g = startGraph("gpt2", "GPT2LMHeadModel", o);
    g.maxPositions = positions;
    g.learnedPositions = true;
    CostBuilder cb{g, static_cast<double>(dtypeSize(o.activationDtype))};
    const DType pd = o.paramDtype;
    const double H = static_cast<double>(h);
    // GPT-2's Conv1D stores its weight as [in, out] (transposed relative to nn.Linear),
    // which matters for dim-0 sharding.
    auto conv1d = [&](ModuleId parent, const char* name, int64_t in, int64_t out, bool saves) {
        ModuleId m = g.addModule(parent, name, "Conv1D");
        g.addParam(m, "weight", {in, out}, pd);
        g.addParam(m, "bias", {out}, pd);
        cb.linear(m, static_cast<double>(in), static_cast<double>(out), saves, /*addmm=*/true);
        return m;
    };
    auto layerNorm = [&](ModuleId parent, const char* name) { cb.layerNorm(parent, name, h, pd); };
    ModuleId tr = g.addModule(g.root(), "transformer", "GPT2Model");
    ModuleId wte = g.addModule(tr, "wte", "Embedding");
    ParamId wteW = g.addParam(wte, "weight", {vocab, h}, pd);
    cb.embedding(wte, H);
    ModuleId wpe = g.addModule(tr, "wpe", "Embedding");
    g.addParam(wpe, "weight", {positions, h}, pd);
    cb.embedding(wpe, H);
    cb.dropout(g.addModule(tr, "drop", "Dropout"), H, pEmbd);
    ModuleId hl = g.addModule(tr, "h", "ModuleList", {"ModuleList"});
    for (int64_t i = 0; i < layers; ++i) {
        ModuleId blk = g.addModule(hl, std::to_string(i), "GPT2Block");
        layerNorm(blk, "ln_1");
        ModuleId attn = g.addModule(blk, "attn", "GPT2Attention");
        conv1d(attn, "c_attn", h, 3 * h, true);
        // c_proj's input is SDPA's output with its heads merged back: the flash kernels
        // (CUDA's, and the CPU's, real or fake) return it in (b, s, h, d) memory order, so
        // the merge is a view and c_proj saves no copy (saved_tensors_hooks on
        // transformers' GPT2Attention, 4.57).
        conv1d(attn, "c_proj", h, h, false);
        g.addModule(attn, "attn_dropout", "Dropout");
        cb.dropout(g.addModule(attn, "resid_dropout", "Dropout"), H, pResid);
        // q, k, v are views of c_attn's output, so SDPA's saved q/k/v share its storage
        // (counted once as 3h). With use_cache=False, as in training (the memory oracle
        // runs so); with a DynamicCache, its cats would add copies of k and v (2h).
        cb.sdpa(attn, static_cast<double>(heads), H / static_cast<double>(heads), 3 * H);
        g.cost(attn).outputBytes.perToken += H * cb.e;
        g.cost(attn).bwdMemKernels += 1;  // the q/k/v gradients' cat
        layerNorm(blk, "ln_2");
        ModuleId mlp = g.addModule(blk, "mlp", "GPT2MLP");
        conv1d(mlp, "c_fc", h, inner, true);
        conv1d(mlp, "c_proj", inner, h, true);
        cb.unfusedTanhGelu(g.addModule(mlp, "act", "NewGELUActivation"),
                           static_cast<double>(inner));
        cb.dropout(g.addModule(mlp, "dropout", "Dropout"), H, pResid);
        g.cost(mlp).outputBytes.perToken += H * cb.e;
        cb.residualAdds(blk, H, 2);
        // Compiled as one region (AOT autograd's min-cut partitioner, checked by
        // tests/python/test_compiled_saved_peer.py): the block input; ln_1's and ln_2's
        // outputs (c_attn's and c_fc's inputs); SDPA's q, k, v, output and logsumexp and
        // c_proj's input (the output with its heads merged); the residual sum ln_2 reads;
        // c_fc's output, GELU's tanh and its result (c_proj's input): 9h + 3·inner a token,
        // the same terms as a pre-norm Llama layer's with one key/value head per query head.
        // Each LayerNorm keeps its mean and rstd (fp32 on a GPU), each residual dropout its
        // bool mask. Attention dropout on a GPU is the flash kernel's own (it keeps its RNG
        // seed and offset, no mask), so it adds nothing.
        auto& k = g.cost(blk).compiled;
        k.savedBytes.perToken = (9 * H + 3 * static_cast<double>(inner)) * cb.e;
        k.savedBytes.fixedPerToken =
            2 * 8 + 4 * static_cast<double>(heads) + (pResid > 0 ? 2 * H : 0);
    }
    layerNorm(tr, "ln_f");
    cb.residualAdds(tr, H, 1);  // token + position embeddings
    cb.lmHead("lm_head", tie ? std::optional(wteW) : std::nullopt, vocab, h, pd);
    cb.causalLmLoss(g.root(), static_cast<double>(vocab));
    if (Status s = g.finalize(); !s) return Error{r.file() + ":/: " + s.error()};
    return g;
}

// MPT (MptForCausalLM, transformers 4.57; MosaicML's MPT-7B and MPT-30B): transformer.wte,
// blocks of norm_1 (a LayerNorm without bias), attn (one fused Wqkv, out_proj), norm_2 and
// ffn (up_proj to 4 x d_model, exact GELU, down_proj, the residual added inside), norm_f,
// an lm_head tied to wte. transformers builds ALiBi whatever the config says (no learned
// positions, no biases, no q/k LayerNorm, a 4 x d_model MLP), and its attention is always
// eager: q x k^T scaled, plus the fp32 ALiBi bias, which promotes the scores to fp32 under a
// lower compute dtype; masked_fill with the (b, 1, s, s) causal mask; softmax in fp32; cast
// back to the compute dtype; times v. Saved (saved_tensors_hooks, fp32 and bf16): Wqkv's
// input, q, k and v copied by matmul's reshapes (3 x d_model), the fp32 probabilities (4 B a
// head a key position, whatever the dtype) and below fp32 their cast, out_proj's input (the
// heads merged: a copy), the mask once (1 B a token a key position). Config fields that
// transformers' MPT would not follow (it does not read them) are refused rather than
// modelled differently from what transformers trains.
Expected<ModelGraph> loadMpt(const JsonReader& r, const HfLoadOptions& o) {
    const int64_t vocab = positive(r, "vocab_size");
    const int64_t h = positive(r, "d_model");
    const int64_t layers = positive(r, "n_layers");
    const int64_t heads = positive(r, "n_heads");
    const int64_t maxSeq = r.hasNonNull("max_seq_len") ? positive(r, "max_seq_len") : 2048;
    if (h % heads != 0) r.at("n_heads").fail("n_heads must divide d_model");
    if (layers > 10000) r.at("n_layers").fail("implausibly many layers (more than 10000)");
    if (r.hasNonNull("expansion_ratio") && r.getNumber("expansion_ratio") != 4)
        r.at("expansion_ratio")
            .fail(
                "transformers' MPT builds its MLP 4 x d_model wide whatever expansion_ratio "
                "says; ShardScope models transformers' MptForCausalLM, so it must be 4 (export "
                "another implementation with scripts/export_model.py)");
    if (!r.optBool("no_bias").value_or(true))
        r.at("no_bias").fail(
            "transformers' MPT has no biases whatever no_bias says; it must be true (export "
            "another implementation with scripts/export_model.py)");
    double clip = 0;
    if (const auto a = r.find("attn_config"); a && !a->isNull()) {
        a->requireObject();
        if (a->hasNonNull("attn_type") && a->getString("attn_type") != "multihead_attention")
            a->at("attn_type").fail("transformers' MPT runs multihead_attention only");
        if (a->optBool("qk_ln").value_or(false))
            a->at("qk_ln").fail("transformers' MPT has no q/k LayerNorm; qk_ln must be false");
        if (a->optNumber("attn_pdrop").value_or(0.0) != 0)
            a->at("attn_pdrop")
                .fail(
                    "dropout on MPT's eager attention probabilities (and its residuals, which "
                    "transformers drops at the same rate) is not modelled; set it to 0, as "
                    "MPT-7B's "
                    "config does");
        if (a->hasNonNull("clip_qkv")) clip = a->at("clip_qkv").asPositiveNumber();
    }
    const bool tie = r.optBool("tie_word_embeddings").value_or(true);

    ModelGraph g = startGraph("mpt", "MptForCausalLM", o);
    g.maxPositions = maxSeq;
    g.learnedPositions = true;
    g.positionLimit =
        "MPT's ALiBi bias is built max_seq_len wide: transformers' attention fails past it";
    CostBuilder cb{g, static_cast<double>(dtypeSize(o.activationDtype))};
    const DType pd = o.paramDtype;
    const double H = static_cast<double>(h), e = cb.e, heads_ = static_cast<double>(heads);
    auto linear = [&](ModuleId parent, const char* name, int64_t in, int64_t out, bool saves) {
        ModuleId m = g.addModule(parent, name, "Linear");
        g.addParam(m, "weight", {out, in}, pd);
        cb.linear(m, static_cast<double>(in), static_cast<double>(out), saves);
        return m;
    };
    auto layerNorm = [&](ModuleId parent, const char* name) {
        cb.layerNorm(parent, name, h, pd, true, /*bias=*/false);
    };
    ModuleId tr = g.addModule(g.root(), "transformer", "MptModel");
    ModuleId wte = g.addModule(tr, "wte", "Embedding");
    ParamId wteW = g.addParam(wte, "weight", {vocab, h}, pd);
    cb.embedding(wte, H);
    // The causal mask, (b, 1, s, s) bool, kept by every layer's masked_fill (one storage).
    g.cost(tr).savedBytes.fixedPerTokenSeq += 1;
    ModuleId blocks = g.addModule(tr, "blocks", "ModuleList", {"ModuleList"});
    for (int64_t i = 0; i < layers; ++i) {
        ModuleId blk = g.addModule(blocks, std::to_string(i), "MptBlock");
        layerNorm(blk, "norm_1");
        ModuleId attn = g.addModule(blk, "attn", "MptAttention");
        linear(attn, "Wqkv", h, 3 * h, true);
        linear(attn, "out_proj", h, h, true);
        auto& ac = g.cost(attn);
        ac.eagerAttentionCalls += 1;
        // Two bmm's of 2·s·s·d a head forward, each twice that backward (flop_counter).
        ac.fwdFlops.perTokenSeq += 4 * H;
        ac.bwdFlops.perTokenSeq += 8 * H;
        ac.savedBytes.perToken += 3 * H * e;
        ac.savedBytes.fixedPerTokenSeq += 4 * heads_;
        ac.belowFp32SavedBytes.perTokenSeq += heads_ * e;
        if (clip > 0) {
            // clamp keeps its input, Wqkv's output.
            ac.savedBytes.perToken += 3 * H * e;
            ac.fwdMemKernels += 1;
            ac.bwdMemKernels += 1;
            ac.fwdMemBytes.perToken += 6 * H * e;
            ac.bwdMemBytes.perToken += 9 * H * e;
        }
        // Memory-bound kernels, counted from the operators (not yet checked on a GPU trace).
        // Per token: the copies of q, k, v and of the merged output, and backward the chunk's
        // cat and the merge's copy. Per token and key position, a head each: forward the scale
        // (in the compute dtype), the fp32 bias's add, masked_fill, softmax and the cast back;
        // backward the cast up, softmax's backward, masked_fill's, the add's cast and the
        // scale's.
        ac.fwdMemBytes.perToken += 8 * H * e;
        ac.bwdMemBytes.perToken += 8 * H * e;
        ac.fwdMemBytes.perTokenSeq += 4 * heads_ * e;
        ac.fwdMemBytes.fixedPerTokenSeq += 24 * heads_;
        ac.bwdMemBytes.perTokenSeq += 4 * heads_ * e;
        ac.bwdMemBytes.fixedPerTokenSeq += 28 * heads_;
        ac.fwdMemKernels += 4 + 5;
        ac.bwdMemKernels += 2 + 5;
        ac.outputBytes.perToken += H * e;
        layerNorm(blk, "norm_2");
        ModuleId ffn = g.addModule(blk, "ffn", "MptMLP");
        linear(ffn, "up_proj", h, 4 * h, true);
        cb.gelu(g.addModule(ffn, "act", "GELU"), 4 * H);
        linear(ffn, "down_proj", 4 * h, h, true);
        g.cost(ffn).outputBytes.perToken += H * e;
        g.addModule(blk, "resid_attn_dropout", "Dropout");
        cb.residualAdds(blk, H, 2);  // attention's, and the MLP's inside ffn
    }
    layerNorm(tr, "norm_f");
    cb.lmHead("lm_head", tie ? std::optional(wteW) : std::nullopt, vocab, h, pd);
    cb.causalLmLoss(g.root(), static_cast<double>(vocab));
    if (Status st = g.finalize(); !st) return Error{r.file() + ":/: " + st.error()};
    return g;
}

// Falcon (FalconForCausalLM, transformers 4.57) with rotary positions and parallel
// attention, as Falcon-7B, -40B, -180B and Falcon2-11B: transformer.word_embeddings, blocks
// in transformer.h whose attention and MLP both read the block's input (one input_layernorm,
// or ln_attn and ln_mlp with new_decoder_architecture and num_ln_in_parallel_attn 2),
// LayerNorms with biases, one fused query_key_value, a GELU MLP of ffn_hidden_size, tied
// embeddings by default. Saved per block, measured with saved_tensors_hooks (fp32 and bf16):
// the norm's input, mean and rstd; the rotated q and k, v and SDPA's output and logsumexp (k
// and v broadcast to every query head first with new_decoder_architecture; one key/value
// head with multi_query, as flash-attention 2 keeps them); GELU's input and the down
// projection's input. falcon-rw's sequential block (parallel_attn false: input_layernorm,
// attention, residual, post_attention_layernorm, MLP, residual) and ALiBi positions (one
// (b, heads, s, s) bias for all layers, no RoPE) too.
// Phi (phi-1, phi-1.5, phi-2: PhiForCausalLM): a parallel block under one LayerNorm
// (x + dropout(attention(ln(x))) + dropout(mlp(ln(x)))), q/k/v/dense projections with biases,
// RoPE on partial_rotary_factor of each head made with slices and a cat, an fc1/fc2 MLP with
// the unfused tanh GELU (NewGELUActivation), an lm_head with a bias.
Expected<ModelGraph> loadPhi(const JsonReader& r, const HfLoadOptions& o) {
    const int64_t vocab = positive(r, "vocab_size");
    const int64_t h = positive(r, "hidden_size");
    const int64_t inter = positive(r, "intermediate_size");
    const int64_t layers = positive(r, "num_hidden_layers");
    const int64_t heads = positive(r, "num_attention_heads");
    const int64_t kvHeads =
        r.hasNonNull("num_key_value_heads") ? positive(r, "num_key_value_heads") : heads;
    if (h % heads != 0) r.at("num_attention_heads").fail("must divide hidden_size");
    if (heads % kvHeads != 0) r.at("num_key_value_heads").fail("must divide num_attention_heads");
    if (layers > 10000) r.at("num_hidden_layers").fail("implausibly many layers (more than 10000)");
    const double factor = r.optNumber("partial_rotary_factor").value_or(0.5);
    if (!(factor > 0 && factor <= 1))
        r.at("partial_rotary_factor").fail("partial_rotary_factor must be in (0, 1]");
    if (r.optBool("qk_layernorm").value_or(false))
        r.at("qk_layernorm")
            .fail(
                "q/k LayerNorms are not modelled for Phi; export the model with "
                "scripts/export_model.py");
    const std::string act = r.hasNonNull("hidden_act") ? r.getString("hidden_act") : "gelu_new";
    if (act != "gelu_new")
        r.at("hidden_act").fail("unsupported activation \"" + act + "\" for Phi (gelu_new)");
    const double pResid = dropoutOf(r, "resid_pdrop", 0.0);
    const double pEmbd = dropoutOf(r, "embd_pdrop", 0.0);
    dropoutOf(r, "attention_dropout", 0.0);  // inside the flash kernel on a GPU: no mask
    const bool tie = r.optBool("tie_word_embeddings").value_or(false);
    const int64_t d = h / heads, dq = heads * d, dkv = kvHeads * d;
    const auto rot = static_cast<int64_t>(static_cast<double>(d) * factor);

    ModelGraph g = startGraph("phi", "PhiForCausalLM", o);
    if (r.hasNonNull("max_position_embeddings"))
        g.maxPositions = positive(r, "max_position_embeddings");
    CostBuilder cb{g, static_cast<double>(dtypeSize(o.activationDtype))};
    const DType pd = o.paramDtype;
    const double H = static_cast<double>(h), Q = static_cast<double>(dq);
    const double KV = static_cast<double>(dkv), I = static_cast<double>(inter);
    auto linear = [&](ModuleId parent, const char* name, int64_t in, int64_t out, bool saves,
                      bool sumsInputGrad = false) {
        ModuleId m = g.addModule(parent, name, "Linear");
        g.addParam(m, "weight", {out, in}, pd);
        g.addParam(m, "bias", {out}, pd);
        cb.linear(m, static_cast<double>(in), static_cast<double>(out), saves, true, sumsInputGrad);
        return m;
    };
    ModuleId model = g.addModule(g.root(), "model", "PhiModel");
    ModuleId embed = g.addModule(model, "embed_tokens", "Embedding");
    ParamId embW = g.addParam(embed, "weight", {vocab, h}, pd);
    cb.embedding(embed, H);
    ModuleId list = g.addModule(model, "layers", "ModuleList", {"ModuleList"});
    for (int64_t i = 0; i < layers; ++i) {
        ModuleId layer = g.addModule(list, std::to_string(i), "PhiDecoderLayer");
        ModuleId attn = g.addModule(layer, "self_attn", "PhiAttention");
        linear(attn, "q_proj", h, dq, true);
        linear(attn, "k_proj", h, dkv, false, true);
        linear(attn, "v_proj", h, dkv, false, true);
        // q and k are made by a cat, so SDPA returns its output in their (b, h, s, d) order
        // and merging the heads copies: dense saves the copy.
        linear(attn, "dense", dq, h, true);
        // RoPE on the rotary slices (as Llama's, on heads x rot), the cats of the rotated
        // and passed-through parts; SDPA keeps the cats' q and k and v_proj's output.
        const double rq = static_cast<double>(heads * rot), rk = static_cast<double>(kvHeads * rot);
        auto& ac = g.cost(attn);
        ac.fwdMemBytes.perToken += (10.0 * (rq + rk) + 2.0 * (Q + KV)) * cb.e;
        ac.bwdMemBytes.perToken += (15.0 * (rq + rk) + 2.0 * (Q + KV)) * cb.e;
        ac.fwdMemKernels += 12 + 2;
        ac.bwdMemKernels += 18 + 2;
        ac.outputBytes.perToken += H * cb.e;
        cb.sdpa(attn, static_cast<double>(heads), static_cast<double>(d), Q + 2 * KV);
        ModuleId mlp = g.addModule(layer, "mlp", "PhiMLP");
        cb.unfusedTanhGelu(g.addModule(mlp, "activation_fn", "NewGELUActivation"), I);
        // fc1 reads the norm's output that q_proj saves; its input gradient adds to theirs.
        linear(mlp, "fc1", h, inter, false, true);
        linear(mlp, "fc2", inter, h, true);
        g.cost(mlp).outputBytes.perToken += H * cb.e;
        cb.layerNorm(layer, "input_layernorm", h, pd);
        // One nn.Dropout applied to the attention's output and to the MLP's.
        ModuleId drop = g.addModule(layer, "resid_dropout", "Dropout");
        cb.dropout(drop, H, pResid);
        cb.dropout(drop, H, pResid);
        cb.residualAdds(layer, H, 2);
    }
    cb.rotaryEmbedding(model, "rotary_emb", "PhiRotaryEmbedding", rot, d);
    cb.dropout(g.addModule(model, "embed_dropout", "Dropout"), H, pEmbd);
    cb.layerNorm(model, "final_layernorm", h, pd);
    g.cost(model).outputBytes.perToken += H * cb.e;
    cb.lmHead("lm_head", tie ? std::optional(embW) : std::nullopt, vocab, h, pd, true);
    cb.causalLmLoss(g.root(), static_cast<double>(vocab));
    if (Status st = g.finalize(); !st) return Error{r.file() + ":/: " + st.error()};
    return g;
}

// GPT-NeoX (Pythia, GPT-NeoX-20B: GPTNeoXForCausalLM): LayerNorms before the attention and
// the MLP, in parallel by default (x + attention(ln1(x)) + mlp(ln2(x))), one fused
// query_key_value whose output is split per head into q, k and v (views), RoPE on rotary_pct
// of each head through a cat, a GELU MLP (dense_h_to_4h, act, dense_4h_to_h), embed_out.
Expected<ModelGraph> loadGptNeoX(const JsonReader& r, const HfLoadOptions& o) {
    const int64_t vocab = positive(r, "vocab_size");
    const int64_t h = positive(r, "hidden_size");
    const int64_t inter = positive(r, "intermediate_size");
    const int64_t layers = positive(r, "num_hidden_layers");
    const int64_t heads = positive(r, "num_attention_heads");
    if (h % heads != 0) r.at("num_attention_heads").fail("must divide hidden_size");
    if (layers > 10000) r.at("num_hidden_layers").fail("implausibly many layers (more than 10000)");
    const double pct = r.optNumber("rotary_pct").value_or(0.25);
    if (!(pct > 0 && pct <= 1)) r.at("rotary_pct").fail("rotary_pct must be in (0, 1]");
    const std::string act = r.hasNonNull("hidden_act") ? r.getString("hidden_act") : "gelu";
    if (act != "gelu")
        r.at("hidden_act").fail("unsupported activation \"" + act + "\" for GPT-NeoX (gelu)");
    const double pHidden = dropoutOf(r, "hidden_dropout", 0.0);
    dropoutOf(r, "attention_dropout", 0.0);  // inside the flash kernel on a GPU: no mask
    const bool parallel = r.optBool("use_parallel_residual").value_or(true);
    const bool bias = r.optBool("attention_bias").value_or(true);
    const bool tie = r.optBool("tie_word_embeddings").value_or(false);
    const int64_t d = h / heads;
    const auto rot = static_cast<int64_t>(static_cast<double>(d) * pct);

    ModelGraph g = startGraph("gpt_neox", "GPTNeoXForCausalLM", o);
    if (r.hasNonNull("max_position_embeddings"))
        g.maxPositions = positive(r, "max_position_embeddings");
    CostBuilder cb{g, static_cast<double>(dtypeSize(o.activationDtype))};
    const DType pd = o.paramDtype;
    const double H = static_cast<double>(h), I = static_cast<double>(inter);
    auto linear = [&](ModuleId parent, const char* name, int64_t in, int64_t out, bool withBias,
                      bool saves) {
        ModuleId m = g.addModule(parent, name, "Linear");
        g.addParam(m, "weight", {out, in}, pd);
        if (withBias) g.addParam(m, "bias", {out}, pd);
        cb.linear(m, static_cast<double>(in), static_cast<double>(out), saves, withBias);
        return m;
    };
    ModuleId model = g.addModule(g.root(), "gpt_neox", "GPTNeoXModel");
    ModuleId embed = g.addModule(model, "embed_in", "Embedding");
    ParamId embW = g.addParam(embed, "weight", {vocab, h}, pd);
    cb.embedding(embed, H);
    cb.dropout(g.addModule(model, "emb_dropout", "Dropout"), H, pHidden);
    ModuleId list = g.addModule(model, "layers", "ModuleList", {"ModuleList"});
    for (int64_t i = 0; i < layers; ++i) {
        ModuleId layer = g.addModule(list, std::to_string(i), "GPTNeoXLayer");
        cb.layerNorm(layer, "input_layernorm", h, pd);
        // In parallel both norms read the layer's input, saved once (by the first).
        cb.layerNorm(layer, "post_attention_layernorm", h, pd, !parallel);
        cb.dropout(g.addModule(layer, "post_attention_dropout", "Dropout"), H, pHidden);
        cb.dropout(g.addModule(layer, "post_mlp_dropout", "Dropout"), H, pHidden);
        ModuleId attn = g.addModule(layer, "attention", "GPTNeoXAttention");
        linear(attn, "query_key_value", h, 3 * h, bias, true);
        // q and k are made by a cat, so SDPA's output comes back in their (b, h, s, d) order
        // and dense saves the copy merging the heads makes.
        linear(attn, "dense", h, h, bias, true);
        // RoPE on the rotary slices (as Llama's) and the cats; SDPA keeps the cats' q and k
        // and, v being a view of it, query_key_value's whole output.
        const double rq = static_cast<double>(heads * rot);
        auto& ac = g.cost(attn);
        ac.fwdMemBytes.perToken += (10.0 * 2 * rq + 2.0 * 2 * H) * cb.e;
        ac.bwdMemBytes.perToken += (15.0 * 2 * rq + 2.0 * 2 * H) * cb.e;
        ac.fwdMemKernels += 12 + 2;
        ac.bwdMemKernels += 18 + 2;
        ac.outputBytes.perToken += H * cb.e;
        cb.sdpa(attn, static_cast<double>(heads), static_cast<double>(d), 5 * H);
        ModuleId mlp = g.addModule(layer, "mlp", "GPTNeoXMLP");
        linear(mlp, "dense_h_to_4h", h, inter, true, true);
        linear(mlp, "dense_4h_to_h", inter, h, true, true);
        cb.gelu(g.addModule(mlp, "act", "GELUActivation"), I);
        g.cost(mlp).outputBytes.perToken += H * cb.e;
        cb.residualAdds(layer, H, 2);
    }
    cb.layerNorm(model, "final_layer_norm", h, pd);
    cb.rotaryEmbedding(model, "rotary_emb", "GPTNeoXRotaryEmbedding", rot, d);
    g.cost(model).outputBytes.perToken += H * cb.e;
    cb.lmHead("embed_out", tie ? std::optional(embW) : std::nullopt, vocab, h, pd);
    cb.causalLmLoss(g.root(), static_cast<double>(vocab));
    if (Status st = g.finalize(); !st) return Error{r.file() + ":/: " + st.error()};
    return g;
}

// Falcon's config: the layout (new_decoder_architecture, multi_query, alibi, parallel_attn)
// and sizes, with both spellings transformers accepts (n_layer, n_head, n_head_kv).
struct FalconShape {
    int64_t vocab, h, layers, heads, kvHeads, lnCount, ffn;
    bool newArch, multiQuery, alibi, parallel, bias, tie;
};

FalconShape readFalcon(const JsonReader& r) {
    auto pick = [&](const char* a, const char* b) { return r.hasNonNull(a) ? a : b; };
    FalconShape f{};
    f.vocab = positive(r, "vocab_size");
    f.h = positive(r, "hidden_size");
    const char* layersKey = pick("num_hidden_layers", "n_layer");
    const char* headsKey = pick("num_attention_heads", "n_head");
    f.layers = positive(r, layersKey);
    f.heads = positive(r, headsKey);
    if (f.h % f.heads != 0) r.at(headsKey).fail("the number of heads must divide hidden_size");
    if (f.layers > 10000) r.at(layersKey).fail("implausibly many layers (more than 10000)");
    f.newArch = r.optBool("new_decoder_architecture").value_or(false);
    f.multiQuery = r.optBool("multi_query").value_or(true);
    f.alibi = r.optBool("alibi").value_or(false);
    f.parallel = r.optBool("parallel_attn").value_or(true);
    const char* kvKey = pick("num_kv_heads", "n_head_kv");
    f.kvHeads = f.heads;
    if (f.newArch) {
        if (r.hasNonNull(kvKey)) f.kvHeads = positive(r, kvKey);
        if (f.heads % f.kvHeads != 0)
            r.at(kvKey).fail("the number of key/value heads must divide the number of heads");
    } else if (f.multiQuery) {
        f.kvHeads = 1;
    }
    f.lnCount = !f.newArch ? 1
                           : (r.hasNonNull("num_ln_in_parallel_attn")
                                  ? r.at("num_ln_in_parallel_attn").asIntAtLeast(1)
                                  : 2);
    if (f.lnCount > 2)
        r.at("num_ln_in_parallel_attn").fail("num_ln_in_parallel_attn must be 1 or 2");
    f.ffn = r.hasNonNull("ffn_hidden_size") ? positive(r, "ffn_hidden_size") : 4 * f.h;
    f.bias = r.optBool("bias").value_or(false);
    f.tie = r.optBool("tie_word_embeddings").value_or(true);
    const std::string act = r.hasNonNull("activation") ? r.getString("activation") : "gelu";
    if (act != "gelu")
        r.at("activation").fail("unsupported activation \"" + act + "\" for Falcon (gelu)");
    return f;
}

Expected<ModelGraph> loadFalcon(const JsonReader& r, const HfLoadOptions& o) {
    const FalconShape f = readFalcon(r);
    // Plain copies, not structured bindings: lambdas below capture them (clang before 16
    // does not capture bindings).
    const int64_t vocab = f.vocab, h = f.h, layers = f.layers, heads = f.heads;
    const int64_t kvHeads = f.kvHeads, lnCount = f.lnCount, ffn = f.ffn;
    const bool newArch = f.newArch, multiQuery = f.multiQuery, alibi = f.alibi;
    const bool parallel = f.parallel, bias = f.bias, tie = f.tie;
    const int64_t d = h / heads, dq = h, dkv = kvHeads * d;
    const int64_t qkvOut = newArch ? (2 * kvHeads + heads) * d : multiQuery ? h + 2 * d : 3 * h;

    ModelGraph g = startGraph("falcon", "FalconForCausalLM", o);
    if (r.hasNonNull("max_position_embeddings"))
        g.maxPositions = positive(r, "max_position_embeddings");
    CostBuilder cb{g, static_cast<double>(dtypeSize(o.activationDtype))};
    const DType pd = o.paramDtype;
    const double H = static_cast<double>(h), Dq = static_cast<double>(dq);
    // FalconLinear: input @ weight.T (an mm) and, with a bias, a separate add.
    auto linear = [&](ModuleId parent, const char* name, int64_t in, int64_t out, bool saves) {
        ModuleId m = g.addModule(parent, name, "FalconLinear");
        g.addParam(m, "weight", {out, in}, pd);
        cb.linear(m, static_cast<double>(in), static_cast<double>(out), saves);
        if (bias) {
            g.addParam(m, "bias", {out}, pd);
            auto& c = g.cost(m);
            c.fwdMemKernels += 1;
            c.bwdMemKernels += 1;
            c.fwdMemBytes.perToken += 3.0 * static_cast<double>(out) * cb.e;
            c.bwdMemBytes.perToken += 2.0 * static_cast<double>(out) * cb.e;
        }
        return m;
    };
    auto layerNorm = [&](ModuleId parent, const char* name, bool savesInput) {
        cb.layerNorm(parent, name, h, pd, savesInput);
    };
    ModuleId tr = g.addModule(g.root(), "transformer", "FalconModel");
    ModuleId emb = g.addModule(tr, "word_embeddings", "Embedding");
    ParamId embW = g.addParam(emb, "weight", {vocab, h}, pd);
    cb.embedding(emb, H);
    ModuleId hl = g.addModule(tr, "h", "ModuleList", {"ModuleList"});
    for (int64_t i = 0; i < layers; ++i) {
        ModuleId blk = g.addModule(hl, std::to_string(i), "FalconDecoderLayer");
        ModuleId attn = g.addModule(blk, "self_attention", "FalconAttention");
        linear(attn, "query_key_value", h, qkvOut, true);
        // dense's input is SDPA's output with its heads merged: a view of the flash kernels'
        // (b, s, h, d) output.
        linear(attn, "dense", h, h, false);
        g.addModule(attn, "attention_dropout", "Dropout");
        // Heads split out of the fused output (copies), RoPE on q and k (as Llama's; none
        // with ALiBi), k and v broadcast to every head with new_decoder_architecture (copies).
        const double kvWidth = static_cast<double>(newArch ? dq : dkv);
        auto& ac = g.cost(attn);
        const double rope = alibi ? 0.0 : 6.0 * (Dq + kvWidth) + 4.0 * Dq;
        ac.fwdMemBytes.perToken += (rope + 2.0 * (Dq + 2 * kvWidth)) * cb.e;
        ac.bwdMemBytes.perToken += (rope + 2.0 * (Dq + 2 * kvWidth)) * cb.e;
        ac.fwdMemKernels += (alibi ? 0 : 12) + 3;
        ac.bwdMemKernels += (alibi ? 0 : 18) + 3;
        ac.outputBytes.perToken += H * cb.e;
        cb.sdpa(attn, static_cast<double>(heads), static_cast<double>(d), Dq + 2 * kvWidth);
        ModuleId mlp = g.addModule(blk, "mlp", "FalconMLP");
        // With one norm the parallel MLP reads the attention's input (saved by
        // query_key_value); the sequential one reads post_attention_layernorm's output.
        linear(mlp, "dense_h_to_4h", h, ffn, lnCount == 2 || !parallel);
        cb.gelu(g.addModule(mlp, "act", "GELUActivation"), static_cast<double>(ffn));
        linear(mlp, "dense_4h_to_h", ffn, h, true);
        g.cost(mlp).outputBytes.perToken += H * cb.e;
        if (!parallel) {
            // Registered in this order; post_attention_layernorm normalises the residual
            // sum after the attention (its input, saved).
            layerNorm(blk, "post_attention_layernorm", true);
            layerNorm(blk, "input_layernorm", true);
        } else if (lnCount == 2) {
            layerNorm(blk, "ln_attn", true);
            layerNorm(blk, "ln_mlp", false);
        } else {
            layerNorm(blk, "input_layernorm", true);
        }
        // Parallel: mlp + attention, then the residual; sequential: the residual after the
        // attention, then after the MLP.
        cb.residualAdds(blk, H, 2);
        if (newArch && parallel && lnCount == 2 && !alibi) {
            // Compiled as one region (AOT autograd's min-cut partitioner,
            // tests/python/test_compiled_saved_peer.py), the parallel block of
            // new_decoder_architecture saves: the block input and ln_attn's output (ln_mlp's
            // is recomputed from the input and its statistics); the rotated q and k and v,
            // each broadcast to every query head, SDPA's output and logsumexp and dense's
            // input (the output with its heads merged); dense_h_to_4h's output (GELU's
            // input) and GELU's output: 3h + 4·(heads x head_dim) + 2·ffn a token, and each
            // LayerNorm's mean and rstd (fp32 on a GPU).
            auto& k = g.cost(blk).compiled;
            k.savedBytes.perToken = (3 * H + 4 * Dq + 2 * static_cast<double>(ffn)) * cb.e;
            k.savedBytes.fixedPerToken = 2 * 8 + 4 * static_cast<double>(heads);
        }
    }
    layerNorm(tr, "ln_f", true);
    const ModuleId rot = cb.rotaryEmbedding(tr, "rotary_emb", "FalconRotaryEmbedding", d, d);
    if (alibi) {
        // FalconModel still computes cos and sin, which no attention reads (nothing keeps
        // them). It builds the ALiBi bias once, (b, heads, 1, s) scaled and filled with the
        // causal mask into one (b, heads, s, s) tensor in the compute dtype, which every
        // layer's SDPA takes as attn_mask (a float mask is not converted) and keeps: one
        // tensor for all layers, alive from the model's start to the end of backward,
        // counted at the rotary module, which runs there (after the embedding).
        auto& c = g.cost(rot);
        c.savedBytes = {};
        c.savedBytes.perTokenSeq += static_cast<double>(heads) * cb.e;
        c.fwdMemKernels += 3;  // the scaling, the comparison with the causal mask, the fill
        c.fwdMemBytes.perTokenSeq += (2.0 * static_cast<double>(heads) * cb.e + 1.0 + cb.e);
    }
    cb.lmHead("lm_head", tie ? std::optional(embW) : std::nullopt, vocab, h, pd);
    cb.causalLmLoss(g.root(), static_cast<double>(vocab));
    if (Status s = g.finalize(); !s) return Error{r.file() + ":/: " + s.error()};
    return g;
}

using Loader = Expected<ModelGraph> (*)(const JsonReader&, const HfLoadOptions&);

// The families whose layout is not Llama's, with loaders of their own.
Loader ownLoader(const std::string& type) {
    static const std::pair<std::string_view, Loader> kOwn[] = {{"gpt2", loadGpt2},
                                                               {"falcon", loadFalcon},
                                                               {"phi", loadPhi},
                                                               {"gpt_neox", loadGptNeoX},
                                                               {"mpt", loadMpt}};
    for (const auto& [name, loader] : kOwn)
        if (type == name) return loader;
    return nullptr;
}

}  // namespace

bool looksLikeHfConfig(const nlohmann::json& j) {
    return j.is_object() && j.contains("model_type") && !j.contains("format");
}

const std::vector<HfFamily>& hfFamilies() {
    static const std::vector<HfFamily> kFamilies = {
        {"llama", "LlamaForCausalLM", "Llama 2, Llama 3, 3.1, 3.2, 3.3"},
        {"mistral", "MistralForCausalLM", "Mistral 7B, Mistral NeMo, Mistral Small"},
        {"mixtral", "MixtralForCausalLM", "Mixtral 8x7B, 8x22B"},
        {"qwen2", "Qwen2ForCausalLM", "Qwen2, Qwen2.5"},
        {"qwen2_moe", "Qwen2MoeForCausalLM", "Qwen1.5-MoE, Qwen2-MoE"},
        {"qwen3", "Qwen3ForCausalLM", "Qwen3 dense"},
        {"qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3 MoE (30B-A3B, 235B-A22B)"},
        {"deepseek_v2", "DeepseekV2ForCausalLM", "DeepSeek-V2, V2-Lite"},
        {"deepseek_v3", "DeepseekV3ForCausalLM", "DeepSeek-V3, R1, Moonlight"},
        {"glm4_moe", "Glm4MoeForCausalLM", "GLM-4.5, GLM-4.5-Air"},
        {"phi", "PhiForCausalLM", "phi-1, phi-1.5, phi-2"},
        {"phi3", "Phi3ForCausalLM", "Phi-3, Phi-3.5, Phi-4"},
        {"gemma2", "Gemma2ForCausalLM", "Gemma 2"},
        {"gemma3_text", "Gemma3ForCausalLM", "Gemma 3 1B and Gemma 3's text model"},
        {"olmo", "OlmoForCausalLM", "OLMo 1, OLMo 1.7 (clip_qkv)"},
        {"olmo2", "Olmo2ForCausalLM", "OLMo 2"},
        {"olmoe", "OlmoeForCausalLM", "OLMoE"},
        {"olmo3", "Olmo3ForCausalLM", "OLMo 3"},
        {"falcon", "FalconForCausalLM", "Falcon 7B, 40B, 180B, RW, Falcon2 11B"},
        {"cohere2", "Cohere2ForCausalLM", "Command R7B"},
        {"gpt2", "GPT2LMHeadModel", "GPT-2"},
        {"gpt_neox", "GPTNeoXForCausalLM", "GPT-NeoX-20B, Pythia"},
        {"starcoder2", "Starcoder2ForCausalLM", "StarCoder2"},
        {"seed_oss", "SeedOssForCausalLM", "Seed-OSS"},
        {"granite", "GraniteForCausalLM", "Granite 3.0-3.3 dense"},
        {"granitemoe", "GraniteMoeForCausalLM", "Granite 3.0/3.1 MoE (1B-A400M, 3B-A800M)"},
        {"smollm3", "SmolLM3ForCausalLM", "SmolLM3"},
        {"exaone4", "Exaone4ForCausalLM", "EXAONE 4.0"},
        {"gpt_oss", "GptOssForCausalLM", "gpt-oss-20b, gpt-oss-120b"},
        {"llama4_text", "Llama4ForCausalLM", "Llama 4 Scout and Maverick (text_config)"},
        {"ernie4_5_moe", "Ernie4_5_MoeForCausalLM", "ERNIE-4.5 MoE (21B-A3B, 300B-A47B)"},
        {"mpt", "MptForCausalLM", "MPT-7B, MPT-30B (ALiBi, eager attention)"},
    };
    return kFamilies;
}

bool hfModelTypeSupported(const std::string& type) {
    const auto& f = hfFamilies();
    return std::any_of(f.begin(), f.end(), [&](const HfFamily& x) { return type == x.modelType; });
}

Expected<ModelGraph> modelFromHfConfig(const nlohmann::json& j, const std::string& file,
                                       const HfLoadOptions& options) {
    try {
        JsonReader r(j, file);
        r.requireObject();
        const std::string type = r.getString("model_type");
        Expected<ModelGraph> g = Error{""};
        // Every native family but the ones with loaders of their own is Llama-like.
        if (const Loader own = ownLoader(type))
            g = own(r, options);
        else if (hfModelTypeSupported(type))
            g = loadLlamaLike(r, type, options);
        else if (type == "gemma3")
            r.at("model_type")
                .fail(
                    "a multimodal Gemma-3 config (Gemma3ForConditionalGeneration, with a "
                    "vision tower): ShardScope loads Gemma-3's text model (model_type "
                    "gemma3_text, Gemma3ForCausalLM) natively; export the multimodal model with "
                    "scripts/export_model.py");
        else {
            std::string list;
            for (const HfFamily& f : hfFamilies())
                list += std::string(list.empty() ? "" : ", ") + f.modelType;
            r.at("model_type")
                .fail("unsupported model_type \"" + type + "\" (supported: " + list +
                      "; for other models export a ShardScope model JSON with "
                      "scripts/export_model.py)");
        }
        if (g.ok() && r.hasNonNull("_name_or_path")) g->name = r.getString("_name_or_path");
        return g;
    } catch (const JsonError& e) {
        return Error{e.what()};
    }
}

}  // namespace shardscope
