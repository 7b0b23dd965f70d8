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
// std::lower_bound over [first, last) without branches on the comparisons (conditional
// moves): free lists hold tens of keys whose order the branch predictor cannot learn.
using KeyIt = std::vector<uint64_t>::iterator;
KeyIt lowerBound(KeyIt first, KeyIt last, uint64_t key) {
    const uint64_t* base = &*first;
    size_t n = static_cast<size_t>(last - first);
    if (n == 0) return first;
    while (n > 1) {
        const size_t half = n / 2;
        base = base[half] < key ? base + half : base;
        n -= half;
    }
    return first + ((base - &*first) + (*base < key));
}
}  // namespace

int64_t AllocatorModel::roundSize(int64_t bytes) {
    return bytes < kMinBlock ? kMinBlock : roundUp(bytes, kMinBlock);
}

void AllocatorModel::insertFree(FreeList& f, int64_t size, int32_t block) {
    const uint64_t key = freeKey(size, block);
    f.insert(lowerBound(f.begin(), f.end(), key), key);
}

void AllocatorModel::removeFree(int32_t b) {
    auto& f = pool(m_blocks[b].stream, m_blocks[b].small);
    const uint64_t key = freeKey(m_blocks[b].size, b);
    auto it = lowerBound(f.begin(), f.end(), key);
    if (it != f.end() && *it == key) f.erase(it);
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
    auto it = lowerBound(freeBlocks.begin(), freeBlocks.end(), freeKey(size, 0));
    int32_t b;
    const bool reused = it != freeBlocks.end();
    if (reused) {
        b = static_cast<int32_t>(*it & ((uint64_t{1} << kBlockBits) - 1));
    } else {
        const int64_t seg = small                   ? kSmallBuffer
                            : size < kMinLargeAlloc ? kLargeBuffer
                                                    : roundUp(size, kRoundLarge);
        m_reserved += seg;
        if (m_blocks.size() + 2 >= (size_t{1} << kBlockBits))
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
        if (reused) {
            // The remainder's key is below the taken block's: it takes the taken key's slot
            // with one shift of the keys in between, instead of an erase and an insert.
            const uint64_t key = freeKey(remaining, r);
            auto pos = lowerBound(freeBlocks.begin(), it, key);
            std::move_backward(pos, it, it + 1);
            *pos = key;
        } else {
            insertFree(freeBlocks, remaining, r);
        }
    } else if (reused) {
        freeBlocks.erase(it);
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
    if (m_expandable) {
        m_streamUsed[m_blocks[b].stream % kMaxStreams] -= m_blocks[b].size;
        return;
    }
    m_blocks[b].free = true;
    FreeList& f = pool(m_blocks[b].stream, m_blocks[b].small);
    // Merge with free neighbours in the same segment. The merged block takes over the
    // first neighbour's key (it only grows, so its key moves right).
    bool listed = false;
    uint64_t listedKey = 0;
    for (int32_t nb : {m_blocks[b].prev, m_blocks[b].next}) {
        if (nb < 0 || !m_blocks[nb].free) continue;
        if (!listed) {
            listed = true;
            listedKey = freeKey(m_blocks[nb].size, nb);
        } else {
            removeFree(nb);
        }
        const int32_t lo = m_blocks[nb].offset < m_blocks[b].offset ? nb : b;
        const int32_t hi = lo == nb ? b : nb;
        m_blocks[lo].size += m_blocks[hi].size;
        m_blocks[lo].next = m_blocks[hi].next;
        if (m_blocks[hi].next >= 0) m_blocks[m_blocks[hi].next].prev = lo;
        b = lo;
    }
    if (!listed) {
        insertFree(f, m_blocks[b].size, b);
        return;
    }
    const uint64_t key = freeKey(m_blocks[b].size, b);
    auto old = lowerBound(f.begin(), f.end(), listedKey);
    auto pos = lowerBound(old + 1, f.end(), key);
    std::move(old + 1, pos, old);
    *(pos - 1) = key;
}

}  // namespace shardscope
