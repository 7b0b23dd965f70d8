// SPDX-License-Identifier: Apache-2.0
#include "profiler/analysis/peer_wait.h"

#include <algorithm>
#include <climits>
#include <map>
#include <utility>

namespace shardscope {

PeerWaits peerWaits(const std::vector<std::vector<PeerSpan>>& spans) {
    PeerWaits out;
    const size_t n = spans.size();
    out.clockOffsetNs.assign(n, 0);
    out.waitNs.resize(n);
    for (size_t r = 0; r < n; ++r)
        out.waitNs[r].assign(spans[r].size(), -1);
    if (n < 2) return out;
    // (key, its order among equal keys) -> index, per rank.
    std::vector<std::map<std::pair<std::string, int32_t>, int32_t>> index(n);
    for (size_t r = 0; r < n; ++r) {
        std::map<std::string, int32_t> seen;
        for (size_t i = 0; i < spans[r].size(); ++i)
            index[r][{spans[r][i].key, seen[spans[r][i].key]++}] = static_cast<int32_t>(i);
    }
    std::vector<std::vector<int32_t>> rows;  // per matched collective, its index on each rank
    for (const auto& [key, i0] : index[0]) {
        std::vector<int32_t> row{i0};
        for (size_t r = 1; r < n; ++r) {
            const auto it = index[r].find(key);
            if (it == index[r].end()) break;
            row.push_back(it->second);
        }
        if (row.size() == n) rows.push_back(std::move(row));
    }
    out.matched = static_cast<int64_t>(rows.size());
    if (rows.empty()) return out;
    auto at = [&](size_t r, int32_t i) -> const PeerSpan& {
        return spans[r][static_cast<size_t>(i)];
    };
    for (size_t r = 1; r < n; ++r) {
        std::vector<int64_t> d;
        d.reserve(rows.size());
        for (const auto& row : rows)
            d.push_back(at(r, row[r]).endNs - at(0, row[0]).endNs);
        const auto mid = d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2);
        std::nth_element(d.begin(), mid, d.end());
        out.clockOffsetNs[r] = *mid;
    }
    for (const auto& row : rows) {
        int64_t last = INT64_MIN;
        for (size_t r = 0; r < n; ++r)
            last = std::max(last, at(r, row[r]).startNs - out.clockOffsetNs[r]);
        for (size_t r = 0; r < n; ++r) {
            const PeerSpan& s = at(r, row[r]);
            out.waitNs[r][static_cast<size_t>(row[r])] =
                std::clamp<int64_t>(last + out.clockOffsetNs[r] - s.startNs, 0,
                                    std::max<int64_t>(0, s.endNs - s.startNs));
        }
    }
    return out;
}

}  // namespace shardscope
