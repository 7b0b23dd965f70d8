// SPDX-License-Identifier: Apache-2.0
#pragma once
// A Llama-style decoder (embedding, RMSNorm, attention with RoPE and grouped-query heads,
// SwiGLU MLP, LM head, tied or not) computed with ATen from the parameters the FSDP
// runtime hands out, module by module, with the module names transformers uses, so any
// wrap plan over the model graph of the same config runs. Math follows transformers'
// modeling_llama.py (LlamaRMSNorm, rotate_half, repeat_kv, causal LM loss with shifted
// labels); tests/python/test_engine_llama.py checks the losses against transformers.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <string>

#include "engine/exec/fsdp_runtime.h"
#include "plans/model/model_graph.h"

namespace shardscope::exec {

struct LlamaConfig {
    int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kvHeads = 0,
            headDim = 0;
    double eps = 1e-6, theta = 10000.0;
    bool tied = false;
};

// Reads the hyper-parameters from a Hugging Face config.json (llama, mistral, qwen2);
// throws naming the file and field when one is missing or of the wrong type.
LlamaConfig llamaConfigFromHf(const nlohmann::json& j, const std::string& file);

class LlamaModel {
public:
    LlamaModel(LlamaConfig c, const ModelGraph& g, FsdpRuntime& rt);
    // Mean next-token cross-entropy of a [batch, seq] int64 token tensor.
    at::Tensor loss(const at::Tensor& tokens);

private:
    struct Layer {
        ModuleId module, inNorm, postNorm, attn, mlp, q, k, v, o, gate, up, down;
        ParamId inNormW, postNormW, qW, kW, vW, oW, gateW, upW, downW;
        ParamId qB, kB, vB;    // qwen2's attention biases (invalid when absent)
        bool sliding = false;  // a sliding-window layer (the model graph's window rules)
    };
    LlamaConfig c;
    const ModelGraph& g;
    FsdpRuntime& rt;
    ModuleId model, embed, norm, head;
    ParamId embedW, normW, headW;
    std::vector<Layer> layers;
    at::Tensor cos, sin;

    ModuleId mod(const std::string& name) const;
    ParamId par(const std::string& name, bool required = true) const;
    at::Tensor linear(ModuleId m, ParamId w, ParamId b, const at::Tensor& x);
    at::Tensor rmsNorm(ModuleId m, ParamId w, const at::Tensor& x);
    at::Tensor attention(const Layer& l, const at::Tensor& h);
    at::Tensor layer(const Layer& l, const at::Tensor& x);
};

}  // namespace shardscope::exec
