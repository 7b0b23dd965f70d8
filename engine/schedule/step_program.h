// SPDX-License-Identifier: Apache-2.0
#pragma once
// The step program: the ordered list of what one rank issues in one training step (all
// micro-batches and the optimizer step), on which stream, waiting on which earlier ops,
// with the buffers each op allocates and frees. Simulator, engine and trace diff share it:
// op ids are stable, so simulated and measured ops join exactly.
//
// FSDP2 semantics as PyTorch implements them (torch/distributed/fsdp/_fully_shard/
// _fsdp_param_group.py, _fsdp_collectives.py, _fsdp_state.py; docs/architecture.md):
//  - unshard = copy-in (all-gather copy-in stream; allocates the flat all-gather output),
//    all-gather (all-gather stream; waits on its copy-in and, in forward, on the previous
//    unit's copy-out), copy-out (compute stream; allocates the unsharded parameters);
//  - forward: a unit's pre-forward unshards it; the CPU runs ahead, so the next unit's
//    all-gather overlaps this unit's compute (implicit prefetch); the flat all-gather
//    buffer is freed after the next unit's copy-out; explicit forward prefetch unshards the
//    targets right after this unit's copy-out;
//  - post-forward reshard frees the unsharded parameters (True), keeps them (False), or
//    keeps a ceil(d0/k)-row copy (int k) from which backward all-gathers over k ranks;
//  - backward runs units in reverse; pre-backward unshards the unit and (implicit
//    prefetch) the unit before it in post-forward order; post-backward reduce-scatters
//    when the unit's input gradients are ready, or at the end of backward for units whose
//    inputs need no gradient (the first unit, fed token ids, and the root); each
//    reduce-scatter copy-in waits on the previous reduce-scatter; HSDP all-reduces on its
//    own stream after the reduce-scatter;
//  - without gradient sync (accumulation), unsharded gradients are kept and reduced on
//    the last micro-batch.
// FSDP1 differs in: flat parameters, limit_all_gathers (an all-gather waits until the
// unit two before it has been freed: the CPU blocks), backward prefetch BACKWARD_PRE /
// BACKWARD_POST / none, SHARD_GRAD_OP and NO_SHARD.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/schedule/small_vector.h"
#include "plans/plan/resolve.h"

