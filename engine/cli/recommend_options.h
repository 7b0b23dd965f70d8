// SPDX-License-Identifier: Apache-2.0
#pragma once
// The search options `recommend` reads from the user: --fix and --allow.
#include <string>

#include "engine/search/search.h"
#include "plans/core/expected.h"

namespace shardscope::cli {

// --fix KEY=VALUE[,KEY=VALUE...]: reduce_dtype, api, activation_checkpointing, micro_batch.
// What --fix said besides what it set in the search options.
struct FixedChoices {
    bool fsdp1 = false;        // api=fsdp1: the search keeps to what FSDP1 expresses
    bool reduceDtype = false;  // reduce_dtype was given (the --current plan's is not taken)
};
// An error names the item.
[[nodiscard]] Status applyFixes(const std::string& text, SearchOptions& o, FixedChoices& fixed);

// --allow compile,float8: the options the search may also try (FSDP2 only).
[[nodiscard]] Status applyAllow(const std::string& text, SearchOptions& o);

}  // namespace shardscope::cli
