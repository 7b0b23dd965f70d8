// SPDX-License-Identifier: Apache-2.0
#pragma once
// FsdpRuntime's state and its parts (fsdp_runtime.h has what it does). Its members live by
// what they do:
//   fsdp_setup.cpp    the parameters sharded as the plan resolved them (dim-0 rows for FSDP2,
//                     FSDP1's and fairscale's flat parameters) and the optimizers;
//   fsdp_unshard.cpp  unshard, wait-for-unshard and reshard (copy-in, all-gather, copy-out);
//   fsdp_reduce.cpp   the gradients' reduce-scatter or all-reduce and their folding into the
//                     sharded gradients;
//   fsdp_runtime.cpp  the forward and backward hooks around each unit, and the public calls.
// Internal to engine/exec.
#include <torch/optim/adamw.h>

#include <functional>
#include <memory>
#include <vector>

#include "engine/exec/collectives.h"
#include "engine/exec/fsdp_runtime.h"

namespace shardscope::exec {

struct FsdpRuntime::Impl {
    const ResolvedPlan& plan;
    const ModelGraph& model;
    Groups* groups;
    Recorder* rec;
    RuntimeOptions opts;
    FsdpRuntime* self = nullptr;
    Collectives coll{rec, opts.blockingCollectives};

    struct PState {
        ParamId id;
        int64_t d0 = 1, row = 1;         // dim 0 and elements per row
        int64_t rows = 1;                // rows per rank in the shard group (ceil(d0/N))
        int64_t pfRows = 0;              // rows per rank of the int-reshard copy
        std::vector<int64_t> shape;      // the sharding's view: [numel] when flat1d
        std::vector<int64_t> trueShape;  // the parameter's own shape
        bool flat1d = false;             // fairscale without flattening: sharded as a flat vector
        at::Tensor sharded;              // fp32 master shard [rows, ...], zero-padded
        at::Tensor unsharded;            // the leaf the model computes with [shape], param dtype
        at::Tensor postForward;          // int reshard: this rank's rows of the k-rank group
        bool trainable = true;
    };
    struct UState {
        std::vector<int32_t> params;  // indices into paramStates
        bool unsharded = false;
        bool fromPostForward = false;
        Collective agWork;
        bool localPending = false;  // group of one: unshard() called, the copy not yet made
        at::Tensor agOut;
        int64_t agIn = 0, agGroup = 1;
        bool postBackwardDone = false;
        bool backwardBegun = false;
        // A unit of several checkpointed modules (norm + lm_head) recomputes each in its own
        // checkpoint; the step program has one recompute op a micro-batch, the first of them
        // (the others count in the unit's backward).
        bool recomputeRecorded = false;
        bool postForwardCopy = false;
        // Modules of the unit still to run forward: FSDP2 runs a group's pre-forward before
        // the first of its modules and its post-forward after the last (fully_shard of a
        // list of modules), not around each one.
        size_t modulesLeft = 0;
        at::ScalarType agType = at::kFloat, reduceType = at::kFloat;
        // FSDP1 / fairscale: one flat parameter; each parameter at its offset in it.
        bool flat = false;
        at::Tensor flatSharded;  // fp32 master shard [flatShard]
        at::Tensor flatFull;     // the gathered flat parameter; its parameters are views of it
        int64_t flatShard = 0;
        std::vector<int64_t> offset;  // per unit parameter
    };
    struct Reduction {
        int32_t unit;
        Collective work;
        at::Tensor out;    // this rank's reduced shard, flat, reduce dtype
        at::Tensor input;  // the whole input until the reduction is done
        int64_t chunk = 0, me = 0;
        bool inPlace = false;   // Gloo: N in-place reduces, the result copied out of the input
        bool averaged = false;  // reduced with ReduceOp::AVG: already divided by the ranks
    };
    struct Boundary {
        bool exit = false;
        int32_t unit = 0;
        int32_t segAfter = -1;
    };
    struct Seg {
        int32_t unit = 0;
        bool hasCompute = false;
    };

    std::vector<PState> paramStates;
    std::vector<int32_t> paramStateOf;  // ParamId index -> paramStates index
    std::vector<UState> unitStates;
    std::vector<int32_t> unitAt;  // module -> unit whose module list holds it, or -1
    std::vector<Reduction> reductions;
    std::vector<Boundary> boundaries;
    std::vector<int32_t> deferred;  // boundaries whose tensor needs no gradient
    std::vector<Seg> segs;
    std::vector<int32_t> unitStack;
    std::vector<int32_t> postForwardOrder;
    std::vector<std::function<at::Tensor(const at::Tensor&)>> bodies;  // checkpointed units
    int32_t curSeg = -1;
    int64_t segStart = 0, lastBwdMark = 0;
    int32_t mb = 0;
    bool lastMicroBatch = true;
    bool sync = true;
    bool recomputing = false;
    std::unique_ptr<torch::optim::AdamW> adam, hostAdam;

    Impl(const ResolvedPlan& resolved, Groups* gr, Recorder* recorder, RuntimeOptions options)
        : plan(resolved), model(*resolved.model), groups(gr), rec(recorder), opts(options) {}

    int64_t shardN() const { return opts.fsdp ? groups->shardSize : 1; }
    // Tensors on the run's device, and on the host (CPU-offloaded shards).
    at::TensorOptions on(at::ScalarType t) const {
        return at::TensorOptions(t).device(opts.device);
    }
    static at::TensorOptions host(at::ScalarType t) { return at::TensorOptions(t); }
    bool fsdp1() const { return plan.plan.api == PlanApi::Fsdp1; }

    // fsdp_setup.cpp
    void init();
    void setUpUnits();
    PState shardParam(size_t i, std::vector<at::Tensor>& fulls, std::vector<at::Tensor>& masters);
    void makeOptimizers(const std::vector<at::Tensor>& masters);
    void buildFlat(int32_t u, const std::vector<at::Tensor>& fulls,
                   std::vector<at::Tensor>& masters);

    // fsdp_unshard.cpp
    void unshard(int32_t u, Phase phase);
    void waitForUnshard(int32_t u, Phase phase);
    void reshard(int32_t u, bool keepPostForwardCopy);

    // fsdp_reduce.cpp
    static void retire(Reduction& red);
    void retireCompleted();
    void fold(Reduction& red);
    void foldCompleted();
    [[nodiscard]] bool averageInCollective(at::ScalarType reduceType) const;
    void reduce(int32_t u);

    // fsdp_runtime.cpp
    at::Tensor finishForward(int32_t u, at::Tensor y);
    void closeSeg();
    void openSeg(int32_t unit);
    int32_t newBoundary(bool exit, int32_t u);
    at::Tensor attach(const at::Tensor& t, int32_t b);
    void preForward(int32_t u);
    int32_t previousInPostForward(int32_t u) const;
    void postForward(int32_t u);
    void recordBackwardSeg(int32_t s);
    void preBackward(int32_t u);
    void postBackward(int32_t u);
};

}  // namespace shardscope::exec
