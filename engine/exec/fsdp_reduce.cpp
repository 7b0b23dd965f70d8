// SPDX-License-Identifier: Apache-2.0
// FsdpRuntime's gradient reductions (fsdp_runtime_impl.h).
#include "engine/exec/fsdp_runtime_impl.h"

#include "engine/exec/tensor_storage.h"

#include <algorithm>

namespace shardscope::exec {

// Copies an in-place reduce-scatter's chunk out and frees its input (after it completed).
// Also frees the input's memory: the works may keep their tensors for a while after
// completing (a Gloo work until its worker thread lets go of it, an NCCL work until it
// is destroyed), and FSDP2 frees the reduce-scatter input when the reduction is done.
void FsdpRuntime::Impl::retire(Reduction& red) {
    if (!red.input.defined()) return;
    red.work.wait();
    if (red.inPlace) red.out.copy_(red.input.narrow(0, red.me * red.chunk, red.chunk));
    resizeStorage(red.input, 0);
    red.input.reset();
}

// Lets go of the inputs of the reductions that are done, and adds each unit's later
// ones to its first (foldCompleted).
void FsdpRuntime::Impl::retireCompleted() {
    for (auto& red : reductions)
        if (red.input.defined() && red.work.completed()) retire(red);
    foldCompleted();
}

// A completed reduction becomes the unit's sharded gradients. As FSDP2: the reduced
// shard is divided in place and the sharded gradients are views of it (a copy only where
// the reduce dtype is not fp32); a gradient an earlier micro-batch reduced is added to
// instead (foreach_reduce's `grad += new_sharded_grad`; FSDP1's _saved_grad_shard +=).
void FsdpRuntime::Impl::fold(Reduction& red) {
    retire(red);
    const double divide = static_cast<double>(groups->shardSize * groups->replicateSize);
    if (!red.averaged) red.out.div_(divide);
    const auto asFloat = [](const at::Tensor& t) {
        return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat);
    };
    at::NoGradGuard ng;
    const auto give = [](at::Tensor& param, const at::Tensor& grad) {
        if (param.grad().defined())
            param.mutable_grad().add_(grad);
        else
            param.mutable_grad() = grad;
    };
    auto& u = unitStates[red.unit];
    if (plan.noShard) {
        for (size_t q = 0; q < u.params.size(); ++q) {
            auto& p = paramStates[u.params[q]];
            if (p.trainable)
                give(p.unsharded,
                     red.out.narrow(0, u.offset[q], p.unsharded.numel()).view(p.unsharded.sizes()));
        }
        return;
    }
    if (u.flat) {
        if (u.flatSharded.defined()) give(u.flatSharded, asFloat(red.out));
        return;
    }
    int64_t off = 0;
    for (int32_t pi : u.params) {
        auto& p = paramStates[pi];
        const int64_t len = p.rows * p.row;
        if (p.trainable)
            give(p.sharded, asFloat(red.out.narrow(0, off, len)).view(p.sharded.sizes()));
        off += len;
    }
}

// Gradients reduced every micro-batch: a later reduction of a unit, once it and the
// unit's first one of the step are done, is added to the first and let go, so that the
// step holds one reduced shard per unit as FSDP2 does (it adds each output to the
// sharded gradient as the reduce-scatter is issued).
void FsdpRuntime::Impl::foldCompleted() {
    for (size_t i = 0; i < reductions.size();) {
        Reduction& later = reductions[i];
        const auto first =
            std::find_if(reductions.begin(), reductions.begin() + static_cast<ptrdiff_t>(i),
                         [&](const Reduction& x) { return x.unit == later.unit; });
        if (first == reductions.begin() + static_cast<ptrdiff_t>(i) || !later.work.completed() ||
            !first->work.completed()) {
            ++i;
            continue;
        }
        retire(*first);
        retire(later);
        first->out.add_(later.out);
        reductions.erase(reductions.begin() + static_cast<ptrdiff_t>(i));
    }
}

// FSDP2 (_get_gradient_divide_factors) averages fp32 and bf16 gradients inside the
// collective (ReduceOp::AVG, on Gloo a division on its worker thread, inside its span);
// other reduce dtypes are summed and divided afterwards. The in-place chunked reduces
// stay summed (the division follows, before the optimizer step).
bool FsdpRuntime::Impl::averageInCollective(at::ScalarType reduceType) const {
    return (reduceType == at::kFloat || reduceType == at::kBFloat16) &&
           groups->shardSize * groups->replicateSize > 1 && !coll.inPlaceChunks(*groups->shard);
}

