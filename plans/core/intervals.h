// SPDX-License-Identifier: Apache-2.0
#pragma once
// Interval arithmetic on [start, end) nanosecond ranges, shared by the simulator's
// exposure figures and the trace analysis (HTA's overlap): merge to a sorted union, its
// total length, and the length two unions share.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace shardscope {

using Interval = std::pair<int64_t, int64_t>;

// The union of `sorted` (ordered by start) into `out`: disjoint, empty intervals dropped.
// `out`'s storage is reused (the simulator's loops keep theirs).
inline void unionOfSorted(const std::vector<Interval>& sorted, std::vector<Interval>& out) {
    out.clear();
    for (const auto& iv : sorted) {
        if (iv.second <= iv.first) continue;
        if (!out.empty() && iv.first <= out.back().second)
            out.back().second = std::max(out.back().second, iv.second);
        else
            out.push_back(iv);
    }
}

// Sorted, disjoint union; empty intervals dropped. Already-sorted input (one stream) skips the
// sort.
[[nodiscard]] inline std::vector<Interval> mergeIntervals(std::vector<Interval> v) {
    if (!std::is_sorted(v.begin(), v.end())) std::sort(v.begin(), v.end());
    std::vector<Interval> out;
    out.reserve(v.size());
    unionOfSorted(v, out);
    return out;
}

[[nodiscard]] inline int64_t totalLength(const std::vector<Interval>& u) {
    int64_t n = 0;
    for (const auto& iv : u)
        n += iv.second - iv.first;
    return n;
}

// |a ∩ b| for two merged unions.
[[nodiscard]] inline int64_t intersectionLength(const std::vector<Interval>& a,
                                                const std::vector<Interval>& b) {
    int64_t n = 0;
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        const int64_t lo = std::max(a[i].first, b[j].first),
                      hi = std::min(a[i].second, b[j].second);
        if (hi > lo) n += hi - lo;
        (a[i].second < b[j].second ? i : j)++;
    }
    return n;
}

}  // namespace shardscope
