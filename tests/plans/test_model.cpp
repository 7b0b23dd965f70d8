// SPDX-License-Identifier: Apache-2.0
// Model graph and loaders: Hugging Face configs give the published parameter counts and
// transformers' module names; model JSON round-trips; errors name the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "plans/core/json_reader.h"
#include "plans/model/model_json.h"
#include "tests/support/golden.h"

using namespace shardscope;
using shardscope::test::samplePath;

namespace {

ModelGraph load(const std::string& sample) {
    auto g = loadModelFile(samplePath("models/" + sample + "/config.json"));
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error());
    return std::move(g).value();
}

ModelGraph fromText(const std::string& text, HfLoadOptions o = {}) {
    auto j = parseJsonText(text, "config.json");
    EXPECT_TRUE(j.ok());
    auto g = looksLikeHfConfig(*j) ? modelFromHfConfig(*j, "config.json", o)
                                   : modelFromJson(*j, "model.json");
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error());
    return std::move(g).value();
}

std::string loadError(const std::string& text) {
    auto j = parseJsonText(text, "config.json");
    if (!j) return j.error();
    auto g = looksLikeHfConfig(*j) ? modelFromHfConfig(*j, "config.json")
                                   : modelFromJson(*j, "model.json");
    return g.ok() ? std::string() : g.error();
}

// The error of `text` with its first `from` replaced by `to`.
std::string loadErrorWith(std::string text, const std::string& from, const std::string& to) {
    text.replace(text.find(from), from.size(), to);
    return loadError(text);
}

}  // namespace

// Published totals (model cards / transformers' num_parameters()).
TEST(HfConfig, PublishedParameterCounts) {
    const std::vector<std::pair<std::string, int64_t>> cases = {
        {"llama3-8b", 8030261248},
        {"llama3.1-8b", 8030261248},
        {"llama3-70b", 70553706496},
        {"llama2-7b", 6738415616},
        {"mistral-7b-v0.1", 7241732096},
        {"qwen2-0.5b", 494032768},
        {"qwen2-7b", 7615616512},
        {"mixtral-8x7b", 46702792704},
        {"gpt2", 124439808},
        {"qwen3-30b-a3b", 30532122624},
        {"deepseek-v3", 671026404352},
        {"deepseek-v2-lite", 15706484224},
        {"gemma2-9b", 9241705984},
        {"gemma3-1b", 999885952},
        {"falcon-7b", 6921720704},
        {"falcon-40b", 41303293952},
        {"falcon-rw-1b", 1311625216},
        {"moonlight-16b-a3b", 15960108544},
        {"phi3-mini-4k", 3821079552},
        {"phi4", 14659507200},
    };
    for (const auto& [name, count] : cases)
        EXPECT_EQ(load(name).totalParams(), count) << name;
}

TEST(HfConfig, LlamaModuleNamesAndShapes) {
    const ModelGraph g = load("llama3-8b");
    for (const char* m :
         {"model", "model.embed_tokens", "model.layers", "model.layers.0.self_attn.q_proj",
          "model.layers.31.mlp.down_proj", "model.layers.0.input_layernorm", "model.norm",
          "model.rotary_emb", "lm_head"})
        EXPECT_TRUE(g.findModule(m).has_value()) << m;
    EXPECT_EQ(g.module(*g.findModule("model.layers.5")).cls, "LlamaDecoderLayer");
    EXPECT_TRUE(g.isContainer(*g.findModule("model.layers")));
    // GQA: 8 KV heads of 128 dims.
    EXPECT_EQ(g.param(*g.findParam("model.layers.0.self_attn.k_proj.weight")).shape,
              (Shape{1024, 4096}));
    EXPECT_EQ(g.param(*g.findParam("model.layers.0.mlp.gate_proj.weight")).shape,
              (Shape{14336, 4096}));
    EXPECT_FALSE(g.findParam("model.layers.0.self_attn.q_proj.bias").has_value());
    // named_parameters order: embed first, lm_head last; untied.
    EXPECT_EQ(g.params().front().name, "model.embed_tokens.weight");
    EXPECT_EQ(g.params().back().name, "lm_head.weight");
    EXPECT_FALSE(g.params().back().tied());
}

TEST(HfConfig, Qwen2BiasesAndTiedEmbeddings) {
    const ModelGraph g = load("qwen2-0.5b");
    EXPECT_TRUE(g.findParam("model.layers.0.self_attn.q_proj.bias").has_value());
    EXPECT_FALSE(g.findParam("model.layers.0.self_attn.o_proj.bias").has_value());
    const auto pid = *g.findParam("lm_head.weight");
    EXPECT_EQ(g.param(pid).name, "model.embed_tokens.weight");  // recorded once, first owner
    EXPECT_EQ(g.param(pid).owners.size(), 2u);
    EXPECT_EQ(g.ownersLca(pid), g.root());
}

TEST(HfConfig, MixtralExpertsAndRouterAreModules) {
    const ModelGraph g = load("mixtral-8x7b");
    EXPECT_EQ(g.module(*g.findModule("model.layers.0.block_sparse_moe")).cls,
              "MixtralSparseMoeBlock");
    EXPECT_EQ(g.param(*g.findParam("model.layers.0.block_sparse_moe.gate.weight")).shape,
              (Shape{8, 4096}));
    EXPECT_EQ(g.param(*g.findParam("model.layers.3.block_sparse_moe.experts.7.w2.weight")).shape,
              (Shape{4096, 14336}));
    // Balanced top-2 routing: an expert sees 2/8 of the tokens.
    const ModuleCost e = g.subtreeCost(*g.findModule("model.layers.0.block_sparse_moe.experts.0"));
    EXPECT_DOUBLE_EQ(e.fwdFlops.perToken, 0.25 * 3 * 2 * 4096.0 * 14336.0);
}

