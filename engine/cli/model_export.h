// SPDX-License-Identifier: Apache-2.0
#pragma once
// A Hugging Face config.json whose model_type has no native loader becomes a ShardScope
// model JSON through scripts/export_model.py (transformers builds the model, the exporter
// counts its parameters, FLOPs and saved activations), cached by the config's content so
// that the next command loads it at once.
#include <string>

#include "plans/core/dtype.h"
#include "plans/core/expected.h"

namespace shardscope::cli {

// Where exported models are kept: $SHARDSCOPE_CACHE, else $XDG_CACHE_HOME/shardscope, else
// ~/.cache/shardscope; under it models/<hash>.json.
[[nodiscard]] std::string modelCacheDir();

// The model JSON for `configPath` (model_type `modelType`) at parameter dtype `dtype`:
// the cached one when the config, the dtype and the exporter are unchanged, else exported
// now with the set-up script's Python (SHARDSCOPE_PYTHON overrides), its messages on
// stderr. An error names the config and what to do.
[[nodiscard]] Expected<std::string> exportedModelPath(const std::string& configPath,
                                                      const std::string& modelType, DType dtype);

}  // namespace shardscope::cli
