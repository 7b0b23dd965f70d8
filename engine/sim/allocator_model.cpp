// SPDX-License-Identifier: Apache-2.0
#include "engine/sim/allocator_model.h"

#include <algorithm>

namespace shardscope {

namespace {
constexpr int64_t kMinBlock = 512;
constexpr int64_t kSmallSize = 1 << 20;     // 1 MiB
constexpr int64_t kSmallBuffer = 2 << 20;   // 2 MiB
constexpr int64_t kLargeBuffer = 20 << 20;  // 20 MiB
constexpr int64_t kMinLargeAlloc = 10 << 20;
constexpr int64_t kRoundLarge = 2 << 20;
int64_t roundUp(int64_t v, int64_t m) {
    return (v + m - 1) / m * m;
}
}  // namespace

int64_t AllocatorModel::roundSize(int64_t bytes) {
    return bytes < kMinBlock ? kMinBlock : roundUp(bytes, kMinBlock);
}

void AllocatorModel::removeFree(int32_t b) {
    auto& pool = m_free[{m_blocks[b].stream, m_blocks[b].small}];
    auto range = pool.equal_range(m_blocks[b].size);
    for (auto it = range.first; it != range.second; ++it)
        if (it->second == b) {
            pool.erase(it);
            return;
        }
}

int64_t AllocatorModel::allocate(int64_t bytes, int stream) {
    if (bytes <= 0) return -1;
    const int64_t size = roundSize(bytes);
    m_allocated += size;
    if (m_expandable) {
        int64_t& used = m_streamUsed[stream];
        int64_t& high = m_streamHigh[stream];
        used += size;
        if (used > high) {
            const int64_t grown = roundUp(used, kRoundLarge);
            m_reserved += grown - roundUp(high, kRoundLarge);
            high = used;
        }
        m_blocks.push_back({size, 0, 0, -1, -1, false, false, stream});
        return static_cast<int64_t>(m_blocks.size() - 1);
    }
    const bool small = size <= kSmallSize;
    auto& pool = m_free[{stream, small}];
    auto it = pool.lower_bound(size);
    int32_t b;
    if (it != pool.end()) {
        b = it->second;
        pool.erase(it);
    } else {
        const int64_t seg = small                   ? kSmallBuffer
                            : size < kMinLargeAlloc ? kLargeBuffer
                                                    : roundUp(size, kRoundLarge);
        m_reserved += seg;
        m_blocks.push_back({seg, 0, m_segments++, -1, -1, true, small, stream});
        b = static_cast<int32_t>(m_blocks.size() - 1);
    }
    const int64_t remaining = m_blocks[b].size - size;
    if (small ? remaining >= kMinBlock : remaining > kSmallSize) {
        Block rest = m_blocks[b];
        rest.offset += size;
        rest.size = remaining;
        rest.prev = b;
        rest.free = true;
        m_blocks.push_back(rest);
        const int32_t r = static_cast<int32_t>(m_blocks.size() - 1);
        if (rest.next >= 0) m_blocks[rest.next].prev = r;
        m_blocks[b].next = r;
        m_blocks[b].size = size;
        pool.insert({remaining, r});
    }
    m_blocks[b].free = false;
    return b;
}

void AllocatorModel::free(int64_t handle) {
    if (handle < 0) return;
    int32_t b = static_cast<int32_t>(handle);
    m_allocated -= m_blocks[b].size;
    if (m_expandable) {
        m_streamUsed[m_blocks[b].stream] -= m_blocks[b].size;
        return;
    }
    m_blocks[b].free = true;
    // Merge with free neighbours in the same segment.
    for (int32_t nb : {m_blocks[b].prev, m_blocks[b].next}) {
        if (nb < 0 || !m_blocks[nb].free) continue;
        removeFree(nb);
        const int32_t lo = m_blocks[nb].offset < m_blocks[b].offset ? nb : b;
        const int32_t hi = lo == nb ? b : nb;
        m_blocks[lo].size += m_blocks[hi].size;
        m_blocks[lo].next = m_blocks[hi].next;
        if (m_blocks[hi].next >= 0) m_blocks[m_blocks[hi].next].prev = lo;
        b = lo;
    }
    m_free[{m_blocks[b].stream, m_blocks[b].small}].insert({m_blocks[b].size, b});
}

}  // namespace shardscope