// Qwen-MoE: the layer's `mlp` is a sparse block unless mlp_only_layers or
// decoder_sparse_step says dense; Qwen2-MoE adds the sigmoid-gated shared expert.
TEST(HfConfig, QwenMoeSparseAndDenseLayers) {
    const std::string q2 = R"({"model_type": "qwen2_moe", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 96, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 2,
        "mlp_only_layers": [3]})";
    const ModelGraph g = fromText(q2);
    // Layer 1 is the only sparse one: (i + 1) % 2 == 0 leaves 1 and 3, and 3 is dense.
    EXPECT_EQ(g.module(*g.findModule("model.layers.1.mlp")).cls, "Qwen2MoeSparseMoeBlock");
    for (const char* dense : {"model.layers.0.mlp", "model.layers.2.mlp", "model.layers.3.mlp"})
        EXPECT_EQ(g.module(*g.findModule(dense)).cls, "Qwen2MoeMLP") << dense;
    EXPECT_TRUE(g.findModule("model.layers.1.mlp.shared_expert_gate").has_value());
    EXPECT_TRUE(g.findModule("model.layers.1.mlp.experts.3.down_proj").has_value());
    EXPECT_TRUE(g.findModule("model.layers.0.self_attn.rotary_emb").has_value());
    EXPECT_EQ(g.module(*g.findModule("model.layers.0.self_attn")).cls, "Qwen2MoeSdpaAttention");

    auto withField = [&](const std::string& from, const std::string& to) {
        return loadErrorWith(q2, from, to);
    };
    EXPECT_EQ(withField("[3]", "[4]"),
              "config.json:/mlp_only_layers/0: layer 4 does not exist (num_hidden_layers is 4)");
    EXPECT_EQ(withField("\"moe_intermediate_size\": 32,", ""),
              "config.json:/: missing required field \"moe_intermediate_size\"");
    EXPECT_EQ(withField("\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5"),
              "config.json:/num_experts_per_tok: num_experts_per_tok exceeds num_experts");
    // A bound on the experts of all layers, checked before the graph is built (the fuzzer's
    // 4,100-layer, 128-expert config took 26 s under ASan; 10,000 x 4,096 would need
    // over 100 GB).
    std::string many = q2;
    many.replace(many.find("\"num_hidden_layers\": 4"), 22, "\"num_hidden_layers\": 17");
    EXPECT_EQ(loadErrorWith(many, "\"num_experts\": 4,", "\"num_experts\": 4096,"),
              "config.json:/num_experts: implausibly many experts in all: 17 layers x 4096 = 69632 "
              "(more than 65536)");
    EXPECT_NE(withField("\"num_experts\": 4", "\"num_experts\": 4, \"use_sliding_window\": true")
                  .find("config.json:/use_sliding_window: sliding-window attention is not modelled "
                        "for Qwen2-MoE"),
              std::string::npos);
}

// Which layers attend to a sliding window, as transformers' configs decide
// (config.layer_types; python_hf_modules compares the samples with transformers itself).
TEST(HfConfig, SlidingWindowLayers) {
    const std::string q3 = R"({"model_type": "qwen3", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "use_sliding_window": true, "max_window_layers": 1})";
    auto masked = [](const ModelGraph& g) {
        std::string s;
        for (int i = 0; i < 4; ++i)
            s += g.module(*g.findModule("model.layers." + std::to_string(i) + ".self_attn"))
                         .cost.windowSavedBytes.isZero()
                     ? '.'
                     : 'S';
        return s;
    };
    // Qwen2/Qwen3: the first max_window_layers attend fully; the window defaults to 4096.
    ModelGraph g = fromText(q3);
    EXPECT_EQ(g.slidingWindow, 4096);
    EXPECT_EQ(masked(g), ".SSS");
    g = fromText(std::string(q3).replace(q3.find("\"max_window_layers\": 1"), 22,
                                         "\"layer_types\": [\"sliding_attention\", "
                                         "\"full_attention\", \"sliding_attention\", "
                                         "\"full_attention\"]"));
    EXPECT_EQ(masked(g), "S.S.");
    g = fromText(std::string(q3).replace(q3.find("true"), 4, "false"));
    EXPECT_EQ(g.slidingWindow, 0);
    EXPECT_EQ(masked(g), "....");
    // Mistral: every layer, 4096 when the config omits the window, none when it is null.
    const std::string mistral = R"({"model_type": "mistral", "vocab_size": 100,
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4})";
    g = fromText(mistral);
    EXPECT_EQ(g.slidingWindow, 4096);
    EXPECT_EQ(masked(g), "SSSS");
    g = fromText(
        std::string(mistral).replace(mistral.size() - 1, 1, ", \"sliding_window\": null}"));
    EXPECT_EQ(masked(g), "....");
    // Gemma-3: every sliding_window_pattern-th layer is a full one.
    const std::string gemma3 = R"({"model_type": "gemma3_text", "vocab_size": 100,
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
        "sliding_window": 512, "sliding_window_pattern": 2})";
    EXPECT_EQ(masked(fromText(gemma3)), "S.S.");

    EXPECT_EQ(
        loadErrorWith(q3, "\"max_window_layers\": 1", "\"layer_types\": [\"full_attention\"]"),
        "config.json:/layer_types: layer_types lists 1 layers, num_hidden_layers is 4");
    EXPECT_NE(loadErrorWith(q3, "\"max_window_layers\": 1",
                            "\"layer_types\": [\"full_attention\", \"chunked_attention\", "
                            "\"full_attention\", \"full_attention\"]")
                  .find("config.json:/layer_types/1: unknown layer type \"chunked_attention\""),
              std::string::npos);
}

