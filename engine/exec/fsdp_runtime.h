// SPDX-License-Identifier: Apache-2.0
#pragma once
// The engine's FSDP2 runtime on LibTorch and c10d: each unit's parameters sharded on dim
// 0 across the shard group (zero-padded to ceil(d0/N) rows per rank, as FSDP2 pads), one
// flat all-gather per unit with copy-in and copy-out, unsharded storage freed and
// re-allocated in place (the storage is resized, as FSDP2 does, so tensors autograd saved
// see the re-gathered values), pre-forward and post-forward hooks called by the model, a
// custom autograd node per unit boundary for pre-backward unshard and post-backward
// reduce-scatter, implicit and explicit prefetching through asynchronous work handles,
// HSDP all-reduce, mixed-precision casts, gradient accumulation without sync, activation
// checkpointing and AdamW on the shards.
//
// Only engine/exec translation units include this header (it pulls in ATen).
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/schedule/step_program.h"
#include "plans/plan/resolve.h"

namespace shardscope::exec {

int64_t nowNs();

// One op the engine ran, labelled as the step program labels it.
struct RecordedOp {
    OpKind kind = OpKind::Forward;
    Phase phase = Phase::Forward;
    Stream stream = Stream::Compute;
    int32_t unit = 0;
    int32_t microBatch = 0;
    int32_t step = 0;
    int64_t startNs = 0;
    int64_t endNs = 0;  // collectives: when the work completed (its future's callback)
};

class Recorder {
public:
    static constexpr size_t kNone = static_cast<size_t>(-1);
    // Off: no op is kept (begin returns kNone); for measuring the recorder's overhead.
    void setEnabled(bool on) { m_enabled = on; }
    [[nodiscard]] bool enabled() const { return m_enabled; }
    size_t begin(OpKind kind, Phase phase, Stream stream, int32_t unit, int32_t mb);
    void end(size_t index);
    void endAt(size_t index, int64_t t);
    void setStart(size_t index, int64_t t);
    void setStep(int32_t step) { m_step = step; }
    [[nodiscard]] std::vector<RecordedOp> ops() const;
    // What the rank is doing now: named in the error when a collective fails or times out.
    [[nodiscard]] std::string current() const;
    void setCurrent(std::string what);
    // Called with each new "current" label (the worker's signal message and fault injection).
    void setHook(std::function<void(const std::string&)> hook) { m_hook = std::move(hook); }
    // Labels the device work a thread launches with the op that thread began last (the
    // CUPTI recorder's external correlation, by op index): `push` at begin, `pop` at that
    // op's end() or at the thread's next begin. A collective's end comes from another
    // thread, so its label lasts until the launching thread begins its next op.
    void setLaunchLabels(void (*push)(uint64_t), void (*pop)()) {
        m_push = push;
        m_pop = pop;
    }

private:
    mutable std::mutex m_mutex;
    std::vector<RecordedOp> m_ops;
    std::string m_current;
    std::function<void(const std::string&)> m_hook;
    void (*m_push)(uint64_t) = nullptr;
    void (*m_pop)() = nullptr;
    int32_t m_step = 0;
    bool m_enabled = true;
};

// Process groups of this rank: the shard group, the replicate group (HSDP), the whole
// world (losses, parameter dumps) and the post-forward groups of int reshard by size.
struct Groups {
    c10::intrusive_ptr<c10d::Backend> world, shard, replicate;
    std::vector<std::pair<int64_t, c10::intrusive_ptr<c10d::Backend>>> postForward;
    int64_t rank = 0, worldSize = 1;
    int64_t shardRank = 0, shardSize = 1, replicateRank = 0, replicateSize = 1;
    [[nodiscard]] c10d::Backend& postForwardGroup(int64_t k) const;
};

struct RuntimeOptions {
    bool fsdp = true;  // false: the unsharded reference (full parameters, no collectives)
    // Where parameters, activations and collectives live: CPU (Gloo) or cuda:LOCAL_RANK
    // (NCCL). CPU-offloaded shards and their optimizer stay on the host either way.
    c10::Device device = c10::kCPU;
    // Each collective waited for where it is issued, with c10d's all_gather_into_tensor and
    // reduce_scatter_tensor: what PyTorch's FSDP2 does on a CPU device, which has no streams
    // (its unshard and reduce-scatter are synchronous there). false: collectives run on
    // Gloo's threads behind compute, as FSDP2's streams let them on a GPU.
    bool blockingCollectives = false;
    uint64_t seed = 1234;
    double lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weightDecay = 0.1;
};

class FsdpRuntime {
public:
    FsdpRuntime(const ResolvedPlan& plan, Groups* groups, Recorder* recorder, RuntimeOptions o);
    ~FsdpRuntime();
    FsdpRuntime(const FsdpRuntime&) = delete;
    FsdpRuntime& operator=(const FsdpRuntime&) = delete;

    // The tensor the model computes with for a parameter: the unsharded parameter (a leaf
    // that collects the unsharded gradient).
    [[nodiscard]] const at::Tensor& param(ParamId p) const;

    // Calls a module of the model: if it is the root of a unit, runs the unit's
    // pre-forward and post-forward around `body` and attaches the backward hooks to its
    // input and output (the input's node runs post-backward, the output's pre-backward).
    // With full activation checkpointing on the unit, `body` runs without saving and is
    // recomputed in backward.
    at::Tensor callModule(ModuleId m, const at::Tensor& input,
                          const std::function<at::Tensor(const at::Tensor&)>& body);
    // The model marks that it computed something (segments without compute record no op).
    void noteCompute() { m_segHasCompute = true; }

    // `last`: the step's last micro-batch (units kept unsharded after backward reshard).
    void beginMicroBatch(int32_t mb, bool syncGradients, bool last = true);
    // Runs backward from the loss, then the root's final callback.
    void backward(const at::Tensor& loss);
    void optimizerStep();  // waits on every reduction, AdamW on the shards, zero_grad
    // Full parameters in graph order (all-gathered; on every rank), for equivalence checks.
    [[nodiscard]] std::vector<at::Tensor> fullParameters();
    [[nodiscard]] int64_t shardedBytes() const;
    [[nodiscard]] c10::Device device() const;

    // Boundary callbacks from the autograd nodes (public for them, not for the model).
    void boundaryBackward(int64_t boundary);

private:
    at::Tensor checkpoint(const at::Tensor& x,
                          const std::function<at::Tensor(const at::Tensor&)>& body, int32_t unit);
    struct Impl;
    std::unique_ptr<Impl> d;
    bool m_segHasCompute = false;
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
