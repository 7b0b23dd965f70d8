// SPDX-License-Identifier: Apache-2.0
#pragma once
// Outputs are written to a temporary file beside the target and renamed into place, so an
// interrupted run never leaves a truncated file where a good one was.
#include <string>
#include <string_view>

#include "plans/core/expected.h"

namespace shardscope {

[[nodiscard]] Status writeFileAtomically(const std::string& path, std::string_view contents);

}  // namespace shardscope