namespace shardscope {

enum class Stream : uint8_t {
    Compute,
    CopyIn,
    AllGather,
    ReduceScatter,
    AllReduce,
    H2D,
    D2H,
    Host,
    Count
};
enum class OpKind : uint8_t {
    CopyIn,
    AllGather,
    CopyOut,
    Forward,
    Backward,
    Recompute,
    ReduceScatterCopyIn,
    ReduceScatter,
    AllReduce,
    OptimizerStep,
    H2D,
    D2H,
};
enum class Phase : uint8_t { Forward, Backward, Optimizer };
enum class MemCategory : uint8_t {
    ShardedParams,
    UnshardedParams,
    AllGatherBuffer,
    Gradients,
    ReduceScatterBuffer,
    Activations,
    OptimizerState,
    Temporaries,
    Count
};

[[nodiscard]] const char* streamName(Stream s);
[[nodiscard]] const char* opKindName(OpKind k);
[[nodiscard]] std::optional<OpKind> opKindFromName(std::string_view name);  // opKindName's inverse
[[nodiscard]] const char* phaseName(Phase p);
[[nodiscard]] const char* memCategoryName(MemCategory c);
[[nodiscard]] inline bool isCollective(OpKind k) {
    return k == OpKind::AllGather || k == OpKind::ReduceScatter || k == OpKind::AllReduce;
}

// The kernels one compute op launches, by class, identical kernels folded into one entry:
// what the cost model prices kernel by kernel and the CPU pays a launch for each of.
enum class KernelKind : uint8_t { Gemm, Attention, MemoryBound };
// A GEMM's M x K by K x N as PyTorch calls it (aten::mm's input dims); 0s when unknown.
// A linear layer's forward, input gradient and weight gradient are three shapes.
struct GemmShape {
    int64_t m = 0, n = 0, k = 0;
    bool float8 = false;  // torchao's float8 GEMM (_scaled_mm) at the device's fp8 rate
    friend bool operator==(const GemmShape&, const GemmShape&) = default;
};
struct KernelEntry {
    KernelKind kind = KernelKind::Gemm;
    int32_t count = 0;
    double perKernel = 0;  // FLOPs (GEMM, attention) or bytes moved (memory-bound) of one
    bool masked = false;   // attention through a (sliding-window) mask: no causal skipping
    GemmShape shape{};     // GEMM: its shape where the model gives it
    friend bool operator==(const KernelEntry&, const KernelEntry&) = default;
};
struct KernelMix {
    std::vector<KernelEntry> entries;
    int64_t kernels = 0;  // sum of counts
    friend bool operator==(const KernelMix&, const KernelMix&) = default;
};

using OpId = Id<struct OpTag>;
using BufferId = Id<struct BufferTag>;

struct Buffer {
    int64_t bytes = 0;
    MemCategory category = MemCategory::Temporaries;
    DType dtype = DType::Float32;
    Stream stream = Stream::Compute;  // allocation stream: the caching allocator pools per stream
};

struct Op {
    Op() = default;
    // What every op is made with; the other fields keep their defaults. A constructor, not
    // aggregate initialization, so that vector::emplace_back builds an op in place with
    // every compiler we build with (clang 14 lacks C++20's parenthesized aggregates).
    Op(OpKind k, Phase ph, Stream s, UnitId u, int32_t mb)
        : kind(k), phase(ph), stream(s), unit(u), microBatch(mb) {}

