// SPDX-License-Identifier: Apache-2.0
#include "engine/sim/allocator_model.h"

#include <algorithm>
#include <stdexcept>

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
// The first group of at least `size` bytes. A pool holds about ten sizes at a time, where a
// scan from the smallest beats halving (`shardscope bench simulate`); one of many sizes
// (hundreds of distinct remainders) is halved.
template <typename List>
auto firstFitting(List& f, int64_t size) {
    if (f.size() > 32)
        return std::lower_bound(f.begin(), f.end(), size,
                                [](const auto& g, int64_t s) { return g.size < s; });
    auto it = f.begin();
    while (it != f.end() && it->size < size)
        ++it;
    return it;
}
}  // namespace

void AllocatorModel::reset(bool expandableSegments) {
    m_expandable = expandableSegments;
    m_blocks.clear();
    for (FreeList& f : m_free) {
        for (const FreeGroup& g : f)
            if (g.list >= 0) {
                m_lists[static_cast<size_t>(g.list)].clear();
                m_spareLists.push_back(g.list);
            }
        f.clear();
    }
    std::fill(std::begin(m_streamHigh), std::end(m_streamHigh), 0);
    std::fill(std::begin(m_streamUsed), std::end(m_streamUsed), 0);
    m_segments = 0;
    m_reserved = 0;
    m_allocated = 0;
    m_capacity = 0;
    m_freedSinceRelease = true;
}

void AllocatorModel::releaseCachedSegments() {
    // A free block that is its whole segment (no neighbour either side) is a segment nothing
    // uses: cudaFree gives it back.
    for (FreeList& f : m_free) {
        for (size_t gi = 0; gi < f.size();) {
            FreeGroup& g = f[gi];
            const int64_t size = g.size;
            auto whole = [&](int32_t b) {
                return m_blocks[static_cast<size_t>(b)].prev < 0 &&
                       m_blocks[static_cast<size_t>(b)].next < 0;
            };
            if (g.list < 0) {
                if (whole(~g.list)) {
                    m_reserved -= size;
                    f.erase(f.begin() + static_cast<std::ptrdiff_t>(gi));
                    continue;
                }
            } else {
                auto& list = m_lists[static_cast<size_t>(g.list)];
                const size_t before = list.size();
                list.erase(std::remove_if(list.begin(), list.end(), whole), list.end());
                m_reserved -= size * static_cast<int64_t>(before - list.size());
                if (list.empty()) {
                    m_spareLists.push_back(g.list);
                    f.erase(f.begin() + static_cast<std::ptrdiff_t>(gi));
                    continue;
                }
                leaveOne(g);
            }
            ++gi;
        }
    }
}

int32_t AllocatorModel::takeList() {
    if (m_spareLists.empty()) {
        m_lists.emplace_back();
        return static_cast<int32_t>(m_lists.size() - 1);
    }
    const int32_t l = m_spareLists.back();
    m_spareLists.pop_back();
    return l;
}

void AllocatorModel::leaveOne(FreeGroup& g) {
    auto& b = m_lists[static_cast<size_t>(g.list)];
    if (b.size() != 1) return;
    m_spareLists.push_back(g.list);
    g.list = ~b.front();
    b.clear();
}

void AllocatorModel::insertFree(FreeList& f, int64_t size, int32_t block) {
    auto g = firstFitting(f, size);
    if (g == f.end() || g->size != size) {  // most free sizes are a remainder of their own
        f.insert(g, FreeGroup{size, ~block});
        return;
    }
    if (g->list < 0) {  // a second block of this size: the group gets a list
        const int32_t other = ~g->list;
        const int32_t l = takeList();
        auto& b = m_lists[static_cast<size_t>(l)];
        b.push_back(std::min(other, block));
        b.push_back(std::max(other, block));
        g->list = l;
        return;
    }
    auto& b = m_lists[static_cast<size_t>(g->list)];
    b.insert(std::upper_bound(b.begin(), b.end(), block), block);
}

void AllocatorModel::removeFree(FreeList& f, int64_t size, int32_t block) {
    const auto g = firstFitting(f, size);
    if (g == f.end() || g->size != size) return;
    if (g->list < 0) {
        if (~g->list == block) f.erase(g);
        return;
    }
    auto& b = m_lists[static_cast<size_t>(g->list)];
    const auto it = std::lower_bound(b.begin(), b.end(), block);
    if (it == b.end() || *it != block) return;
    b.erase(it);
    leaveOne(*g);
}

int64_t AllocatorModel::allocate(int64_t bytes, int stream) {
    if (bytes <= 0) return -1;
    const int64_t size = roundSize(bytes);
    if (m_expandable) {
        m_allocated += size;
        int64_t& used = m_streamUsed[stream % kMaxStreams];
        int64_t& high = m_streamHigh[stream % kMaxStreams];
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
    auto& freeBlocks = pool(stream, small);
    // Best fit: the smallest free block that is large enough (ties: the oldest block).
    const auto g = firstFitting(freeBlocks, size);
    int32_t b;
    if (g != freeBlocks.end() && g->list < 0) {
        b = ~g->list;
        freeBlocks.erase(g);
    } else if (g != freeBlocks.end()) {
        auto& list = m_lists[static_cast<size_t>(g->list)];
        b = list.front();
        list.erase(list.begin());
        leaveOne(*g);
    } else {
        const int64_t seg = small                   ? kSmallBuffer
                            : size < kMinLargeAlloc ? kLargeBuffer
                                                    : roundUp(size, kRoundLarge);
        // Past the capacity, what is cached and unused goes back; once that has been done,
        // only a free can give more back, and where even the allocated bytes leave no room
        // the device runs out whatever is given back.
        if (m_capacity > 0 && m_reserved + seg > m_capacity && m_freedSinceRelease &&
            m_allocated + seg <= m_capacity) {
            releaseCachedSegments();
            m_freedSinceRelease = false;
        }
        m_reserved += seg;
        if (m_blocks.size() + 2 >= (size_t{1} << 24))
            throw std::length_error("allocator model: more than 16M blocks");
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
        insertFree(freeBlocks, remaining, r);
    }
    m_blocks[b].free = false;
    // Allocated counts the block handed out, remainder included when it was not split off
    // (PyTorch's stats add block->size), as free() subtracts it.
    m_allocated += m_blocks[b].size;
    return b;
}

void AllocatorModel::free(int64_t handle) {
    if (handle < 0) return;
    int32_t b = static_cast<int32_t>(handle);
    m_allocated -= m_blocks[b].size;
    m_freedSinceRelease = true;
    if (m_expandable) {
        m_streamUsed[m_blocks[b].stream % kMaxStreams] -= m_blocks[b].size;
        return;
    }
    m_blocks[b].free = true;
    FreeList& f = pool(m_blocks[b].stream, m_blocks[b].small);
    // Merge with free neighbours in the same segment; the merged block is listed once.
    for (int32_t nb : {m_blocks[b].prev, m_blocks[b].next}) {
        if (nb < 0 || !m_blocks[nb].free) continue;
        removeFree(f, m_blocks[nb].size, nb);
        const int32_t lo = m_blocks[nb].offset < m_blocks[b].offset ? nb : b;
        const int32_t hi = lo == nb ? b : nb;
        m_blocks[lo].size += m_blocks[hi].size;
        m_blocks[lo].next = m_blocks[hi].next;
        if (m_blocks[hi].next >= 0) m_blocks[m_blocks[hi].next].prev = lo;
        b = lo;
    }
    insertFree(f, m_blocks[b].size, b);
}

}  // namespace shardscope
