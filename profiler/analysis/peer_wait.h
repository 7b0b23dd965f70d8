// SPDX-License-Identifier: Apache-2.0
#pragma once
// Waiting for a peer, from several ranks' traces of one job. A collective ends at about the
// same time on every rank of its group, whenever each rank started it; the time a rank
// spends in one before the last of its peers has started it is a wait for that peer (a
// straggler: a longer optimizer step, a data-loader stall, an unlucky core), not transfer.
// The ranks' clocks need not agree (traces of several hosts, or of processes whose traces
// start at different times): each rank's offset to the first is the median difference of
// the matched collectives' ends.
#include <cstdint>
#include <string>
#include <vector>

namespace shardscope {

struct PeerSpan {
    std::string key;  // names the collective alike on every rank: kind, unit, phase, step, ...
    int64_t startNs = 0, endNs = 0;
    int32_t group = -1;  // index into the groups given to peerWaits; -1: every rank
};

struct PeerWaits {
    int64_t matched = 0;  // collectives found on every member of their group
    // Per rank, against the first: within a group the median difference of the matched
    // collectives' ends, chained across groups (0 where no group links a rank to the first).
    std::vector<int64_t> clockOffsetNs;
    // Per rank, per span given: its wait for the last peer, or -1 when not matched.
    std::vector<std::vector<int64_t>> waitNs;
};

// spans[r]: rank r's collectives; `groups`: the smaller groups some run in (HSDP's shard
// and replicate groups), each a list of rank indices. Spans of one group with equal keys
// match in their order on each member.
[[nodiscard]] PeerWaits peerWaits(const std::vector<std::vector<PeerSpan>>& spans,
                                  const std::vector<std::vector<int32_t>>& groups = {});

}  // namespace shardscope
