// SPDX-License-Identifier: Apache-2.0
#pragma once
// Builds the module tree of a Hugging Face decoder-only model from its config.json, with
// the module names and classes `transformers` uses (model.layers.0.self_attn.q_proj) and
// parameter shapes exact enough that totals equal the published counts
// (Llama-3-8B 8,030,261,248; Mistral-7B-v0.1 7,241,732,096; GPT-2 124,439,808).
//
// Families: hfFamilies() below (`shardscope model families` prints them).
// Per-operator cost formulas and their assumptions are documented in plans/README.md
// ("Model costs") and next to each formula in hf_config.cpp.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

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

// A natively loaded family: its config.json model_type, transformers' class and the
// published models it covers.
struct HfFamily {
    const char* modelType;
    const char* causalLm;
    const char* models;
};
[[nodiscard]] const std::vector<HfFamily>& hfFamilies();

[[nodiscard]] bool looksLikeHfConfig(const nlohmann::json& j);
// Whether a config's model_type has a native loader here (the families above).
[[nodiscard]] bool hfModelTypeSupported(const std::string& modelType);
[[nodiscard]] Expected<ModelGraph> modelFromHfConfig(const nlohmann::json& j,
                                                     const std::string& file,
                                                     const HfLoadOptions& options = {});

}  // namespace shardscope
