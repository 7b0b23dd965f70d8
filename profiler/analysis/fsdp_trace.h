// SPDX-License-Identifier: Apache-2.0
#pragma once
// FSDP's structure read from a PyTorch profiler trace of a real FSDP job: the units, which
// collective belongs to which unit and phase, when it ran, how much of it nothing hid, and
// which hook issued it (the prefetch distance actually seen).
//
// FSDP2 (torch.distributed.fsdp._fully_shard) labels its work with record_function ranges
// named per unit: "FSDP::pre_forward (model.layers.2)", "FSDP::all_gather (...)",
// "FSDP::post_backward_reduce (...)", "FSDP::forward_prefetch for X" and
// "FSDP::backward_prefetch for X" inside the issuing unit's pre_forward / pre_backward,
// "FSDP::root_pre_forward" once per forward. A unit without a suffix is the root (fqn "");
// a unit of several modules is named "a, b". FSDP1 (FullyShardedDataParallel._pre_forward,
// ._pre_backward_hook, ._post_backward_hook, ...) names no unit: its units are numbered in
// forward order and matched in backward by order and size.
//
// A collective is issued on the main thread by a c10d op (c10d::_allgather_base_,
// c10d::_reduce_scatter_base_, c10d::allreduce_, ...) and runs elsewhere: on a GPU trace as
// the NCCL kernel its launch flows to; on a CPU trace as the "gloo:*" range on a Gloo
// worker thread (matched in issue order, by kind and element count). Exposed time is the
// part of that interval no compute covered: compute kernels on a GPU trace, the main
// thread's ops (other than the collectives' own) on a CPU trace.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "plans/core/intervals.h"
#include "plans/model/model_graph.h"
#include "plans/plan/plan.h"
#include "profiler/analysis/summary.h"
#include "profiler/trace/trace.h"

