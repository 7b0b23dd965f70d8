// SPDX-License-Identifier: Apache-2.0
#include "plans/core/dtype.h"

#include <array>

namespace shardscope {

namespace {
struct DTypeInfo {
    DType type;
    std::string_view name;
    int64_t size;
    std::array<std::string_view, 3> aliases;
};
constexpr DTypeInfo kTypes[] = {
    {DType::Float32, "float32", 4, {"fp32", "float", "f32"}},
    {DType::Float16, "float16", 2, {"fp16", "half", "f16"}},
    {DType::BFloat16, "bfloat16", 2, {"bf16", "", ""}},
    {DType::Float64, "float64", 8, {"fp64", "double", ""}},
    {DType::Float8E4M3, "float8_e4m3fn", 1, {"fp8_e4m3", "", ""}},
    {DType::Float8E5M2, "float8_e5m2", 1, {"fp8_e5m2", "", ""}},
    {DType::Int64, "int64", 8, {"long", "", ""}},
    {DType::Int32, "int32", 4, {"int", "", ""}},
    {DType::Int8, "int8", 1, {"", "", ""}},
    {DType::UInt8, "uint8", 1, {"", "", ""}},
    {DType::Bool, "bool", 1, {"", "", ""}},
};
const DTypeInfo& info(DType d) {
    for (const auto& t : kTypes)
        if (t.type == d) return t;
    return kTypes[0];
}
}  // namespace

constexpr bool sizesAgree() {
    for (const auto& t : kTypes)
        if (dtypeSize(t.type) != t.size) return false;
    return true;
}
static_assert(sizesAgree(), "dtypeSize's table follows the enum's order");

std::string_view dtypeName(DType d) {
    return info(d).name;
}

std::optional<DType> parseDType(std::string_view s) {
    if (s.substr(0, 6) == "torch.") s.remove_prefix(6);
    for (const auto& t : kTypes) {
        if (s == t.name) return t.type;
        for (auto a : t.aliases)
            if (!a.empty() && s == a) return t.type;
    }
    return std::nullopt;
}

bool isFloating(DType d) {
    switch (d) {
        case DType::Float32:
        case DType::Float16:
        case DType::BFloat16:
        case DType::Float64:
        case DType::Float8E4M3:
        case DType::Float8E5M2:
            return true;
        default:
            return false;
    }
}

std::vector<std::string> dtypeNames() {
    std::vector<std::string> out;
    for (const auto& t : kTypes) {
        out.emplace_back(t.name);
        for (auto a : t.aliases)
            if (!a.empty()) out.emplace_back(a);
    }
    return out;
}

}  // namespace shardscope
