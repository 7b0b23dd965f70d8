// SPDX-License-Identifier: Apache-2.0
#pragma once
// Simulates one step program on a cluster: per-op start and end on each stream, the
// memory timeline, and the summary users compare plans by. Ranks are symmetric under
// FSDP, so one rank is simulated and stands for all; cost does not grow with rank count.
//
// Timing: ops are issued by one CPU thread in program order, each costing cpu_issue_ns;
// an op starts when its stream is free, the ops it waits on have ended, and it has been
// issued (an FSDP1 rate-limited all-gather also makes the CPU wait); collectives of one
// process group also wait for the group's previous collective. A second pass stretches the
// compute the first pass overlapped with collectives: on a cluster with NCCL's model, by
// what each collective holds (its CTAs' share of the SMs for compute-bound kernels, its
// copies' share of HBM bandwidth for memory-bound ones, ncclOccupancy); otherwise by the
// cluster's flat overlap_slowdown.
//
// Memory: allocated bytes follow CPU issue order, as torch.cuda.max_memory_allocated
// counts them; reserved bytes come from the caching-allocator model fed the same events.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/schedule/step_program.h"
#include "plans/cluster/cluster.h"

namespace shardscope {

struct SimOptions {
    bool expandableSegments = false;
    bool keepTimeline = true;  // the memory timeline (off in search loops)
    bool keepOpTimes = true;   // SimResult::start and end (off in search loops)
    // When > 0 and peak allocated already exceeds it, the plan cannot fit (reserved >=
    // allocated): the caching-allocator model is skipped and peakReserved reports the
    // allocated peak as a lower bound (reservedIsLowerBound). Used by the plan search.
    int64_t reservedBudget = 0;
};

struct MemoryPoint {
    int64_t timeNs = 0;
    int64_t allocated = 0;
    int64_t reserved = 0;
    std::array<int64_t, static_cast<size_t>(MemCategory::Count)> byCategory{};
};

struct UnitSummary {
    int64_t allGatherBytes = 0;
    int64_t reduceScatterBytes = 0;
    int64_t commNs = 0;
    int64_t exposedCommNs = 0;
};

struct SimResult {
    std::vector<int64_t> start, end;  // per op
    int64_t stepNs = 0;
    int64_t computeNs = 0;      // busy time of the compute stream's compute ops
    int64_t commNs = 0;         // union of collective intervals
    int64_t exposedCommNs = 0;  // collective time not overlapped by compute
    double overlapRatio = 0;    // |comm ∩ compute| / |comm| (HTA's definition)
    // CPU time FSDP2's reduce-scatter copy-ins spent building torch._chunk_cat's block table
    // before their kernels (chunk_cat_host_ns_per_block; 0 where not modelled).
    int64_t chunkCatHostNs = 0;
    int64_t peakAllocated = 0;
    int64_t peakReserved = 0;
    std::array<int64_t, 3> peakAllocatedByPhase{};  // forward, backward, optimizer
    std::array<int64_t, static_cast<size_t>(MemCategory::Count)>
        atPeak{};  // allocated by category at the peak
    bool oom = false;
    bool reservedIsLowerBound = false;
    double tokensPerS = 0;
    double mfu = 0;
    std::vector<MemoryPoint> timeline;
    std::vector<UnitSummary> units;
};

[[nodiscard]] SimResult simulate(const StepProgram& program, const ClusterSpec& cluster,
                                 int64_t worldSize, const SimOptions& options = {});

}  // namespace shardscope
