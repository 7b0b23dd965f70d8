// SPDX-License-Identifier: Apache-2.0
// peerWaits (profiler/analysis/peer_wait.h): the wait of each rank for the last of its peers,
// on clocks that disagree. The real-run check (a straggler made on purpose in a 2-rank
// PyTorch FSDP2 job) is tests/python/test_fsdp_traces.py::PeerWait.
#include <gtest/gtest.h>

#include "profiler/analysis/peer_wait.h"

namespace shardscope {
namespace {

TEST(PeerWait, TheEarlyRankWaitsForTheLateOneWhateverTheClocks) {
    // Three collectives; rank 1's clock runs 1,000,000 ns ahead of rank 0's. Rank 1 starts
    // the second one 300 ns late (in true time); every collective ends together.
    const int64_t off = 1'000'000;
    std::vector<std::vector<PeerSpan>> s(2);
    s[0] = {{"ag|a", 0, 100}, {"ag|b", 200, 900}, {"rs|a", 1000, 1100}};
    s[1] = {{"ag|a", off + 10, off + 100},
            {"ag|b", off + 500, off + 900},
            {"rs|a", off + 1000, off + 1100}};
    const PeerWaits w = peerWaits(s);
    EXPECT_EQ(w.matched, 3);
    EXPECT_EQ(w.clockOffsetNs[1], off);
    EXPECT_EQ(w.waitNs[0], (std::vector<int64_t>{10, 300, 0}));
    EXPECT_EQ(w.waitNs[1], (std::vector<int64_t>{0, 0, 0}));
}

TEST(PeerWait, EqualKeysMatchInOrderAndUnmatchedOnesStayUnknown) {
    std::vector<std::vector<PeerSpan>> s(2);
    // Two micro-batches' all-gathers of one unit share a key; rank 1 lacks the last one
    // (its trace ended first). A wait never exceeds the collective's own span.
    s[0] = {{"ag|u", 0, 50}, {"ag|u", 100, 150}, {"rs|u", 200, 260}};
    s[1] = {{"ag|u", 0, 50}, {"ag|u", 140, 150}};
    const PeerWaits w = peerWaits(s);
    EXPECT_EQ(w.matched, 2);
    EXPECT_EQ(w.waitNs[0], (std::vector<int64_t>{0, 40, -1}));
    EXPECT_EQ(w.waitNs[1], (std::vector<int64_t>{0, 0}));
    // Rank 1 starts the reduce-scatter after rank 0's has ended (its end 40 ns later): the
    // wait is clamped to rank 0's span.
    s[1].push_back({"rs|u", 290, 300});
    const PeerWaits v = peerWaits(s);
    EXPECT_EQ(v.matched, 3);
    EXPECT_EQ(v.clockOffsetNs[1], 0);
    EXPECT_EQ(v.waitNs[0][2], 60);
    EXPECT_EQ(v.waitNs[1][2], 0);
}

TEST(PeerWait, GroupsMatchAmongTheirMembersAndChainTheClocks) {
    // HSDP 2x2: shard groups {0, 1} and {2, 3}, replicate groups {0, 2} and {1, 3}. Rank r's
    // clock runs r * 1000 ns ahead. Rank 3 starts its shard all-gather 50 ns after rank 2;
    // rank 2 starts the replicate all-reduce 70 ns after rank 0.
    const std::vector<std::vector<int32_t>> groups = {{0, 1}, {2, 3}, {0, 2}, {1, 3}};
    auto s = [](int32_t r, const char* key, int64_t t0, int64_t t1, int32_t g) {
        return PeerSpan{key, t0 + 1000 * r, t1 + 1000 * r, g};
    };
    std::vector<std::vector<PeerSpan>> spans = {{s(0, "ag", 0, 100, 0), s(0, "ar", 200, 300, 2)},
                                                {s(1, "ag", 0, 100, 0), s(1, "ar", 200, 300, 3)},
                                                {s(2, "ag", 0, 100, 1), s(2, "ar", 270, 300, 2)},
                                                {s(3, "ag", 50, 100, 1), s(3, "ar", 200, 300, 3)}};
    const PeerWaits w = peerWaits(spans, groups);
    EXPECT_EQ(w.matched, 4);
    EXPECT_EQ(w.clockOffsetNs, (std::vector<int64_t>{0, 1000, 2000, 3000}));
    EXPECT_EQ(w.waitNs[2], (std::vector<int64_t>{50, 0}));
    EXPECT_EQ(w.waitNs[0], (std::vector<int64_t>{0, 70}));
    EXPECT_EQ(w.waitNs[1], (std::vector<int64_t>{0, 0}));
    EXPECT_EQ(w.waitNs[3], (std::vector<int64_t>{0, 0}));
}

TEST(PeerWait, OneRankOrNothingInCommonGivesNoWait) {
    EXPECT_EQ(peerWaits({{{"ag", 0, 10}}}).matched, 0);
    const PeerWaits w = peerWaits({{{"ag|a", 0, 10}}, {{"ag|b", 0, 10}}});
    EXPECT_EQ(w.matched, 0);
    EXPECT_EQ(w.waitNs[0][0], -1);
}

}  // namespace
}  // namespace shardscope
