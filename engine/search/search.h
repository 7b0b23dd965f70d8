// SPDX-License-Identifier: Apache-2.0
#pragma once
// Plan search: enumerates FSDP2 plans for a model on a cluster and simulates each, keeping
// the fastest plan whose peak reserved memory fits the device with headroom, and the Pareto
// front of step time against peak memory.
//
// Space (every combination is simulated; structural choices are resolved once each, the
// rest applied with applyVariant):
//   wrap:        each block a unit, groups of 2 or 4 consecutive blocks, or attention and
//                MLP of each block as separate units;
//                embeddings and head as units of their own, or left to the root;
//   mesh:        1D over all ranks, or HSDP sharding within 1, 2 or 4 nodes and replicating
//                across the rest (when nodes > 1);
//   reshard:     True, False, the node size as an int (when it divides the shard size), for
//                the blocks and, apart, for embedding/head units;
//   prefetch:    explicit forward depth 0-2 and backward depth 0-2 (0: implicit);
//   precision:   bf16 parameters with an fp32 reduce (bf16 where SearchOptions allow it);
//   checkpoint:  none, selective, full;
//   micro-batch: powers of two dividing the per-rank batch (at most 16 accumulation steps),
//                accumulating to the global batch
//                without gradient sync (unsharded gradients kept) or reducing every micro-batch;
//   offload:     CPU offload, only when no plan fits without it.
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "engine/search/variant.h"
#include "engine/sim/simulator.h"
#include "plans/cluster/cluster.h"
#include "plans/model/model_graph.h"
#include "plans/plan/plan.h"

namespace shardscope {

struct SearchOptions {
    int64_t globalBatch = 0;  // sequences per optimizer step; 0: 4Mi tokens, at least one per rank
    int64_t seqLen = 8192;
    double memoryHeadroom = 0.10;
    // Only what FSDP1 and Lightning express: one module per unit, reshard True or False,
    // implicit prefetch (FSDP1 BACKWARD_PRE), HSDP within a node.
    bool fsdp1Compatible = false;
    // The caching allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF=
    // expandable_segments:True, as torchtitan runs): reserved memory tracks the high-water
    // mark instead of the per-stream pools' segments.
    bool expandableSegments = false;
    // What the user fixed (recommend --fix, --no-offload); the search keeps to it.
    // The reduce dtypes searched: fp32 only by default (a bf16 reduce-scatter changes the
    // numerics of training: torchtitan and most users keep fp32).
    std::vector<DType> reduceDtypes{DType::Float32};
    std::optional<AcMode> activationCheckpointing;  // one mode instead of none/selective/full
    std::optional<int64_t> microBatch;              // one micro-batch size
    bool allowOffload = true;                       // CPU offload when nothing fits without
    // torch.compile settings searched for the units (recommend --allow compile adds per_block:
    // it needs a compiler and changes numerics slightly, so it is the user's to allow).
    std::vector<CompileMode> compileModes{CompileMode::None};
    // torchao float8 training searched beside bf16 (recommend --allow float8): tensorwise,
    // with float8 all-gather and precomputed scales, as torchtitan runs it on FSDP2.
    bool allowFloat8 = false;
    unsigned threads = 0;                       // 0: all cores
    const std::atomic<bool>* cancel = nullptr;  // set to stop early and return the best so far
    std::function<void(size_t done, size_t total)> progress;
};

struct Candidate {
    Plan plan;            // a complete plan (the variant folded in), loadable and exportable
    std::string summary;  // "blocks/unit=1, reshard=True, prefetch fwd 1/bwd 0, bf16/fp32, ac=none,
                          // mbs=2x4"
    SimResult sim;        // without the memory timeline
    bool fits = false;
};

struct SearchResult {
    std::vector<Candidate> pareto;     // by step time, each uses less memory than the faster ones
    std::optional<Candidate> best;     // the fastest plan that fits
    std::optional<Candidate> closest;  // when nothing fits: the plan needing least memory
    // When compile was searched: the fastest plan that fits without it (what compile buys).
    std::optional<Candidate> bestEager;
    // When float8 was searched: the fastest plan that fits without it.
    std::optional<Candidate> bestWithoutFloat8;
    Candidate baseline;    // each block a unit, reshard True, root False, implicit prefetch
    size_t evaluated = 0;  // plans counted, including those pruned by memory
    size_t simulated = 0;  // plans actually simulated
    size_t total = 0;
    bool cancelled = false;
    int64_t memoryBudget = 0;
    int64_t globalBatch = 0;
};

// The global batch the search uses: SearchOptions::globalBatch (4Mi tokens when 0, at least
// one sequence per GPU), rounded up to a multiple of the world size.
[[nodiscard]] int64_t searchGlobalBatch(const ClusterSpec& cluster, const SearchOptions& o);

[[nodiscard]] SearchResult searchPlans(const ModelGraph& model, const ClusterSpec& cluster,
                                       const SearchOptions& o);

// The repeated decoder blocks: the children of the ModuleList holding the most parameters
// (then the longest) whose children share one class. Empty when the model has none.
[[nodiscard]] std::vector<ModuleId> findBlocks(const ModelGraph& g);

}  // namespace shardscope
