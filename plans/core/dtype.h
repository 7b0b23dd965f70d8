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

[[nodiscard]] int64_t dtypeSize(DType d);
[[nodiscard]] std::string_view dtypeName(DType d);  // "float32", "bfloat16", ...
[[nodiscard]] std::optional<DType> parseDType(std::string_view s);
[[nodiscard]] bool isFloating(DType d);
// Canonical names and accepted aliases, for "did you mean" suggestions.
[[nodiscard]] std::vector<std::string> dtypeNames();

}  // namespace shardscope