// DeepSeek-V3: dense layers before first_k_dense_replace, then DeepseekV3MoE (experts, the
// router with its own weight and correction bias, shared experts); MLA without a q
// bottleneck when q_lora_rank is null.
TEST(HfConfig, DeepseekV3LayersAndRouter) {
    const std::string ds = R"({"model_type": "deepseek_v3", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 96, "moe_intermediate_size": 16, "num_hidden_layers": 3,
        "num_attention_heads": 4, "n_routed_experts": 8, "n_shared_experts": 2,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 2, "topk_group": 1,
        "q_lora_rank": null, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
        "v_head_dim": 16})";
    const ModelGraph g = fromText(ds);
    EXPECT_EQ(g.module(*g.findModule("model.layers.0.mlp")).cls, "DeepseekV3MLP");
    EXPECT_EQ(g.module(*g.findModule("model.layers.1.mlp")).cls, "DeepseekV3MoE");
    EXPECT_EQ(g.module(*g.findModule("model.layers.2.mlp.gate")).cls, "DeepseekV3TopkRouter");
    EXPECT_TRUE(g.findParam("model.layers.2.mlp.gate.weight").has_value());
    EXPECT_TRUE(g.findModule("model.layers.1.self_attn.q_proj").has_value());
    EXPECT_FALSE(g.findModule("model.layers.1.self_attn.q_a_proj").has_value());
    // Two shared experts of moe_intermediate_size each: one MLP of 32.
    EXPECT_EQ(g.param(*g.findParam("model.layers.1.mlp.shared_experts.up_proj.weight")).shape,
              (Shape{32, 64}));
    auto withField = [&](const std::string& from, const std::string& to) {
        return loadErrorWith(ds, from, to);
    };
    EXPECT_EQ(withField("\"n_group\": 2", "\"n_group\": 3"),
              "config.json:/n_group: n_group (3) must divide n_routed_experts (8)");
    EXPECT_EQ(withField("\"kv_lora_rank\": 16,", ""),
              "config.json:/: missing required field \"kv_lora_rank\"");
    EXPECT_EQ(withField("\"qk_rope_head_dim\": 8", "\"qk_rope_head_dim\": 7"),
              "config.json:/qk_rope_head_dim: qk_rope_head_dim must be even");
}

// DeepSeek-V2: V3's layout with DeepseekV2MoEGate (a weight, no correction bias), shared
// experts only when n_shared_experts is set, and groups only for group_limited_greedy.
TEST(HfConfig, DeepseekV2GateSharedExpertsAndTopkMethod) {
    const std::string ds = R"({"model_type": "deepseek_v2", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 96, "moe_intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 4, "n_routed_experts": 8, "n_shared_experts": 2,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1, "topk_method": "greedy",
        "q_lora_rank": null, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
        "v_head_dim": 16})";
    const ModelGraph g = fromText(ds);
    EXPECT_EQ(g.modules()[0].cls, "DeepseekV2ForCausalLM");
    EXPECT_EQ(g.module(*g.findModule("model.layers.1.mlp")).cls, "DeepseekV2MoE");
    const ModuleId gate = *g.findModule("model.layers.1.mlp.gate");
    EXPECT_EQ(g.module(gate).cls, "DeepseekV2MoEGate");
    EXPECT_TRUE(g.module(gate).buffers.empty());
    EXPECT_TRUE(g.findModule("model.layers.1.mlp.shared_experts").has_value());
    auto withField = [&](const std::string& from, const std::string& to) {
        return loadErrorWith(ds, from, to);
    };
    const std::string none = R"({"model_type": "deepseek_v2", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 96, "moe_intermediate_size": 16, "num_hidden_layers": 2,
        "num_attention_heads": 4, "n_routed_experts": 8, "n_shared_experts": null,
        "num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 3,
        "q_lora_rank": null, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
        "v_head_dim": 16})";
    // greedy (the default) ignores n_group; without shared experts there is no module.
    EXPECT_FALSE(fromText(none).findModule("model.layers.1.mlp.shared_experts").has_value());
    EXPECT_EQ(withField("\"greedy\"", "\"group_limited_greedy\", \"n_group\": 3"),
              "config.json:/n_group: n_group (3) must divide n_routed_experts (8)");
    EXPECT_EQ(withField("\"greedy\"", "\"noaux_tc\""),
              "config.json:/topk_method: unknown topk_method \"noaux_tc\" (DeepSeek-V2 has greedy "
              "and group_limited_greedy)");
}

// Gemma-2 and Gemma-3's text model: four (1 + weight) norms per layer, head_dim 256 and tied
// embeddings by default, Gemma-2's final logit softcapping on by default (tanh keeps one
// vocabulary-sized tensor per token), the multimodal Gemma-3 config refused with what to do.
TEST(HfConfig, GemmaNormsDefaultsSoftcappingAndTheMultimodalConfig) {
    const std::string g2 = R"({"model_type": "gemma2", "vocab_size": 1000, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2})";
    const ModelGraph g = fromText(g2);
    EXPECT_EQ(g.modules()[0].cls, "Gemma2ForCausalLM");
    for (const char* n : {"input_layernorm", "post_attention_layernorm",
                          "pre_feedforward_layernorm", "post_feedforward_layernorm"})
        EXPECT_EQ(g.module(*g.findModule(std::string("model.layers.1.") + n)).cls, "Gemma2RMSNorm")
            << n;
    EXPECT_EQ(g.param(*g.findParam("model.layers.0.self_attn.q_proj.weight")).shape,
              (Shape{4 * 256, 64}));
    EXPECT_EQ(g.module(*g.findModule("model.layers.0.mlp.act_fn")).cls, "GELUTanh");
    EXPECT_EQ(g.param(*g.findParam("lm_head.weight")).name, "model.embed_tokens.weight");
    // Softcapping off: the root saves one vocabulary-sized tensor less per token (fp32).
    const ModelGraph off = fromText(R"({"model_type": "gemma2", "vocab_size": 1000,
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "final_logit_softcapping": null})");
    EXPECT_DOUBLE_EQ(
        g.modules()[0].cost.savedBytes.at(1, 10) - off.modules()[0].cost.savedBytes.at(1, 10),
        10 * 1000 * 4.0);
    auto withField = [&](const std::string& from, const std::string& to) {
        return loadErrorWith(g2, from, to);
    };
    EXPECT_EQ(withField("\"num_key_value_heads\": 2",
                        "\"num_key_value_heads\": 2, \"hidden_activation\": \"relu\""),
              "config.json:/hidden_activation: unsupported activation \"relu\" for Gemma "
              "(gelu_pytorch_tanh or gelu)");
    EXPECT_EQ(withField("\"num_key_value_heads\": 2",
                        "\"num_key_value_heads\": 2, \"final_logit_softcapping\": -1"),
              "config.json:/final_logit_softcapping: final_logit_softcapping must be positive");
    const std::string multimodal = loadErrorWith(g2, "\"gemma2\"", "\"gemma3\"");
    EXPECT_NE(multimodal.find("config.json:/model_type: a multimodal Gemma-3 config"),
              std::string::npos)
        << multimodal;
    const ModelGraph g3 = fromText(R"({"model_type": "gemma3_text", "vocab_size": 1000,
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})");
    EXPECT_EQ(g3.module(*g3.findModule("model")).cls, "Gemma3TextModel");
    EXPECT_EQ(g3.module(*g3.findModule("model.embed_tokens")).cls, "Gemma3TextScaledWordEmbedding");
    EXPECT_EQ(g3.module(*g3.findModule("model.layers.0.self_attn.k_norm")).cls, "Gemma3RMSNorm");
    EXPECT_TRUE(g3.findModule("model.rotary_emb_local").has_value());
}