    // Fields are ordered so that an op packs into 128 bytes (the simulator walks hundreds a
    // step).
    OpKind kind = OpKind::Forward;
    Phase phase = Phase::Forward;
    Stream stream = Stream::Compute;
    UnitId unit;
    int32_t microBatch = 0;
    DType computeDtype = DType::Float32;
    // Process group of a collective: 0 shard group, 1 replicate group (HSDP), 2 the
    // post-forward group of int reshard. Collectives of one group run one at a time, in
    // issue order, whatever CUDA stream they were issued on (one NCCL communicator).
    int8_t processGroup = 0;
    bool cpuBlocks = false;  // the CPU waits for `waits` before issuing (FSDP1 limiter)
    // The first `freesFirst` of `frees` are released before `allocs` (a buffer dropped just
    // before this op's own allocation, as FSDP2's post-backward drops the previous
    // reduce-scatter input before making the next); the rest after. A copy-out after an
    // all-gather releases all of its frees first (the previous all-gather result); one over a
    // group of one frees its cast temporary after.
    uint8_t freesFirst = 0;
    // The frees after the allocations are temporaries among the allocations, each released
    // once the next is allocated (a loop over parameters rebinding its temporary: FSDP2's
    // unshard over a group of one); the last after all allocations.
    bool interleaved = false;
    // A reduce-scatter copy-in that is a FlatParameter's gradient cast (FSDP1's and
    // fairscale's `flat_param.grad.to(reduce_dtype)`, aten::copy_'s unrolled kernel), not
    // FSDP2's torch._chunk_cat: the cost model prices it by its own curve.
    bool flatGradCast = false;
    int32_t groupSize = 1;     // collective group size
    int32_t groupNodes = 1;    // nodes the group spans
    int32_t ranksPerNode = 1;  // group ranks on one node
    int32_t mix = -1;          // compute: index into StepProgram::mixes (its kernels), -1 for none
    double flops = 0;          // compute
    double memBytes = 0;       // memory-bound bytes (compute and copies)
    int64_t commBytes = 0;     // collective: total bytes of the full (gathered) tensor
    // The inline sizes hold nearly every op's lists (a backward frees up to four buffers);
    // the optimizer step's long ones spill to the heap.
    SmallVector<OpId, 3> waits{};  // cross-stream dependencies (events)
    SmallVector<BufferId, 3> allocs{};
    SmallVector<BufferId, 4> frees{};  // freed when this op is issued (stream-ordered reuse)
};
static_assert(sizeof(void*) != 8 || sizeof(Op) == 128, "an op packs into 128 bytes");

// How many of an op's frees come before its allocations (Op::freesFirst).
inline size_t earlyFrees(const Op& op) {
    return std::min<size_t>(op.freesFirst, op.frees.size());
}

// An op's allocations and its frees after them in the order the memory model applies them:
// alloc(b) for each allocation, free(b) for each late free, and peak() where the bytes
// allocated reach a local maximum (before a free that follows an allocation).
template <class Alloc, class Free, class Peak>
void allocsThenLateFrees(const Op& op, Alloc&& alloc, Free&& free, Peak&& peak) {
    const size_t early = earlyFrees(op);
    if (!op.interleaved) {
        for (BufferId b : op.allocs)
            alloc(b);
        peak();
        for (size_t k = early; k < op.frees.size(); ++k)
            free(op.frees[k]);
        return;
    }
    size_t next = early;  // the next temporary among the allocations
    for (BufferId b : op.allocs) {
        alloc(b);
        if (next < op.frees.size() && op.frees[next] == b) {
            if (next > early) {
                peak();
                free(op.frees[next - 1]);
            }
            ++next;
        }
    }
    peak();
    for (size_t k = next > early ? next - 1 : early; k < op.frees.size(); ++k)
        free(op.frees[k]);
}

struct StepOptions {
    int64_t microBatchSize = 1;
    int64_t seqLen = 2048;
    int64_t microBatches = 1;
    int64_t devicesPerNode = 8;
    // The "device" is the host (a CPU cluster): CPU-offloaded state lives in the memory the
    // peak counts, so it is counted.
    bool hostIsDevice = false;
    // Full checkpointing's recompute stops once it has remade what forward saved
    // (ModuleRun::recomputeSkips), as torch.utils.checkpoint does without reentrance, the
    // default of torchtitan, checkpoint_wrapper and Lightning. Our engine's checkpoint is
    // reentrant and recomputes the whole forward: its runs and traces are simulated with
    // false.
    bool recomputeEarlyStop = true;
};

struct StepProgram {
    std::vector<Op> ops;  // CPU issue order
    std::vector<Buffer> buffers;
    std::vector<KernelMix> mixes;  // distinct kernel mixes of the compute ops
    int64_t persistentBytes[static_cast<int>(MemCategory::Count)] = {};  // held all step
    double modelFlopsPerRank = 0;  // forward + backward, without recompute (for MFU)
    int64_t tokensPerRank = 0;
    [[nodiscard]] std::string dump(
        const ResolvedPlan& plan) const;  // one line per op: the golden-file form
};

[[nodiscard]] StepProgram buildStepProgram(const ResolvedPlan& plan, const StepOptions& options);
// The same, into `into`, whose storage is kept: a search builds thousands of programs in a
// row, and reusing one program's vectors spares their allocations.
void buildStepProgram(const ResolvedPlan& plan, const StepOptions& options, StepProgram& into);
// The plan's training section (micro-batch, sequence length, micro-batches) on nodes of
// `devicesPerNode` devices.
[[nodiscard]] StepOptions stepOptionsFor(const Plan& plan, int64_t devicesPerNode);
// The plan's batch shape on this cluster (devices per node; a CPU device is the host).
[[nodiscard]] StepOptions stepOptionsFor(const Plan& plan, const ClusterSpec& cluster);

// "model.layers.3 all-gather": made on demand for traces and dumps, not stored per op.
[[nodiscard]] std::string opLabel(const ResolvedPlan& plan, const Op& op);

}  // namespace shardscope
