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
// checkpointing and AdamW on the shards. The recorder (recorder.h), the collectives and
// their timing (collectives.h) and the process groups (process_groups.h) are their own.
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

#include "engine/exec/process_groups.h"
#include "engine/exec/recorder.h"
#include "engine/schedule/step_program.h"
#include "plans/plan/resolve.h"

namespace shardscope::exec {

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
    FsdpRuntime(const ResolvedPlan& plan, Groups* groups, Recorder* recorder,
                RuntimeOptions options);
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
    std::unique_ptr<Impl> m_impl;
    bool m_segHasCompute = false;
};

}  // namespace shardscope::exec