namespace shardscope {

struct FsdpCollectiveUse {
    CollectiveKind kind = CollectiveKind::Other;
    int32_t issueEvent = -1;  // the host op that issued it (c10d::...)
    int32_t commEvent = -1;   // where it ran (NCCL kernel, gloo:* range); -1: not found
    int32_t unit = -1;        // index into FsdpTraceAnalysis::units; -1: not FSDP's
    int32_t issuer = -1;      // the unit whose pre_forward / pre_backward issued it
    int32_t step = 0, microBatch = 0;
    bool backward = false;
    bool prefetch = false;         // issued under a *_prefetch range
    int32_t prefetchDistance = 0;  // units ahead of the issuer, in the phase's order
    int64_t startNs = 0, endNs = 0, exposedNs = 0;
    int64_t inputElements = 0, outputElements = 0;
    std::string dtype;
    int32_t groupSize = 0;  // from the issuing op's shapes (all-gather, reduce-scatter)
    // Of [startNs, endNs), the part before the last rank of its group started it: waiting
    // for a peer, not moving data (fillPeerWaits; -1: not known).
    int64_t peerWaitNs = -1;
};

struct FsdpPhaseStats {
    int64_t allGathers = 0, allGatherNs = 0, allGatherExposedNs = 0;
    int64_t reduceScatters = 0, reduceScatterNs = 0, reduceScatterExposedNs = 0;
    int64_t allReduces = 0, allReduceNs = 0, allReduceExposedNs = 0;
    int32_t minDistance = 0, maxDistance = 0;  // prefetch distance of the all-gathers
    bool sawAllGather = false;
    int64_t peerWaitNs = 0;  // all the phase's collectives (fillPeerWaits)
};

struct FsdpUnit {
    std::string name;                  // as FSDP labels it: "model.layers.0", "" (root)
    std::vector<std::string> modules;  // "a, b" split; {""} for the root
    FsdpPhaseStats forward, backward;  // per step (totals over the steps / steps)
    std::vector<std::string> forwardPrefetch, backwardPrefetch;  // targets seen, in order
    int64_t shardElements = 0;                                   // the forward all-gather's input
    int32_t forwardGroup = 0, backwardGroup = 0;
    std::string allGatherDtype, reduceDtype;
    // FSDP2 over one rank (no all-gather): the parameters copied into their storage by the
    // unit's pre-forward and pre-backward (all steps together), their dtype, and the reduce
    // dtype of its fsdp::chunk_cat (any world size).
    int64_t forwardLocalCopies = 0, backwardLocalCopies = 0;
    std::string localCopyDtype, chunkCatDtype;
    int32_t forwardPos = -1, backwardPos = -1, postForwardPos = -1;
    // Activation checkpointing, as the trace shows it: forward-only ops (aten::linear,
    // aten::embedding, the public SDPA op) between the unit's pre_forward and post_forward,
    // and again in its backward, where only a recompute runs them (all steps together).
    int64_t forwardOps = 0, recomputedOps = 0;
    int64_t forwardAttention = 0, recomputedAttention = 0;
    // An op-level selective policy (torch.utils.checkpoint with a context_fn) runs each op
    // of the checkpointed forward through its dispatch mode, which the profiler records as
    // the op around the op's own record: aten::mm and SDPA's kernel op
    // (aten::_scaled_dot_product_*_attention) nested in a record of themselves. In the
    // recompute a kept op is the outer record alone: its inner ones count the ops that ran
    // again. No policy: no such nesting.
    int64_t policyForwardMm = 0, policyRecomputedMm = 0;
    int64_t policyForwardSdpa = 0, policyRecomputedSdpa = 0;
    int64_t policyForwardNested = 0;  // any op of the unit's forward nested in itself
    [[nodiscard]] std::string displayName() const { return name.empty() ? "<root>" : name; }
};

// The device work that host threads launched (Kineto's launch flows), by launch time: what
// a host range ran on the GPU. A GPU trace's host ranges time the launches; the device
// spans are what the step took.
struct DeviceLaunches {
    std::vector<int64_t> launchStart;  // sorted
    std::vector<Interval> device;      // the launched work, in launchStart's order
    [[nodiscard]] bool empty() const { return launchStart.empty(); }
    // [first start, last end] of the work launched in [from, to); {-1, -1} when none was.
    [[nodiscard]] Interval spanOf(int64_t from, int64_t to) const;
};
[[nodiscard]] DeviceLaunches deviceLaunches(const Trace& t, const std::vector<int32_t>& lanes);

struct FsdpTraceAnalysis {
    std::string api;              // "fsdp2", "fsdp1", or "" when the trace has no FSDP labels
    bool gpu = false;             // collectives ran as device kernels
    std::vector<FsdpUnit> units;  // forward order
    std::vector<FsdpCollectiveUse> collectives;
    int32_t steps = 0;         // ProfilerStep ranges analysed (1 when the trace has none)
    int32_t microBatches = 1;  // forwards per step (root_pre_forward)
    double stepNs = 0;         // mean ProfilerStep duration (the traced span without steps)
    int64_t commNs = 0, exposedNs = 0;  // per step: union of FSDP collectives, its exposed part
    int64_t unmatched = 0;              // issued collectives with no execution found
    int64_t microBatchSize = 0, seqLen = 0;  // from the first aten::embedding (0: unknown)
    int64_t worldSize = 0;
    int32_t mainLane = -1;
    // Every host thread with FSDP labels, the main one included: on a GPU, autograd runs
    // backward on its own device thread, so the backward hooks are on another lane than
    // the forward's and the ProfilerStep ranges.
    std::vector<int32_t> hostLanes;
    DeviceLaunches launched;  // what hostLanes launched on the device (empty: a CPU trace)
    // FSDP1: backward prefetch as its labels show it ("BACKWARD_PRE": all-gathers issued
    // under _pre_backward_prefetch, "BACKWARD_POST": under _post_backward_prefetch, "NONE").
    std::string fsdp1BackwardPrefetch;
    bool fsdp1ForwardPrefetch = false;
    std::vector<std::string> notes;
    int64_t rank = 0;                                // the trace's distributedInfo
    std::vector<Trace::ProcessGroup> processGroups;  // its pg_config
    bool peerWaits = false;  // fillPeerWaits matched this rank's collectives with its peers'
    int64_t peerWaitNs = 0;  // per step: the FSDP collectives' time waiting for a peer
};

[[nodiscard]] FsdpTraceAnalysis analyzeFsdp(const Trace& t);

// Several ranks of one job. A collective ends at about the same time on every rank of its
// group, whenever each started it: the time a rank spends in one before the last of its
// peers has started it is a wait for that peer (a straggler: a longer optimizer step, a
// data-loader stall, an unlucky core), not transfer. Fills peerWaitNs of the collectives
// whose group is known: all of `ranks` (group size = ranks.size(); one without a known
// size only where no collective of any rank shows a smaller group), or a smaller group the
// traces list (Kineto's pg_config: HSDP's shard groups for all-gathers and reduce-scatters,
// its replicate groups for all-reduces) whose members' traces are all given. Collectives
// match within their group by kind, unit, phase, step, micro-batch and order; the per-phase
// and per-step sums follow. The ranks' clocks need not agree: within a group each member's
// offset is the median difference of the matched collectives' ends, chained across groups
// for clockOffsetNs. Returns how many collectives were matched (per group); when none, each
// rank gets a note saying why.
struct PeerWaitFit {
    int64_t matched = 0;
    std::vector<int64_t> clockOffsetNs;  // per rank, against ranks[0] (0 where not chained)
};
PeerWaitFit fillPeerWaits(const std::vector<FsdpTraceAnalysis*>& ranks);

// Ops only a forward runs (FsdpUnit::forwardOps): aten::linear and aten::embedding (their
// backward calls other ops); `attention` sets whether it is the public SDPA op. Seen in a
// unit's backward, they are a checkpoint's recompute.
[[nodiscard]] bool isForwardOnlyOp(std::string_view name, bool* attention = nullptr);
// SDPA's kernel op below the public one: aten::_scaled_dot_product_{flash,efficient,cudnn,
// ...}_attention, _flash_attention_for_cpu (not a backward).
[[nodiscard]] bool isSdpaKernelOp(std::string_view name);

// An FSDP2 label: "FSDP::op (fqn)", "FSDP::op" (the root, fqn ""), "FSDP::x_prefetch for fqn".
struct Fsdp2Label {
    std::string_view op;  // "FSDP::pre_forward"
    std::string fqn;      // "model.layers.2", "a, b" for a unit of several modules
};
[[nodiscard]] std::optional<Fsdp2Label> parseFsdp2Label(std::string_view name);
// The modules of a unit as FSDP labels it ("a, b" -> {a, b}; "" -> {""}).
[[nodiscard]] std::vector<std::string> splitUnitModules(const std::string& fqn);

// The main thread's events in time order (a parent before its children) and its
// ProfilerStep ranges; without any, the whole thread is one step.
struct MainThreadWalk {
    std::vector<int32_t> order;
    std::vector<Interval> steps;
    bool haveSteps = false;
    [[nodiscard]] int32_t stepOf(int64_t ts) const;  // -1 outside every step
};
[[nodiscard]] MainThreadWalk mainThreadWalk(const Trace& t, const std::vector<int32_t>& lanes);
[[nodiscard]] nlohmann::json fsdpAnalysisToJson(const FsdpTraceAnalysis& a);

// The busy union of a host thread: its ops (cpu_op / Operator) other than collectives'
// issuing calls (c10d::*, record_param_comms), which wait rather than compute.
[[nodiscard]] std::vector<Interval> hostBusy(const Trace& t, const std::vector<int32_t>& lanes);

// The plan that ran, as far as the trace shows it. `evidence` gets "field: how it was
// inferred" lines; `defaulted` gets "field: why it was left at its default" lines.
struct RecoveredPlan {
    Plan plan;
    std::vector<std::string> inferred, defaulted;
    std::string error;  // set when the plan could not be recovered as it ran
};
// FSDP1 names no unit in its labels: with `model`, the wrap policy is the module class
// whose FSDP1 units (resolved as FullyShardedDataParallel wraps them) have the shard sizes
// the trace's all-gathers show, unit for unit in forward order; without one, or when no
// class matches, `error` says so and the plan lists no units.
[[nodiscard]] RecoveredPlan recoverPlan(const FsdpTraceAnalysis& a, const std::string& source,
                                        const ModelGraph* model = nullptr);

}  // namespace shardscope
