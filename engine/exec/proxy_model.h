// SPDX-License-Identifier: Apache-2.0
#pragma once
// A stand-in for any model the engine cannot build layer by layer (a ShardScope model JSON
// from scripts/export_model.py, or a Hugging Face family other than llama/mistral/qwen2):
// the model graph's modules are called in order through the FSDP runtime, so every unit
// shards, gathers and reduces its real parameters; each module's own work is sized from the
// graph: matmuls of a fixed square matrix for its forward FLOPs (twice that in backward,
// saving nothing),
// every parameter in the graph so its full-size gradient is computed, and a buffer of the
// recorded saved-activation bytes kept for backward. The loss means nothing; the costs are
// the model's.
#include <ATen/ATen.h>

#include "engine/exec/fsdp_runtime.h"
#include "plans/model/model_graph.h"

namespace shardscope::exec {

class ProxyModel {
public:
    ProxyModel(const ModelGraph& g, FsdpRuntime& rt, uint64_t seed);
    at::Tensor loss(const at::Tensor& tokens);

    static constexpr int64_t kWidth = 64;  // the hidden state every module passes on

private:
    const ModelGraph& g;
    FsdpRuntime& rt;
    uint64_t seed;
    int64_t batch = 1, seq = 1;

    at::Tensor forward(ModuleId m, const at::Tensor& x);
    at::Tensor own(ModuleId m, const at::Tensor& x);
};

}  // namespace shardscope::exec
