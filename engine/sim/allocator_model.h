// SPDX-License-Identifier: Apache-2.0
#pragma once
// A model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp), enough
// to turn allocations into reserved bytes: sizes rounded to 512 B; the small pool
// (<= 1 MiB, carved from 2 MiB segments) and the large pool (1-10 MiB requests get 20 MiB
// segments, larger ones their size rounded to 2 MiB); one pool per stream (memory freed
// on one stream is not reused by another); best-fit reuse of cached free blocks with
// splitting (small: remainder >= 512 B; large: remainder > 1 MiB) and merging of adjacent
// free blocks. Segments are returned only where the device would run out: with a capacity
// set, a new segment that would pass it first releases every cached segment with nothing
// allocated in it, as the allocator's cudaMalloc retry does (release_cached_blocks; PyTorch
// tries the request's own pool first, which this does not tell apart). With expandable
// segments, each stream grows one segment in 2 MiB pages, so reserved tracks the high-water
// mark.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace shardscope {

class AllocatorModel {
public:
    explicit AllocatorModel(bool expandableSegments = false) : m_expandable(expandableSegments) {}
    // Returns a handle for free().
    int64_t allocate(int64_t bytes, int stream);
    void free(int64_t handle);
    void reserve(size_t blocks) { m_blocks.reserve(blocks); }
    // Empty again, keeping the storage (a search simulates thousands of steps in a row);
    // no capacity.
    void reset(bool expandableSegments);
    // The device memory the caching allocator may reserve (0: unlimited): reaching it frees
    // the cached segments nothing uses before a new one is reserved.
    void setCapacity(int64_t bytes) { m_capacity = bytes; }
    [[nodiscard]] int64_t reserved() const { return m_reserved; }
    [[nodiscard]] int64_t allocated() const { return m_allocated; }
    // Requests round up to 512 bytes (kMinBlockSize).
    [[nodiscard]] static int64_t roundSize(int64_t bytes) {
        return bytes < 512 ? 512 : (bytes + 511) / 512 * 512;
    }

private:
    struct Block {
        int64_t size = 0;
        int64_t offset = 0;
        int32_t segment = 0;
        int32_t prev = -1, next = -1;
        bool free = false;
        bool small = false;
        int stream = 0;
    };
    static constexpr int kMaxStreams = 16;
    bool m_expandable;
    std::vector<Block> m_blocks;
    // Free blocks per (stream, small pool), indexed stream * 2 + small: groups of one size,
    // by size, each holding its blocks by index (best fit takes the smallest size that fits,
    // then its oldest block). A step's large pool holds about a hundred free blocks of ten
    // sizes (80-block Llama-3-70B plan): a search looks at the sizes, not at every block.
    // A group is a size and its blocks' list, kept apart (m_lists) so that inserting a
    // group moves 16 plain bytes per group after it.
    // Most free sizes are held by one block (a split's remainder): such a group names its
    // block itself, and only a size held by two or more gets a list.
    struct FreeGroup {
        int64_t size = 0;
        // >= 0: index into m_lists, the blocks ascending; < 0: the one block, ~list
        int32_t list = 0;
    };
    using FreeList = std::vector<FreeGroup>;
    FreeList m_free[2 * kMaxStreams];
    std::vector<std::vector<int32_t>> m_lists;
    std::vector<int32_t> m_spareLists;  // lists of emptied groups, reused
    int32_t takeList();
    void leaveOne(FreeGroup& g);  // a list down to one block: back to naming it
    int64_t m_streamHigh[kMaxStreams] = {}, m_streamUsed[kMaxStreams] = {};  // expandable segments
    FreeList& pool(int stream, bool small) { return m_free[2 * (stream % kMaxStreams) + small]; }
    void insertFree(FreeList& f, int64_t size, int32_t block);
    void removeFree(FreeList& f, int64_t size, int32_t block);
    void releaseCachedSegments();
    int32_t m_segments = 0;
    int64_t m_reserved = 0, m_allocated = 0, m_capacity = 0;
    bool m_freedSinceRelease = true;
};

}  // namespace shardscope
