// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/fsdp_runtime.h"

#include "engine/exec/cuda_support.h"
#include "engine/exec/fsdp_runtime_impl.h"
#include "engine/exec/tensor_storage.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

namespace shardscope::exec {

namespace {

FsdpRuntime* g_runtime = nullptr;  // the autograd nodes call back into it (one per process)

struct BoundaryFn : torch::autograd::Function<BoundaryFn> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                              int64_t boundary) {
        ctx->saved_data["b"] = boundary;
        return x.view_as(x);
    }
    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        g_runtime->boundaryBackward(ctx->saved_data["b"].toInt());
        return {grads[0], at::Tensor()};
    }
};

}  // namespace

// Post-forward of unit u after its last module ran: reshard, output cast and the
// boundary whose backward runs the unit's pre-backward.
at::Tensor FsdpRuntime::Impl::finishForward(int32_t u, at::Tensor y) {
    const auto& unit = plan.units[u];
    closeSeg();
    postForward(u);
    if (y.is_floating_point() && unit.mixedPrecision.outputDtype)
        y = y.to(scalarType(*unit.mixedPrecision.outputDtype));
    const int32_t exit = newBoundary(true, u);
    if (!unitStack.empty())
        openSeg(unitStack.back());
    else
        curSeg = -1;
    boundaries[exit].segAfter = curSeg;
    return attach(y, exit);
}

void FsdpRuntime::Impl::closeSeg() {
    if (curSeg >= 0 && self->m_segHasCompute && !segs[curSeg].hasCompute) {
        segs[curSeg].hasCompute = true;
        const size_t i =
            rec->begin(OpKind::Forward, Phase::Forward, Stream::Compute, segs[curSeg].unit, mb);
        rec->setStart(i, segStart);
        rec->end(i);
    }
    self->m_segHasCompute = false;
}

void FsdpRuntime::Impl::openSeg(int32_t unit) {
    segs.push_back({unit, false});
    curSeg = static_cast<int32_t>(segs.size() - 1);
    segStart = nowNs();
    self->m_segHasCompute = false;
}

int32_t FsdpRuntime::Impl::newBoundary(bool exit, int32_t u) {
    boundaries.push_back({exit, u, -1});
    return static_cast<int32_t>(boundaries.size() - 1);
}

at::Tensor FsdpRuntime::Impl::attach(const at::Tensor& t, int32_t b) {
    if (t.requires_grad() && at::GradMode::is_enabled()) return BoundaryFn::apply(t, b);
    deferred.push_back(b);
    return t;
}

void FsdpRuntime::Impl::preForward(int32_t u) {
    unshard(u, Phase::Forward);
    waitForUnshard(u, Phase::Forward);
    const auto& unit = plan.units[u];
    if (unit.explicitForwardPrefetch) {
        for (UnitId t : unit.forwardPrefetch)
            unshard(t.value, Phase::Forward);
    } else if (fsdp1() && plan.plan.fsdp1.forwardPrefetch &&
               u + 1 < static_cast<int32_t>(plan.units.size())) {
        unshard(u + 1, Phase::Forward);  // FSDP1 forward_prefetch: the next unit
    }
}

// The unit before u in post-forward order (the implicit backward prefetch target).
int32_t FsdpRuntime::Impl::previousInPostForward(int32_t u) const {
    auto it = std::find(postForwardOrder.begin(), postForwardOrder.end(), u);
    return it != postForwardOrder.end() && it != postForwardOrder.begin() ? *(it - 1) : -1;
}

void FsdpRuntime::Impl::postForward(int32_t u) {
    const auto& unit = plan.units[u];
    if (unit.reshard != Reshard::False) reshard(u, unit.reshard == Reshard::Int);
    // Only parameter groups record the post-forward order (FSDPParamGroup.post_forward).
    if (!unit.params.empty()) postForwardOrder.push_back(u);
}

void FsdpRuntime::Impl::recordBackwardSeg(int32_t s) {
    if (s >= 0 && segs[s].hasCompute) {
        const size_t i =
            rec->begin(OpKind::Backward, Phase::Backward, Stream::Compute, segs[s].unit, mb);
        rec->setStart(i, lastBwdMark);
        rec->end(i);
    }
}