// Falcon: the hub's n_head / n_layer / n_head_kv spellings, one norm or two, the fused
// query_key_value sized by multi_query or new_decoder_architecture, falcon-rw's sequential
// block with ALiBi, and what is refused.
TEST(HfConfig, FalconVariantsAndWhatIsRefused) {
    const std::string f40 = R"({"model_type": "falcon", "vocab_size": 100, "hidden_size": 64,
        "n_layer": 2, "n_head": 4, "n_head_kv": 2, "new_decoder_architecture": true,
        "parallel_attn": true, "alibi": false})";
    const ModelGraph g = fromText(f40);
    EXPECT_EQ(g.modules()[0].cls, "FalconForCausalLM");
    EXPECT_EQ(g.param(*g.findParam("transformer.h.1.self_attention.query_key_value.weight")).shape,
              (Shape{(2 * 2 + 4) * 16, 64}));
    EXPECT_TRUE(g.findModule("transformer.h.1.ln_mlp").has_value());
    EXPECT_FALSE(g.findModule("transformer.h.1.input_layernorm").has_value());
    EXPECT_EQ(g.param(*g.findParam("lm_head.weight")).name, "transformer.word_embeddings.weight");
    const ModelGraph f7 = fromText(R"({"model_type": "falcon", "vocab_size": 100,
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4})");
    EXPECT_EQ(
        f7.param(*f7.findParam("transformer.h.0.self_attention.query_key_value.weight")).shape,
        (Shape{64 + 2 * 16, 64}));  // multi-query by default: one key/value head
    EXPECT_TRUE(f7.findModule("transformer.h.0.input_layernorm").has_value());
    auto withField = [&](const std::string& from, const std::string& to) {
        return loadErrorWith(f40, from, to);
    };
    // falcon-rw: the sequential block (post_attention_layernorm registered before
    // input_layernorm) and ALiBi: one (b, heads, s, s) bias saved for all layers, no RoPE
    // cos/sin kept (python_saved_activations_peer checks both against autograd).
    const ModelGraph rw = fromText(R"({"model_type": "falcon", "vocab_size": 100,
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "multi_query": false, "parallel_attn": false, "alibi": true, "bias": true})");
    const ModuleNode& blk = rw.module(*rw.findModule("transformer.h.0"));
    ASSERT_EQ(blk.children.size(), 4u);
    EXPECT_EQ(rw.module(blk.children[2]).name, "post_attention_layernorm");
    EXPECT_EQ(rw.module(blk.children[3]).name, "input_layernorm");
    const ModuleCost& rot = rw.module(*rw.findModule("transformer.rotary_emb")).cost;
    EXPECT_EQ(rot.savedBytes.perToken, 0.0);
    EXPECT_EQ(rot.savedBytes.perTokenSeq, 4.0 * 4);  // heads x fp32
    EXPECT_TRUE(rw.findParam("transformer.h.1.mlp.dense_4h_to_h.bias").has_value());
    EXPECT_EQ(withField("\"n_head_kv\": 2", "\"n_head_kv\": 3"),
              "config.json:/n_head_kv: the number of key/value heads must divide the number of "
              "heads");
}

TEST(HfConfig, Gpt2Conv1DWeightsAreInputMajor) {
    const ModelGraph g = load("gpt2");
    EXPECT_EQ(g.param(*g.findParam("transformer.h.0.attn.c_attn.weight")).shape,
              (Shape{768, 2304}));
    EXPECT_EQ(g.param(*g.findParam("lm_head.weight")).name, "transformer.wte.weight");
}

TEST(HfConfig, LlamaFlopsAreTwoPerParameterPerTokenPlusAttention) {
    const ModelGraph g = load("llama3-8b");
    const ModuleCost c = g.subtreeCost(g.root());
    const int64_t b = 2, s = 4096;
    // Matmul FLOPs: 2·(params excluding the embedding lookup)·tokens; SDPA 4·b·H·s²·d per layer.
    const double matmul =
        2.0 * double(g.totalParams() - 128256LL * 4096 - 32 * 2 * 4096 - 4096) * b * s;
    const double attn = 32 * 4.0 * b * 32 * 128 * double(s) * s;
    EXPECT_NEAR(c.fwdFlops.at(b, s), matmul + attn, 1e-9 * (matmul + attn));
    // Backward: matmuls twice forward, flash attention 2.5x (torch.utils.flop_counter).
    EXPECT_NEAR(c.bwdFlops.at(b, s), 2 * matmul + 2.5 * attn, 1e-9 * (matmul + attn));
}

