// SPDX-License-Identifier: Apache-2.0
#pragma once
// Distinct index types so a module index cannot be passed where a unit index is meant
// (after heaptrack's util/indices.h: C++ still has no opaque typedefs).
#include <cstdint>
#include <functional>

namespace shardscope {

template <typename Tag>
struct Id {
    int32_t value = -1;
    constexpr Id() = default;
    constexpr explicit Id(int32_t v) : value(v) {}
    [[nodiscard]] constexpr bool valid() const { return value >= 0; }
    [[nodiscard]] constexpr size_t index() const { return static_cast<size_t>(value); }
    friend constexpr bool operator==(Id a, Id b) { return a.value == b.value; }
    friend constexpr bool operator!=(Id a, Id b) { return a.value != b.value; }
    friend constexpr bool operator<(Id a, Id b) { return a.value < b.value; }
};

using ModuleId = Id<struct ModuleTag>;
using ParamId = Id<struct ParamTag>;
using UnitId = Id<struct UnitTag>;

}  // namespace shardscope

template <typename Tag>
struct std::hash<shardscope::Id<Tag>> {
    size_t operator()(shardscope::Id<Tag> id) const noexcept {
        return std::hash<int32_t>()(id.value);
    }
};
