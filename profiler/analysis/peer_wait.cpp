// SPDX-License-Identifier: Apache-2.0
#include "profiler/analysis/peer_wait.h"

#include <algorithm>
#include <climits>
#include <map>
#include <utility>

namespace shardscope {

namespace {

// One group's matched collectives: per member, the index of the collective in its spans.
std::vector<std::vector<int32_t>> matchedRows(const std::vector<std::vector<PeerSpan>>& spans,
                                              const std::vector<int32_t>& members, int32_t group) {
    // (key, its order among equal keys) -> index, per member.
    std::vector<std::map<std::pair<std::string, int32_t>, int32_t>> index(members.size());
    for (size_t m = 0; m < members.size(); ++m) {
        std::map<std::string, int32_t> seen;
        const auto& s = spans[static_cast<size_t>(members[m])];
        for (size_t i = 0; i < s.size(); ++i)
            if (s[i].group == group)
                index[m][{s[i].key, seen[s[i].key]++}] = static_cast<int32_t>(i);
    }
    std::vector<std::vector<int32_t>> rows;
    for (const auto& [key, i0] : index[0]) {
        std::vector<int32_t> row{i0};
        for (size_t m = 1; m < members.size(); ++m) {
            const auto it = index[m].find(key);
            if (it == index[m].end()) break;
            row.push_back(it->second);
        }
        if (row.size() == members.size()) rows.push_back(std::move(row));
    }
    return rows;
}

}  // namespace

PeerWaits peerWaits(const std::vector<std::vector<PeerSpan>>& spans,
                    const std::vector<std::vector<int32_t>>& groups) {
    PeerWaits out;
    const size_t n = spans.size();
    out.clockOffsetNs.assign(n, 0);
    out.waitNs.resize(n);
    for (size_t r = 0; r < n; ++r)
        out.waitNs[r].assign(spans[r].size(), -1);
    if (n < 2) return out;
    std::vector<int32_t> everyone(n);
    for (size_t r = 0; r < n; ++r)
        everyone[r] = static_cast<int32_t>(r);
    // Each group's members and their clock offsets against its first member.
    std::vector<std::pair<const std::vector<int32_t>*, std::vector<int64_t>>> offsets;
    for (int32_t g = -1; g < static_cast<int32_t>(groups.size()); ++g) {
        const std::vector<int32_t>& members = g < 0 ? everyone : groups[static_cast<size_t>(g)];
        if (members.size() < 2) continue;
        const auto rows = matchedRows(spans, members, g);
        if (rows.empty()) continue;
        out.matched += static_cast<int64_t>(rows.size());
        auto at = [&](size_t m, int32_t i) -> const PeerSpan& {
            return spans[static_cast<size_t>(members[m])][static_cast<size_t>(i)];
        };
        std::vector<int64_t> off(members.size(), 0);
        for (size_t m = 1; m < members.size(); ++m) {
            std::vector<int64_t> d;
            d.reserve(rows.size());
            for (const auto& row : rows)
                d.push_back(at(m, row[m]).endNs - at(0, row[0]).endNs);
            const auto mid = d.begin() + static_cast<std::ptrdiff_t>(d.size() / 2);
            std::nth_element(d.begin(), mid, d.end());
            off[m] = *mid;
        }
        for (const auto& row : rows) {
            int64_t last = INT64_MIN;
            for (size_t m = 0; m < members.size(); ++m)
                last = std::max(last, at(m, row[m]).startNs - off[m]);
            for (size_t m = 0; m < members.size(); ++m) {
                const PeerSpan& s = at(m, row[m]);
                out.waitNs[static_cast<size_t>(members[m])][static_cast<size_t>(row[m])] =
                    std::clamp<int64_t>(last + off[m] - s.startNs, 0,
                                        std::max<int64_t>(0, s.endNs - s.startNs));
            }
        }
        offsets.emplace_back(&members, std::move(off));
    }
    // The offsets against the first rank, chained through the groups (HSDP: rank 3 through
    // its shard group with 2, rank 2 through its replicate group with 0).
    std::vector<bool> known(n, false);
    known[0] = true;
    for (bool changed = true; changed;) {
        changed = false;
        for (const auto& [members, off] : offsets) {
            size_t anchor = members->size();
            for (size_t m = 0; m < members->size() && anchor == members->size(); ++m)
                if (known[static_cast<size_t>((*members)[m])]) anchor = m;
            if (anchor == members->size()) continue;
            const int64_t base =
                out.clockOffsetNs[static_cast<size_t>((*members)[anchor])] - off[anchor];
            for (size_t m = 0; m < members->size(); ++m) {
                const auto r = static_cast<size_t>((*members)[m]);
                if (known[r]) continue;
                out.clockOffsetNs[r] = base + off[m];
                known[r] = changed = true;
            }
        }
    }
    return out;
}

}  // namespace shardscope