TEST(HfConfig, HonoursHeadDimBiasFlagsAndDtype) {
    HfLoadOptions o;
    o.paramDtype = DType::BFloat16;
    const ModelGraph g = fromText(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "attention_bias": true, "mlp_bias": true,
        "tie_word_embeddings": true})",
                                  o);
    EXPECT_EQ(g.param(*g.findParam("model.layers.0.self_attn.q_proj.weight")).shape,
              (Shape{128, 64}));
    EXPECT_EQ(g.param(*g.findParam("model.layers.0.self_attn.k_proj.weight")).shape,
              (Shape{64, 64}));
    EXPECT_TRUE(g.findParam("model.layers.0.self_attn.o_proj.bias").has_value());
    EXPECT_TRUE(g.findParam("model.layers.1.mlp.up_proj.bias").has_value());
    EXPECT_EQ(g.param(ParamId(0)).dtype, DType::BFloat16);
    EXPECT_EQ(g.totalParamBytes(), 2 * g.totalParams());
}

TEST(HfConfig, ErrorsNameTheField) {
    EXPECT_EQ(
        loadError(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 10,
        "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 3})"),
        "config.json:/hidden_size: hidden_size (10) is not divisible by num_attention_heads (3) "
        "and no head_dim is given");
    EXPECT_EQ(loadError(R"({"model_type": "llama", "vocab_size": "big"})"),
              "config.json:/vocab_size: expected an integer, got \"big\"");
    EXPECT_EQ(loadError(R"({"model_type": "llama", "vocab_size": 10})"),
              "config.json:/: missing required field \"hidden_size\"");
    EXPECT_NE(loadError(R"({"model_type": "bert"})").find("unsupported model_type \"bert\""),
              std::string::npos);
    EXPECT_EQ(loadError("{\"model_type\": \"llama\",\n  \"vocab_size\": }"),
              "config.json:2:17: invalid JSON: syntax error while parsing value - unexpected '}'; "
              "expected '[', '{', or a literal");
}

// The families added in 2026-12: what each refuses names the field and what was expected.
TEST(HfConfig, NewerFamiliesNameWhatTheyRefuse) {
    const std::string base = R"("vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2)";
    auto err = [&](const std::string& type, const std::string& extra) {
        return loadError("{\"model_type\": \"" + type + "\", " + base + extra + "}");
    };
    EXPECT_EQ(err("exaone4", R"(, "sliding_window_pattern": "LGLL")"),
              "config.json:/sliding_window_pattern: expected a period such as \"LLLG\" (sliding "
              "layers L, then one global G) or an integer");
    EXPECT_EQ(err("exaone4", R"(, "sliding_window_pattern": "LG")"), "");  // every other layer
    EXPECT_EQ(err("smollm3", R"(, "no_rope_layers": [1, 1, 0])"),
              "config.json:/no_rope_layers: no_rope_layers lists 3 layers, num_hidden_layers is 2");
    EXPECT_EQ(err("smollm3", R"(, "no_rope_layers": [1, 2])"),
              "config.json:/no_rope_layers/1: expected 1 (RoPE) or 0 (no RoPE)");
    EXPECT_EQ(err("seed_oss", R"(, "residual_dropout": 1.5)"),
              "config.json:/residual_dropout: a dropout probability must be in [0, 1)");
    EXPECT_EQ(err("granite", R"(, "logits_scaling": 0)"),
              "config.json:/logits_scaling: expected a positive number, got 0");
    EXPECT_EQ(err("olmo", R"(, "clip_qkv": -1)"),
              "config.json:/clip_qkv: expected a positive number, got -1");
    EXPECT_EQ(err("granitemoe", R"(, "num_local_experts": 0, "num_experts_per_tok": 1)"),
              "config.json:/num_local_experts: expected an integer >= 1, got 0");
    EXPECT_EQ(err("starcoder2", R"(, "hidden_act": "relu")"),
              "config.json:/hidden_act: unsupported activation \"relu\" for StarCoder2 "
              "(gelu_pytorch_tanh or gelu)");
    EXPECT_EQ(err("phi", R"(, "qk_layernorm": true)"),
              "config.json:/qk_layernorm: q/k LayerNorms are not modelled for Phi; export the "
              "model with scripts/export_model.py");
    EXPECT_EQ(err("phi", R"(, "partial_rotary_factor": 0)"),
              "config.json:/partial_rotary_factor: partial_rotary_factor must be in (0, 1]");
    EXPECT_EQ(err("gpt_neox", R"(, "rotary_pct": 2)"),
              "config.json:/rotary_pct: rotary_pct must be in (0, 1]");
    EXPECT_EQ(err("olmo3", R"(, "layer_types": ["sliding_attention", "linear_attention"])"),
              "config.json:/layer_types/1: unknown layer type \"linear_attention\" "
              "(sliding_attention or full_attention)");
    const std::string moe = R"(, "num_local_experts": 4, "num_experts_per_tok": 2)";
    EXPECT_EQ(err("gpt_oss", moe), "");
    EXPECT_EQ(err("gpt_oss", R"(, "num_local_experts": 4, "num_experts_per_tok": 5)"),
              "config.json:/num_experts_per_tok: num_experts_per_tok exceeds num_local_experts");
    EXPECT_EQ(err("gpt_oss", moe + R"(, "output_router_logits": true)"),
              "config.json:/output_router_logits: the router's auxiliary loss is not modelled; "
              "set output_router_logits to false or export the model with "
              "scripts/export_model.py");
    EXPECT_EQ(err("gpt_oss", moe + R"(, "layer_types": ["full_attention"])"),
              "config.json:/layer_types: layer_types lists 1 layers, num_hidden_layers is 2");
    EXPECT_EQ(err("llama4_text", moe), "");
    EXPECT_EQ(err("llama4_text", moe + R"(, "moe_layers": [0, 2])"),
              "config.json:/moe_layers/1: layer 2 does not exist (num_hidden_layers is 2)");
    EXPECT_EQ(err("llama4_text", moe + R"(, "no_rope_layers": [1, 1, 0])"),
              "config.json:/no_rope_layers: no_rope_layers lists 3 layers, num_hidden_layers is 2");
    EXPECT_EQ(err("llama4_text", moe + R"(, "layer_types": ["chunked_attention", "sliding"])"),
              "config.json:/layer_types/1: unknown layer type \"sliding\" (chunked_attention or "
              "full_attention)");
    EXPECT_EQ(err("llama4_text", moe + R"(, "hidden_act": "gelu")"),
              "config.json:/hidden_act: unsupported activation \"gelu\" for Llama 4 (silu)");
    EXPECT_EQ(err("llama4_text", moe + R"(, "output_router_logits": true)"),
              "config.json:/output_router_logits: the router's auxiliary loss is not modelled; "
              "set output_router_logits to false or export the model with "
              "scripts/export_model.py");
}