void FsdpRuntime::Impl::preBackward(int32_t u) {
    rec->setCurrent(plan.units[u].displayName() + " pre-backward");
    unitStates[u].backwardBegun = true;
    unshard(u, Phase::Backward);
    waitForUnshard(u, Phase::Backward);
    const auto& unit = plan.units[u];
    if (unit.explicitBackwardPrefetch) {
        for (UnitId t : unit.backwardPrefetch)
            unshard(t.value, Phase::Backward);
    } else if ((!fsdp1() || plan.plan.fsdp1.backwardPrefetch == "BACKWARD_PRE") &&
               !unit.params.empty()) {
        // The implicit prefetch is the parameter group's (FSDPParamGroup.pre_backward;
        // FSDP1's from its handle): a unit without parameters, such as a root whose
        // modules all have units of their own, prefetches nothing.
        if (const int32_t t = previousInPostForward(u); t >= 0) unshard(t, Phase::Backward);
    }
}

void FsdpRuntime::Impl::postBackward(int32_t u) {
    UState& s = unitStates[u];
    if (s.postBackwardDone) return;
    s.postBackwardDone = true;
    // Kept unsharded between micro-batches, resharded after the last one's backward (as
    // samples/apply_plan.py's prepare_micro_batch and the step program do).
    if (plan.units[u].reshardAfterBackward || lastMicroBatch) reshard(u, false);
    // A unit without parameters to train has no parameter group: it reduces nothing.
    if (sync && !plan.units[u].params.empty() && plan.units[u].trainableShardedBytes > 0) reduce(u);
}

FsdpRuntime::FsdpRuntime(const ResolvedPlan& plan, Groups* groups, Recorder* recorder,
                         RuntimeOptions options)
    : m_impl(std::make_unique<Impl>(plan, groups, recorder, options)) {
    m_impl->self = this;
    m_impl->init();
    if (options.blockingCollectives) observeGlooSpans();
    g_runtime = this;
}

FsdpRuntime::~FsdpRuntime() {
    m_impl->coll.stop();
    if (g_runtime == this) g_runtime = nullptr;
}

const at::Tensor& FsdpRuntime::param(ParamId p) const {
    return m_impl->paramStates[m_impl->paramStateOf[p.index()]].unsharded;
}

at::Tensor FsdpRuntime::callModule(ModuleId m, const at::Tensor& input,
                                   const std::function<at::Tensor(const at::Tensor&)>& body) {
    Impl& s = *m_impl;
    const int32_t u = s.unitAt[m.index()];
    // Selective checkpointing: the attention modules of a unit are recomputed in backward.
    if (s.opts.fsdp && u < 0 && !s.recomputing && !s.unitStack.empty() &&
        at::GradMode::is_enabled() &&
        s.plan.units[s.unitStack.back()].activationCheckpointing == AcMode::Attention &&
        s.model.module(m).cls.find("Attention") != std::string::npos)
        return checkpoint(input, body, s.unitStack.back());
    if (!s.opts.fsdp || u < 0 || s.recomputing) return body(input);
    const auto& unit = s.plan.units[u];
    at::Tensor x = input;
    // A unit of several modules: its pre-forward runs before the first of them only (a later
    // one runs inside the group's forward already).
    if (s.unitStates[u].modulesLeft == 0) {
        s.unitStates[u].modulesLeft = std::max<size_t>(1, unit.modules.size());
        // Pre-forward.
        s.closeSeg();
        const int32_t enter = s.newBoundary(false, u);
        s.rec->setCurrent(unit.displayName() + " pre-forward");
        s.preForward(u);
        s.openSeg(u);
        s.boundaries[enter].segAfter = s.curSeg;
        if (x.is_floating_point() && unit.mixedPrecision.paramDtype &&
            unit.mixedPrecision.castForwardInputs)
            x = x.to(s.unitStates[u].agType);
        x = s.attach(x, enter);
    }
    s.unitStack.push_back(u);
    const at::Tensor y = unit.activationCheckpointing == AcMode::Full && at::GradMode::is_enabled()
                             ? checkpoint(x, body, u)
                             : body(x);
    s.unitStack.pop_back();
    if (--s.unitStates[u].modulesLeft > 0) return y;  // the group's other modules run later
    return s.finishForward(u, y);
}

