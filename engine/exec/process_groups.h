// SPDX-License-Identifier: Apache-2.0
#pragma once
// The engine's process groups from the torchrun environment: the rendezvous through
// TCPStore (bounded by a watchdog, served on loopback when every rank is on this machine)
// and the Gloo or NCCL groups a plan's mesh needs.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "plans/plan/resolve.h"

namespace shardscope::exec {

// Process groups of this rank: the shard group, the replicate group (HSDP), the whole
// world (losses, parameter dumps) and the post-forward groups of int reshard by size.
struct Groups {
    c10::intrusive_ptr<c10d::Backend> world, shard, replicate;
    std::vector<std::pair<int64_t, c10::intrusive_ptr<c10d::Backend>>> postForward;
    int64_t rank = 0, worldSize = 1;
    int64_t shardRank = 0, shardSize = 1, replicateRank = 0, replicateSize = 1;
    [[nodiscard]] c10d::Backend& postForwardGroup(int64_t k) const;
};

// The process groups for a plan's mesh from the torchrun environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), rendezvous through TCPStore: Gloo on CPU; on CUDA, NCCL for
// the shard, replicate and post-forward groups (the world group, which only carries losses,
// barriers and parameter dumps, stays on Gloo). Throws with a message naming what is
// missing.
Groups makeGroups(const ResolvedPlan& plan, std::chrono::milliseconds timeout,
                  c10::Device device = c10::kCPU);
Groups singleProcessGroups();
// Every rank of the torchrun environment in one group (a calibration sweep): `shard` is the
// whole world, on NCCL for CUDA and Gloo otherwise; `world` is Gloo.
Groups makeFlatGroups(std::chrono::milliseconds timeout, c10::Device device = c10::kCPU);

}  // namespace shardscope::exec