// Llama-4's text model: the MoE and dense layers, RoPE and NoPE layers and the chunked
// layers as Llama4TextConfig derives them from its defaults (transformers 4.57).
TEST(HfConfig, Llama4LayersFollowTheConfigsDefaults) {
    const std::string cfg = R"({"model_type": "llama4_text", "vocab_size": 64,
        "hidden_size": 32, "intermediate_size": 16, "intermediate_size_mlp": 48,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "num_local_experts": 4, "interleave_moe_layer_step": 2,
        "attention_chunk_size": 128})";
    auto g = modelFromHfConfig(nlohmann::json::parse(cfg), "config.json");
    ASSERT_TRUE(g) << g.error();
    EXPECT_EQ(g->module(g->root()).cls, "Llama4ForCausalLM");
    EXPECT_EQ(g->slidingWindow, 128);
    for (int i = 0; i < 4; ++i) {
        const std::string layer = "model.layers." + std::to_string(i);
        const auto ff = g->findModule(layer + ".feed_forward");
        ASSERT_TRUE(ff);
        // interleave_moe_layer_step 2: layers 1 and 3 are the MoE.
        EXPECT_EQ(g->module(*ff).cls, i % 2 ? "Llama4TextMoe" : "Llama4TextMLP") << i;
        // Every fourth layer has no RoPE, no q/k norm and no chunking.
        const bool rope = i != 3;
        EXPECT_EQ(g->findModule(layer + ".self_attn.qk_norm").has_value(), rope) << i;
        EXPECT_EQ(g->module(*g->findModule(layer + ".self_attn")).cost.windowAttentionCalls,
                  rope ? 1 : 0)
            << i;
    }
}

// Ernie-4.5-MoE: MoE layers from moe_layer_start_index on, the router's gate fp32 (and
// kept fp32 for plans) whatever the parameter dtype, moe_statics' correction bias frozen, each
// layer's fp32 cos and sin per sequence position; what the config refuses names the field.
TEST(HfConfig, ErnieMoeLayersFp32RouterAndRefusals) {
    const std::string cfg = R"({"model_type": "ernie4_5_moe", "vocab_size": 64,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "moe_num_experts": 4, "moe_k": 2,
        "moe_intermediate_size": 16, "moe_layer_start_index": 1, "moe_layer_interval": 1,
        "moe_layer_end_index": 2)";
    HfLoadOptions bf16;
    bf16.paramDtype = DType::BFloat16;
    const ModelGraph g = fromText(cfg + "}", bf16);
    EXPECT_EQ(g.module(g.root()).cls, "Ernie4_5_MoeForCausalLM");
    for (int i = 0; i < 4; ++i) {
        const std::string mlp = "model.layers." + std::to_string(i) + ".mlp";
        EXPECT_EQ(g.module(*g.findModule(mlp)).cls,
                  i == 1 || i == 2 ? "Ernie4_5_MoeSparseMoeBlock" : "Ernie4_5_MoeMLP")
            << i;
    }
    const auto gate = g.findModule("model.layers.1.mlp.gate");
    ASSERT_TRUE(gate);
    EXPECT_TRUE(g.module(*gate).keepFp32);
    EXPECT_EQ(g.param(*g.findParam("model.layers.1.mlp.gate.weight")).dtype, DType::Float32);
    EXPECT_EQ(g.param(*g.findParam("model.layers.0.mlp.up_proj.weight")).dtype, DType::BFloat16);
    const ParamInfo& bias =
        g.param(*g.findParam("model.layers.1.mlp.moe_statics.e_score_correction_bias"));
    EXPECT_EQ(bias.dtype, DType::Float32);
    EXPECT_FALSE(bias.requiresGrad);
    // Two shared experts by default: one SwiGLU of 2 x moe_intermediate_size, whose gate_proj
    // keeps the block's input; below fp32 the router keeps its own fp32 copy.
    EXPECT_EQ(g.param(*g.findParam("model.layers.1.mlp.shared_experts.up_proj.weight")).shape,
              (Shape{32, 32}));
    EXPECT_EQ(g.module(*g.findModule("model.layers.1.mlp")).cost.belowFp32SavedBytes,
              (ScaledCost{0, 0, 4 * 32}));
    // Each layer's cos and sin: two fp32 (s, head_dim) tensors, whatever the batch.
    const ScaledCost& saved = g.module(*g.findModule("model.layers.0.self_attn")).cost.savedBytes;
    EXPECT_EQ(saved.perPosition, 2 * 4 * 8);
    EXPECT_DOUBLE_EQ(saved.at(2, 100) - 2 * saved.at(1, 100), -2.0 * 4 * 8 * 100);
    // The flag and the fp32 copies survive the model JSON round trip.
    auto back = modelFromJson(modelToJson(g), "roundtrip.json");
    ASSERT_TRUE(back.ok()) << back.error();
    EXPECT_TRUE(back->module(*back->findModule("model.layers.1.mlp.gate")).keepFp32);
    EXPECT_EQ(modelToJson(*back), modelToJson(g));
    EXPECT_EQ(loadError(cfg + R"(, "moe_k": 5})"),
              "config.json:/moe_k: moe_k exceeds moe_num_experts");
    EXPECT_EQ(loadError(cfg + R"(, "moe_num_experts": [4, 4]})"),
              "config.json:/moe_num_experts: expected an integer, got an array");
    EXPECT_EQ(loadError(cfg + R"(, "moe_layer_end_index": -2})"),
              "config.json:/moe_layer_end_index: expected an integer >= -1, got -2");
}

