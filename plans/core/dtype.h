// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tensor element types as PyTorch names them. Parsing accepts the spellings users write in
// configs ("bf16", "torch.bfloat16", "bfloat16"); printing uses PyTorch's canonical name.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardscope {

enum class DType : uint8_t {
    Float32,
    Float16,
    BFloat16,
    Float64,
    Float8E4M3,
    Float8E5M2,
    Int64,
    Int32,
    Int8,
    UInt8,
    Bool,
};

// Bytes per element: a table indexed by the enum (the program build asks for it per op);
// dtype.cpp checks it against the names' table.
[[nodiscard]] constexpr int64_t dtypeSize(DType d) {
    constexpr int64_t kSize[] = {4, 2, 2, 8, 1, 1, 8, 4, 1, 1, 1};
    const auto i = static_cast<size_t>(d);
    return i < sizeof kSize / sizeof kSize[0] ? kSize[i] : 4;
}
[[nodiscard]] std::string_view dtypeName(DType d);  // "float32", "bfloat16", ...
[[nodiscard]] std::optional<DType> parseDType(std::string_view s);
[[nodiscard]] bool isFloating(DType d);
// Canonical names and accepted aliases, for "did you mean" suggestions.
[[nodiscard]] std::vector<std::string> dtypeNames();

}  // namespace shardscope