// Runs `body` without saving for backward and recomputes it there (reentrant
// checkpointing, as torch.utils.checkpoint with use_reentrant=True).
at::Tensor FsdpRuntime::checkpoint(const at::Tensor& x,
                                   const std::function<at::Tensor(const at::Tensor&)>& body,
                                   int32_t u) {
    Impl& s = *m_impl;
    s.bodies.push_back(body);
    struct Checkpoint : torch::autograd::Function<Checkpoint> {
        // `anchor` requires grad so the output does even when the unit's input does not
        // (the parameters' gradients come from the recompute's own backward).
        static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                  const at::Tensor& anchor, int64_t bodyIndex, int64_t unit) {
            (void)anchor;
            ctx->saved_data["body"] = bodyIndex;
            ctx->saved_data["unit"] = unit;
            ctx->save_for_backward({x});
            return g_runtime->m_impl->bodies[static_cast<size_t>(bodyIndex)](x);
        }
        static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                       torch::autograd::variable_list grads) {
            Impl& s = *g_runtime->m_impl;
            const at::Tensor x = ctx->get_saved_variables()[0];
            const auto bodyIndex = static_cast<size_t>(ctx->saved_data["body"].toInt());
            const auto unit = static_cast<int32_t>(ctx->saved_data["unit"].toInt());
            bool& recorded = s.unitStates[static_cast<size_t>(unit)].recomputeRecorded;
            const bool record = !recorded;
            recorded = true;
            const size_t rc = record ? s.rec->begin(OpKind::Recompute, Phase::Backward,
                                                    Stream::Compute, unit, s.mb)
                                     : Recorder::kNone;
            at::Tensor xd = x.detach().requires_grad_(x.requires_grad());
            at::Tensor y;
            {
                at::AutoGradMode on(true);
                s.recomputing = true;
                y = s.bodies[bodyIndex](xd);
                s.recomputing = false;
            }
            if (record) {
                s.rec->end(rc);
                s.lastBwdMark = nowNs();
            }
            torch::autograd::backward({y}, {grads[0]});
            return {xd.requires_grad() ? xd.grad() : at::Tensor(), at::Tensor(), at::Tensor(),
                    at::Tensor()};
        }
    };
    static const at::Tensor anchor = at::empty({0}).requires_grad_(true);
    at::Tensor y = Checkpoint::apply(x, anchor, static_cast<int64_t>(s.bodies.size() - 1),
                                     static_cast<int64_t>(u));
    noteCompute();
    return y;
}

void FsdpRuntime::boundaryBackward(int64_t b) {
    Impl& s = *m_impl;
    const auto bd = s.boundaries[static_cast<size_t>(b)];
    s.recordBackwardSeg(bd.segAfter);
    if (bd.exit) {
        s.preBackward(bd.unit);
    } else {
        // FSDP1 BACKWARD_POST: prefetch the previous unit once this one's gradients are
        // computed, before its reduce-scatter.
        // Only a unit whose backward has not begun (FSDP1's _needs_pre_backward_unshard).
        if (s.fsdp1() && s.plan.plan.fsdp1.backwardPrefetch == "BACKWARD_POST" &&
            !s.unitStates[bd.unit].postBackwardDone)
            if (const int32_t t = s.previousInPostForward(bd.unit);
                t >= 0 && !s.unitStates[t].backwardBegun)
                s.unshard(t, Phase::Backward);
        s.postBackward(bd.unit);
    }
    s.lastBwdMark = nowNs();
}

void FsdpRuntime::beginMicroBatch(int32_t mb, bool syncGradients, bool last) {
    Impl& s = *m_impl;
    s.mb = mb;
    s.lastMicroBatch = last;
    s.sync = syncGradients;
    s.boundaries.clear();
    s.deferred.clear();
    s.segs.clear();
    s.curSeg = -1;
    s.postForwardOrder.clear();
    s.bodies.clear();
    for (auto& u : s.unitStates)
        u.postBackwardDone = u.backwardBegun = u.recomputeRecorded = false;
    m_segHasCompute = false;
}

void FsdpRuntime::backward(const at::Tensor& loss) {
    Impl& s = *m_impl;
    s.lastBwdMark = nowNs();
    if (!s.opts.fsdp) {
        torch::autograd::backward({loss});
        return;
    }
    torch::autograd::backward({loss});
    // Boundaries whose tensor needed no gradient (the model's token-id input): their
    // segment's backward has finished when autograd returns.
    for (auto it = s.deferred.rbegin(); it != s.deferred.rend(); ++it) {
        s.recordBackwardSeg(s.boundaries[static_cast<size_t>(*it)].segAfter);
        s.lastBwdMark = nowNs();
    }
    // The root's final callback: post-backward of every unit that has not run it, in
    // unit order (FSDPState._root_post_backward_final_callback over all states).
    for (size_t u = 0; u < s.unitStates.size(); ++u)
        s.postBackward(static_cast<int32_t>(u));
    // FSDP2's finalize_backward lets go of the reduce-scatter inputs that are done.
    s.retireCompleted();
}