// MPT as transformers builds it (ALiBi, eager attention, no biases, a 4 x d_model MLP): the
// config fields it would not follow are refused, naming them; the probabilities are kept in
// fp32 (fixed bytes a token a position) and below fp32 their cast as well.
TEST(HfConfig, MptEagerAlibiAttentionAndRefusals) {
    const ModelGraph g = load("mpt-7b");
    EXPECT_EQ(g.totalParams(), 6649286656);
    EXPECT_EQ(g.maxPositions, 2048);
    const ModuleCost& a = g.module(*g.findModule("transformer.blocks.0.attn")).cost;
    EXPECT_EQ(a.eagerAttentionCalls, 1);
    EXPECT_EQ(a.attentionCalls, 0);
    EXPECT_EQ(a.savedBytes.fixedPerTokenSeq, 4 * 32);
    EXPECT_EQ(a.belowFp32SavedBytes.perTokenSeq, 32 * 4);
    EXPECT_FALSE(g.findParam("transformer.blocks.0.norm_1.bias").has_value());
    auto back = modelFromJson(modelToJson(g), "roundtrip.json");
    ASSERT_TRUE(back.ok()) << back.error();
    EXPECT_EQ(modelToJson(*back), modelToJson(g));
    const std::string base = R"({"model_type": "mpt", "vocab_size": 64, "d_model": 32,
        "n_layers": 2, "n_heads": 4)";
    EXPECT_EQ(loadError(base + "}"), "");
    EXPECT_EQ(loadError(base + R"(, "expansion_ratio": 8})"),
              "config.json:/expansion_ratio: transformers' MPT builds its MLP 4 x d_model wide "
              "whatever expansion_ratio says; ShardScope models transformers' MptForCausalLM, so "
              "it must be 4 (export another implementation with scripts/export_model.py)");
    EXPECT_EQ(loadError(base + R"(, "attn_config": {"attn_pdrop": 0.1}})"),
              "config.json:/attn_config/attn_pdrop: dropout on MPT's eager attention "
              "probabilities (and its residuals, which transformers drops at the same rate) is "
              "not modelled; set it to 0, as MPT-7B's config does");
    EXPECT_EQ(loadError(base + R"(, "attn_config": {"qk_ln": true}})"),
              "config.json:/attn_config/qk_ln: transformers' MPT has no q/k LayerNorm; qk_ln "
              "must be false");
    EXPECT_EQ(loadError(base + R"(, "attn_config": {"clip_qkv": -2}})"),
              "config.json:/attn_config/clip_qkv: expected a positive number, got -2");
    EXPECT_EQ(loadError(base + R"(, "attn_config": 3})"),
              "config.json:/attn_config: expected an object, got 3");
}

// gpt-oss runs eager attention: no SDPA call, its two matmuls priced as GEMMs from the
// per-token-per-position FLOPs, its probabilities saved per token and position; the count
// survives the model JSON round trip.
TEST(HfConfig, GptOssEagerAttention) {
    const ModelGraph g = load("gpt-oss-20b");
    EXPECT_EQ(g.totalParams(), 20914757184);
    const ModuleCost& a = g.module(*g.findModule("model.layers.0.self_attn")).cost;
    EXPECT_EQ(a.attentionCalls, 0);
    EXPECT_EQ(a.eagerAttentionCalls, 1);
    EXPECT_EQ(a.fwdFlops.perTokenSeq, 4.0 * 64 * 64);
    EXPECT_EQ(a.savedBytes.perTokenSeq, 64.0 * 4);  // fp32 probabilities, one a head
    EXPECT_TRUE(g.findParam("model.layers.0.self_attn.sinks").has_value());
    EXPECT_TRUE(g.findParam("model.layers.23.mlp.experts.gate_up_proj").has_value());
    auto back = modelFromJson(modelToJson(g), "roundtrip.json");
    ASSERT_TRUE(back.ok()) << back.error();
    EXPECT_EQ(back->module(*back->findModule("model.layers.0.self_attn")).cost.eagerAttentionCalls,
              1);
    EXPECT_EQ(modelToJson(*back), modelToJson(g));
}

TEST(ModelJson, RoundTripsHfModelExactly) {
    const ModelGraph g = load("qwen2-0.5b");
    const nlohmann::json j = modelToJson(g);
    auto back = modelFromJson(j, "roundtrip.json");
    ASSERT_TRUE(back.ok()) << back.error();
    EXPECT_EQ(back->totalParams(), g.totalParams());
    EXPECT_EQ(back->moduleCount(), g.moduleCount());
    EXPECT_EQ(modelToJson(*back), j);
    // The embedding's input is its int64 token ids, a fixed 8 bytes per token.
    const auto embed = g.findModule("model.embed_tokens");
    ASSERT_TRUE(embed);
    EXPECT_EQ(g.module(*embed).cost.inputBytes, (ScaledCost{0, 0, 8}));
    EXPECT_EQ(back->module(*back->findModule("model.embed_tokens")).cost.inputBytes,
              (ScaledCost{0, 0, 8}));
    // What the step program adds once the compute dtype is known survives the round trip: an
    // RMSNorm's fp32 round trip over the hidden size, the loss's vocabulary.
    const auto norm = back->findModule("model.layers.0.input_layernorm");
    ASSERT_TRUE(norm);
    EXPECT_EQ(back->module(*norm).cost.upcastElems, 896);
    double vocab = 0;
    for (const auto& m : back->modules())
        vocab += m.cost.lossVocab;
    EXPECT_EQ(vocab, 151936);
}

