// SPDX-License-Identifier: Apache-2.0
#pragma once
// The search options `recommend` reads from the user: --fix and --allow.
#include <string>

#include "engine/search/search.h"
#include "plans/core/expected.h"

namespace shardscope::cli {

// --fix KEY=VALUE[,KEY=VALUE...]: reduce_dtype, api, activation_checkpointing, micro_batch.
// `fsdp1` is set when the user fixed the API to FSDP1. An error names the item.
[[nodiscard]] Status applyFixes(const std::string& text, SearchOptions& o, bool& fsdp1);

// --allow compile,float8: the options the search may also try (FSDP2 only).
[[nodiscard]] Status applyAllow(const std::string& text, SearchOptions& o);

}  // namespace shardscope::cli
