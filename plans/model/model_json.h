// SPDX-License-Identifier: Apache-2.0
#pragma once
// ShardScope model JSON ("format": "shardscope.model", "version": 1), documented in
// plans/README.md, written by scripts/export_model.py for any torch.nn.Module, and the
// loader that accepts it or a Hugging Face config.json (sniffed by "model_type").
#include <nlohmann/json.hpp>

#include <string>

#include "plans/core/expected.h"
#include "plans/model/hf_config.h"
#include "plans/model/model_graph.h"

namespace shardscope {

inline constexpr const char* kModelFormat = "shardscope.model";
inline constexpr int kModelVersion = 1;

[[nodiscard]] Expected<ModelGraph> modelFromJson(const nlohmann::json& j, const std::string& file);
[[nodiscard]] nlohmann::json modelToJson(const ModelGraph& g);

// Reads a model file of either kind. `hf` applies only to Hugging Face configs.
[[nodiscard]] Expected<ModelGraph> loadModelFile(const std::string& path,
                                                 const HfLoadOptions& hf = {});
// The same for a document already read from `path`.
[[nodiscard]] Expected<ModelGraph> modelFromDocument(const nlohmann::json& j,
                                                     const std::string& path,
                                                     const HfLoadOptions& hf = {});

}  // namespace shardscope