TEST(ModelJson, TiedParameterAndErrors) {
    const std::string ok = R"({"format": "shardscope.model", "version": 1, "modules": [
        {"name": "", "class": "Net"},
        {"name": "emb", "class": "Embedding", "params": [{"name": "weight", "shape": [10, 4]}]},
        {"name": "head", "class": "Linear", "tied_params": [{"name": "weight", "same_as": "emb.weight"}]}]})";
    const ModelGraph g = fromText(ok);
    EXPECT_EQ(g.totalParams(), 40);
    EXPECT_TRUE(g.param(*g.findParam("head.weight")).tied());

    auto bad = [&](const std::string& from, const std::string& to) {
        std::string t = ok;
        t.replace(t.find(from), from.size(), to);
        return loadError(t);
    };
    EXPECT_EQ(
        bad("\"emb.weight\"", "\"emb.wieght\""),
        "model.json:/modules/2/tied_params/0/same_as: tied parameter refers to unknown parameter "
        "\"emb.wieght\" (did you mean \"emb.weight\"?)");
    EXPECT_EQ(bad("[10, 4]", "[10, -4]"),
              "model.json:/modules/1/params/0/shape/1: expected an integer >= 0, got -4");
    EXPECT_EQ(bad("\"name\": \"head\"", "\"name\": \"x.head\""),
              "model.json:/modules/2/name: parent module \"x\" must be listed before \"x.head\"");
    EXPECT_EQ(bad("\"class\": \"Linear\"", "\"class\": \"Linear\", \"clas\": 1"),
              "model.json:/modules/2/clas: unknown field \"clas\" (did you mean \"class\"?)");
    EXPECT_EQ(
        bad("\"class\": \"Linear\"",
            "\"class\": \"Linear\", \"cost\": {\"kernels\": {\"upcast_elems\": -1}}"),
        "model.json:/modules/2/cost/kernels/upcast_elems: expected elements per token, at least 0, "
        "got -1");
    EXPECT_EQ(bad("\"version\": 1", "\"version\": 7"),
              "model.json:/version: unsupported version 7 (this build reads 1..1)");
}

TEST(ModelGraph, SubtreeCountsCountTiedParametersOnce) {
    const ModelGraph g = load("gpt2");
    EXPECT_EQ(g.subtreeNumel(g.root()), 124439808);
    EXPECT_EQ(g.subtreeNumel(*g.findModule("lm_head")), 50257 * 768);  // owns the tied weight too
    EXPECT_EQ(g.subtreeNumel(*g.findModule("transformer")), 124439808);
}

TEST(JsonReader, RejectsDeepNestingBeforeParsing) {
    const std::string deep = std::string(10000, '[') + std::string(10000, ']');
    auto j = parseJsonText(deep, "deep.json");
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(j.error(), "deep.json: JSON nested deeper than 256 levels; refusing to read it");
}

// Found by fuzz_plan: nlohmann throws out_of_range (not parse_error) on 1e999, which
// escaped every loader as an internal error.
TEST(JsonReader, NumberBeyondDoubleIsAnErrorNamingItsPosition) {
    auto j = parseJsonText("{\n  \"world_size\": 9999999E9999\n}", "plan.json");
    ASSERT_FALSE(j.ok());
    EXPECT_EQ(j.error(),
              "plan.json:2:17: number out of range (9999999E9999): expected a finite number "
              "within +-1.8e308");
}

TEST(JsonReader, RefusesFoldersDevicesAndBinaryFilesFromTheirFirstBytes) {
    const auto dir = shardscope::test::testTempDir() / "shardscope_json_reader_test";
    std::filesystem::create_directories(dir);
    auto folder = readJsonFile(dir.string());
    ASSERT_FALSE(folder.ok());
    EXPECT_NE(folder.error().find("is a folder; expected a JSON file"), std::string::npos);

    // /dev/zero never ends: it must be refused from its first byte, not read until memory
    // runs out (model show -m /dev/zero grew to 4 GB first).
    if (std::filesystem::exists("/dev/zero")) {
        auto zero = readJsonFile("/dev/zero");
        ASSERT_FALSE(zero.ok());
        EXPECT_EQ(zero.error(),
                  "/dev/zero: not a JSON file: it starts with byte 0x00 where a JSON document "
                  "starts with '{' (a checkpoint or binary file given by mistake?)");
    }
    const auto zip = (dir / "model.pt").string();
    {
        std::ofstream out(zip, std::ios::binary);
        out << "PK\x03\x04" << std::string(1000, '\x01');
    }
    auto ckpt = readJsonFile(zip);
    ASSERT_FALSE(ckpt.ok());
    EXPECT_NE(ckpt.error().find("not a JSON file: it starts with 'P'"), std::string::npos);

    // A file of whitespace past the limit is refused at the limit; a BOM is allowed.
    const auto bom = (dir / "bom.json").string();
    {
        std::ofstream out(bom, std::ios::binary);
        out << "\xEF\xBB\xBF  {\"a\": 1}";
    }
    auto withBom = readJsonFile(bom);
    EXPECT_TRUE(withBom.ok()) << (withBom.ok() ? "" : withBom.error());
    std::filesystem::remove_all(dir);
}