void FsdpRuntime::optimizerStep() {
    Impl& s = *m_impl;
    s.rec->setCurrent("optimizer step (waiting for the gradient reductions)");
    if (s.opts.fsdp) {
        // The watcher finishes its waits first: one Gloo work must not be waited on by two
        // threads at once. The step starts when every reduction is done (waiting is idle).
        s.coll.drain();
        for (auto& red : s.reductions)
            red.work.wait();
    }
    const size_t st =
        s.rec->begin(OpKind::OptimizerStep, Phase::Optimizer, Stream::Compute, 0, s.mb);
    if (s.opts.fsdp) {
        for (auto& red : s.reductions) {
            red.work.wait();
            s.fold(red);
        }
        s.reductions.clear();
    }
    s.rec->setCurrent("optimizer step");
    // zero_grad(set_to_none=True): the gradients are freed.
    auto stepAndFree = [](torch::optim::AdamW& opt) {
        opt.step();
        for (auto& group : opt.param_groups())
            for (auto& p : group.params())
                p.mutable_grad() = at::Tensor();
    };
    if (s.adam) stepAndFree(*s.adam);
    s.rec->end(st);
    if (s.hostAdam) {  // offloaded shards: the host's optimizer step
        s.rec->setCurrent("optimizer step (host)");
        const size_t h =
            s.rec->begin(OpKind::OptimizerStep, Phase::Optimizer, Stream::Host, 0, s.mb);
        stepAndFree(*s.hostAdam);
        s.rec->end(h);
    }
}

std::vector<at::Tensor> FsdpRuntime::fullParameters() {
    Impl& s = *m_impl;
    std::vector<at::Tensor> out;
    std::vector<at::Tensor> flatFull(s.unitStates.size());
    for (size_t u = 0; u < s.unitStates.size(); ++u) {
        const auto& st = s.unitStates[u];
        if (!s.opts.fsdp || !st.flat || s.plan.noShard || !st.flatSharded.defined()) continue;
        const int64_t n = s.groups->shardSize;
        at::Tensor gathered = at::empty({n * st.flatShard}, s.on(at::kFloat));
        at::Tensor local = st.flatSharded.detach().to(s.opts.device).contiguous();
        s.groups->shard->_allgather_base(gathered, local)->wait();
        flatFull[u] = gathered;
    }
    for (auto& p : s.paramStates) {
        const int32_t unit =
            s.plan.unitOfParam[p.id.index()].valid() ? s.plan.unitOfParam[p.id.index()].value : 0;
        const auto& st = s.unitStates[static_cast<size_t>(unit)];
        if (s.opts.fsdp && st.flat && !s.plan.noShard) {
            const size_t k = static_cast<size_t>(
                std::find(st.params.begin(), st.params.end(), s.paramStateOf[p.id.index()]) -
                st.params.begin());
            out.push_back(flatFull[static_cast<size_t>(unit)]
                              .narrow(0, st.offset[k], p.unsharded.numel())
                              .view(p.unsharded.sizes())
                              .clone());
            continue;
        }
        if (!s.opts.fsdp || s.plan.noShard) {
            out.push_back(p.unsharded.detach().clone());
            continue;
        }
        const int64_t n = s.groups->shardSize;
        at::Tensor gathered = at::empty({n * p.sharded.numel()}, s.on(at::kFloat));
        at::Tensor local = p.sharded.detach().to(s.opts.device).reshape({-1}).contiguous();
        s.groups->shard->_allgather_base(gathered, local)->wait();
        auto shape = p.shape;
        shape[0] = n * p.rows;
        out.push_back(gathered.view(shape).narrow(0, 0, p.d0).reshape(p.trueShape).clone());
    }
    return out;
}

c10::Device FsdpRuntime::device() const {
    return m_impl->opts.device;
}

int64_t FsdpRuntime::shardedBytes() const {
    int64_t b = 0;
    for (const auto& p : m_impl->paramStates)
        if (p.sharded.defined()) b += p.sharded.numel() * p.sharded.element_size();
    return b;
}

}  // namespace shardscope::exec