void FsdpRuntime::Impl::reduce(int32_t u) {
    UState& s = unitStates[u];
    const int64_t n = groups->shardSize;
    int64_t in = s.flat ? s.flatShard : 0;
    if (!s.flat)
        for (int32_t pi : s.params)
            in += paramStates[pi].rows * paramStates[pi].row;
    rec->setCurrent(plan.units[u].displayName() +
                    (plan.noShard ? " all-reduce" : " reduce-scatter"));
    const size_t ci =
        rec->begin(OpKind::ReduceScatterCopyIn, Phase::Backward, Stream::Compute, u, mb);
    at::Tensor input = at::zeros({n * in}, on(s.reduceType));
    int64_t off = 0;
    {
        at::NoGradGuard ng;
        if (s.flat)
            for (size_t k = 0; k < s.params.size(); ++k) {
                PState& p = paramStates[s.params[k]];
                const at::Tensor grad = p.unsharded.grad();
                if (!grad.defined()) continue;
                input.narrow(0, s.offset[k], grad.numel()).copy_(grad.reshape({-1}));
                p.unsharded.mutable_grad() = at::Tensor();
            }
        for (int32_t pi : s.flat ? std::vector<int32_t>{} : s.params) {
            PState& p = paramStates[pi];
            at::Tensor grad = p.unsharded.grad();
            if (grad.defined() && p.flat1d) grad = grad.reshape({-1});
            if (grad.defined()) {
                for (int64_t dst = 0; dst < n; ++dst) {
                    const int64_t r0 = dst * p.rows, r1 = std::min(p.d0, r0 + p.rows);
                    if (r1 <= r0) continue;
                    input.narrow(0, dst * in + off, (r1 - r0) * p.row)
                        .copy_(grad.narrow(0, r0, r1 - r0).reshape({-1}));
                }
                p.unsharded.mutable_grad() = at::Tensor();  // freed: the copy holds it
            }
            off += p.rows * p.row;
        }
    }
    rec->end(ci);
    if (plan.noShard) {
        // NO_SHARD: the gradients are all-reduced over every rank, in place.
        const size_t ar =
            coll.begin(OpKind::AllReduce, Phase::Backward, Stream::ReduceScatter, u, mb);
        Reduction red{u, {}, input, {}, in, 0};
        std::vector<at::Tensor> t{input};
        c10d::AllreduceOptions ao;
        red.averaged = averageInCollective(s.reduceType);
        if (red.averaged) ao.reduceOp = c10d::ReduceOp::AVG;
        red.work.works.push_back(groups->replicate->allreduce(t, ao));
        coll.issued(red.work, ar);
        reductions.push_back(std::move(red));
        return;
    }
    const size_t rs =
        coll.begin(OpKind::ReduceScatter, Phase::Backward, Stream::ReduceScatter, u, mb);
    c10d::Backend& pg = *groups->shard;
    Reduction red{u, {}, {}, {}, in, pg.getRank()};
    if (coll.inPlaceChunks(pg)) {
        for (int64_t dst = 0; dst < n; ++dst) {
            std::vector<at::Tensor> t{input.narrow(0, dst * in, in)};
            c10d::ReduceOptions ro;
            ro.rootRank = dst;
            ro.reduceOp = c10d::ReduceOp::SUM;
            red.work.works.push_back(pg.reduce(t, ro));
        }
        red.inPlace = true;
        // The reduced shard's buffer exists from the issue on, as the output of NCCL's
        // reduce-scatter does: retiring copies into it, so no allocation happens then.
        red.out = at::empty({in}, on(s.reduceType));
    } else {
        red.out = at::empty({in}, on(s.reduceType));
        c10d::ReduceScatterOptions ro;
        red.averaged = averageInCollective(s.reduceType);
        ro.reduceOp = red.averaged ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
        red.work.works.push_back(pg._reduce_scatter_base(red.out, input, ro));
    }
    red.input = input;
    input = at::Tensor();
    if (groups->replicateSize > 1) {
        // HSDP: the replicas all-reduce the reduced shard; it needs the reduce-scatter's
        // result, so the CPU waits for it before issuing.
        if (opts.blockingCollectives) {
            coll.waitBlocking(red.work, rs);
        } else {
            coll.drain();
            red.work.wait();
            rec->endAt(rs, nowNs());
        }
        retire(red);
        const size_t ar = coll.begin(OpKind::AllReduce, Phase::Backward, Stream::AllReduce, u, mb);
        std::vector<at::Tensor> t{red.out};
        red.work = Collective();
        c10d::AllreduceOptions ao;
        if (red.averaged) ao.reduceOp = c10d::ReduceOp::AVG;
        red.work.works.push_back(groups->replicate->allreduce(t, ao));
        coll.issued(red.work, ar);
    } else {
        coll.issued(red.work, rs);
    }
    if (opts.blockingCollectives) retire(red);
    if (plan.units[u].offload.enabled) {
        // CPU offload: the reduced shard goes back to the host for its optimizer step.
        coll.drain();
        red.work.wait();
        retire(red);
        const size_t d2h = rec->begin(OpKind::D2H, Phase::Backward, Stream::D2H, u, mb);
        red.out = red.out.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
        rec->end(d2h);
    }
    reductions.push_back(std::move(red));
    retireCompleted();
}

}  // namespace shardscope::exec
