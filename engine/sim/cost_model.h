// SPDX-License-Identifier: Apache-2.0
#pragma once
// Durations of step-program ops on a cluster. Every parameter comes from the cluster JSON
// (ClusterSpec::sim and the hardware figures); plans/README.md documents each.
//  - compute: FLOPs / (peak(dtype) · efficiency(FLOPs per kernel)) + bytes / (HBM · eff);
//  - copies: bytes / (HBM · eff); host copies: bytes / host link;
//  - collectives: NCCL ring model, the fastest of the cluster's protocols:
//      time = base + (n-1-(nodes-1))·intra_step + (nodes-1)·inter_step
//           + factor · bytes / (busbw · bw_factor),
//    factor (n-1)/n for all-gather and reduce-scatter, 2(n-1)/n for all-reduce, and
//    busbw = intra bandwidth · intra_efficiency within a node, else
//    min(intra · intra_efficiency, ranks-per-node · NIC · network_efficiency): across
//    nodes NCCL's channels leave each node through all its NICs at once.
#include <cstdint>

#include "engine/schedule/step_program.h"
#include "plans/cluster/cluster.h"

namespace shardscope {

struct CollectiveCost {
    int64_t ns = 0;
    int protocol = 0;  // index into ClusterSpec::sim.protocols
};

[[nodiscard]] CollectiveCost collectiveTime(const ClusterSpec& c, OpKind kind, int64_t bytes,
                                            int32_t groupSize, int32_t groupNodes,
                                            int32_t ranksPerNode);
[[nodiscard]] int64_t opDurationNs(const ClusterSpec& c, const Op& op);

}  // namespace shardscope
