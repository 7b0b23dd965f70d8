// SPDX-License-Identifier: Apache-2.0
#pragma once
// Builds the module tree of a Hugging Face decoder-only model from its config.json, with
// the module names and classes `transformers` uses (model.layers.0.self_attn.q_proj) and
// parameter shapes exact enough that totals equal the published counts
// (Llama-3-8B 8,030,261,248; Mistral-7B-v0.1 7,241,732,096; GPT-2 124,439,808).
//
// Families: llama (Llama 2, 3, 3.1, 3.2), mistral, qwen2, qwen3, olmo2, mixtral, qwen2_moe,
// qwen3_moe, deepseek_v2 (DeepSeek-V2, V2-Lite), deepseek_v3 (DeepSeek-V3, Moonlight), phi3
// (Phi-3, Phi-4), gemma2 (Gemma-2), gemma3_text (Gemma-3 1B and the text model), falcon
// (Falcon-7B, -40B, -180B, Falcon2-11B: rotary, parallel attention), gpt2.
// Per-operator cost formulas and their assumptions are documented in plans/README.md
// ("Model costs") and next to each formula in hf_config.cpp.
#include <nlohmann/json.hpp>

#include <string>

#include "plans/core/dtype.h"
#include "plans/core/expected.h"
#include "plans/model/model_graph.h"

namespace shardscope {

struct HfLoadOptions {
    // dtype of the parameters as trained (FSDP keeps fp32 master parameters and casts with
    // MixedPrecisionPolicy), not the checkpoint's torch_dtype.
    DType paramDtype = DType::Float32;
    // dtype activations are counted in; the simulator rescales to the plan's param_dtype.
    DType activationDtype = DType::Float32;
};

[[nodiscard]] bool looksLikeHfConfig(const nlohmann::json& j);
// Whether a config's model_type has a native loader here (the families above).
[[nodiscard]] bool hfModelTypeSupported(const std::string& modelType);
[[nodiscard]] Expected<ModelGraph> modelFromHfConfig(const nlohmann::json& j,
                                                     const std::string& file,
                                                     const HfLoadOptions& options = {});

}  // namespace shardscope
