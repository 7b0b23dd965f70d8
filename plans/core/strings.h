// SPDX-License-Identifier: Apache-2.0
#pragma once
// Small string helpers shared by loaders and the CLI: nearest-name suggestions for
// typos, human-readable byte and count formatting.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardscope {

// Levenshtein distance, O(|a|·|b|); used only on names, never in hot paths.
[[nodiscard]] size_t editDistance(std::string_view a, std::string_view b);

// The candidate closest to `name`, or "" when nothing is reasonably close
// (distance greater than max(2, |name|/3)).
[[nodiscard]] std::string nearestName(std::string_view name,
                                      const std::vector<std::string>& candidates);

// " (did you mean \"x\"?)" or "".
[[nodiscard]] std::string didYouMean(std::string_view name,
                                     const std::vector<std::string>& candidates);

// 1536 -> "1.50 KiB"; binary units because allocators and HBM sizes are binary.
[[nodiscard]] std::string formatBytes(int64_t bytes);
// 8030261248 -> "8.03B"; decimal units as model cards quote parameter counts.
[[nodiscard]] std::string formatCount(int64_t n);
// 8030261248 -> "8,030,261,248".
[[nodiscard]] std::string withThousands(int64_t n);

[[nodiscard]] bool startsWith(std::string_view s, std::string_view prefix);
[[nodiscard]] bool endsWith(std::string_view s, std::string_view suffix);
[[nodiscard]] std::vector<std::string> split(std::string_view s, char sep);
// ASCII lower case, and the string without leading and trailing blanks.
[[nodiscard]] std::string toLower(std::string_view s);
[[nodiscard]] std::string trim(std::string_view s);

}  // namespace shardscope
