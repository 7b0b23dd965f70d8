// SPDX-License-Identifier: Apache-2.0
// FsdpRuntime's unshard, wait-for-unshard and reshard (fsdp_runtime_impl.h).
#include "engine/exec/fsdp_runtime_impl.h"

#include "engine/exec/tensor_storage.h"

#include <algorithm>

namespace shardscope::exec {

void FsdpRuntime::Impl::unshard(int32_t u, Phase phase) {
    UState& s = unitStates[u];
    if (s.unsharded || s.agWork || s.localPending || s.params.empty()) return;
    const auto& unit = plan.units[u];
    s.fromPostForward =
        phase == Phase::Backward && unit.reshard == Reshard::Int && s.postForwardCopy;
    c10d::Backend& pg =
        s.fromPostForward ? groups->postForwardGroup(unit.reshardK) : *groups->shard;
    const int64_t n = pg.getSize(), me = pg.getRank();
    // FSDP2 over a group of one gathers nothing: the copy is made at wait_for_unshard, on
    // the compute stream (FSDPParamGroup's world_size == 1 path), as the step program has.
    if (n == 1 && !s.flat && !unit.offload.enabled) {
        s.localPending = true;
        return;
    }
    int64_t in = s.flat ? s.flatShard : 0;
    if (!s.flat)
        for (int32_t pi : s.params)
            in += (s.fromPostForward ? paramStates[pi].pfRows : paramStates[pi].rows) *
                  paramStates[pi].row;
    rec->setCurrent(unit.displayName() + " all-gather");
    // CPU offload: the shards come to the device first (on a CPU run, a copy).
    std::vector<at::Tensor> onDevice;
    if (unit.offload.enabled && !s.fromPostForward) {
        const size_t h2d = rec->begin(OpKind::H2D, phase, Stream::H2D, u, mb);
        at::NoGradGuard ng;
        const auto toDevice = [&](const at::Tensor& t) {
            return t.detach().to(opts.device, /*non_blocking=*/false, /*copy=*/true);
        };
        if (s.flat) onDevice.push_back(toDevice(s.flatSharded));
        for (int32_t pi : s.flat ? std::vector<int32_t>{} : s.params)
            onDevice.push_back(toDevice(paramStates[pi].sharded));
        rec->end(h2d);
    }
    const size_t ci = rec->begin(OpKind::CopyIn, phase, Stream::CopyIn, u, mb);
    if (s.flat) {
        // FSDP1's padded unsharded flat parameter: one storage for the unit's life,
        // re-allocated in place at each unshard (_alloc_storage) and freed at each reshard,
        // so the views autograd saved in forward see the backward's gather.
        const auto bytes = static_cast<size_t>(n * in) * c10::elementSize(s.agType);
        if (!s.flatFull.defined())
            s.flatFull = at::empty({n * in}, on(s.agType));
        else
            resizeStorage(s.flatFull, bytes);
        s.agOut = s.flatFull;
    } else {
        s.agOut = at::empty({n * in}, on(s.agType));
    }
    at::Tensor input = s.agOut.narrow(0, me * in, in);
    int64_t off = 0;
    {
        at::NoGradGuard ng;
        if (s.flat) input.copy_(onDevice.empty() ? s.flatSharded : onDevice[0]);
        size_t k = 0;
        for (int32_t pi : s.flat ? std::vector<int32_t>{} : s.params) {
            const PState& p = paramStates[pi];
            const at::Tensor& src = !onDevice.empty()   ? onDevice[k++]
                                    : s.fromPostForward ? p.postForward
                                                        : p.sharded;
            const int64_t len = src.numel();
            input.narrow(0, off, len).copy_(src.reshape({len}));
            off += len;
        }
    }
    rec->end(ci);
    const size_t ag = coll.begin(OpKind::AllGather, phase, Stream::AllGather, u, mb);
    s.agWork = coll.allGather(pg, s.agOut, input, in);
    s.agIn = in;
    s.agGroup = n;
    coll.issued(s.agWork, ag);
}

void FsdpRuntime::Impl::waitForUnshard(int32_t u, Phase phase) {
    UState& s = unitStates[u];
    if (s.localPending) {
        // Each parameter cast to its dtype and copied into its unsharded storage.
        const size_t co = rec->begin(OpKind::CopyOut, phase, Stream::Compute, u, mb);
        for (int32_t pi : s.params) {
            PState& p = paramStates[pi];
            resizeStorage(p.unsharded,
                          static_cast<size_t>(p.unsharded.numel()) * p.unsharded.element_size());
            const at::Tensor& src = s.fromPostForward ? p.postForward : p.sharded;
            auto shape = p.shape;
            shape[0] = p.d0;
            copyPreservingVersion(p.flat1d ? p.unsharded.detach().view({-1}) : p.unsharded, 0,
                                  src.reshape({-1}).narrow(0, 0, p.d0 * p.row).view(shape));
            if (s.fromPostForward) p.postForward.reset();
        }
        s.localPending = false;
        s.unsharded = true;
        s.postForwardCopy = false;
        rec->end(co);
        return;
    }
    if (!s.agWork) return;
    // The copy-out starts once the all-gather is done: waiting is idle time on the
    // compute stream, as in the step program, not part of the copy.
    s.agWork.wait();
    const size_t co = rec->begin(OpKind::CopyOut, phase, Stream::Compute, u, mb);
    int64_t off = 0;
    if (s.flat) {
        // The gathered flat buffer is the whole padded flat parameter, and the parameters
        // become views of it, as FSDP1's (FlatParamHandle._use_unsharded_views): no copy.
        // The reshard frees it through them.
        for (size_t k = 0; k < s.params.size(); ++k) {
            PState& p = paramStates[s.params[k]];
            viewPreservingVersion(
                p.unsharded,
                s.agOut.narrow(0, s.offset[k], p.unsharded.numel()).view(p.unsharded.sizes()));
        }
    }
    for (int32_t pi : s.flat ? std::vector<int32_t>{} : s.params) {
        PState& p = paramStates[pi];
        const int64_t rows = s.fromPostForward ? p.pfRows : p.rows;
        resizeStorage(p.unsharded,
                      static_cast<size_t>(p.unsharded.numel()) * p.unsharded.element_size());
        for (int64_t src = 0; src < s.agGroup; ++src) {
            const int64_t r0 = src * rows, r1 = std::min(p.d0, r0 + rows);
            if (r1 <= r0) continue;
            at::Tensor chunk = s.agOut.narrow(0, src * s.agIn + off, (r1 - r0) * p.row);
            auto shape = p.shape;
            shape[0] = r1 - r0;
            copyPreservingVersion(p.flat1d ? p.unsharded.detach().view({-1}) : p.unsharded, r0,
                                  chunk.view(shape));
        }
        off += rows * p.row;
        if (s.fromPostForward) p.postForward.reset();
    }
    s.agWork = Collective();
    // The gathered buffer is dead once copied out; its memory goes now, even if a work
    // still holds the tensor (a Gloo work until its worker thread lets go of it).
    // FSDP1's is the parameters' storage until the reshard.
    if (!s.flat) resizeStorage(s.agOut, 0);
    s.agOut.reset();
    s.unsharded = true;
    s.postForwardCopy = false;
    rec->end(co);
}

void FsdpRuntime::Impl::reshard(int32_t u, bool keepPostForwardCopy) {
    UState& s = unitStates[u];
    if (!s.unsharded || plan.noShard) return;
    const auto& unit = plan.units[u];
    if (keepPostForwardCopy) {
        const int64_t k = unit.reshardK;
        const int64_t j = groups->shardRank % k;
        at::NoGradGuard ng;
        for (int32_t pi : s.params) {
            PState& p = paramStates[pi];
            auto shape = p.shape;
            shape[0] = p.pfRows;
            p.postForward = at::zeros(shape, on(s.agType));
            const int64_t r0 = j * p.pfRows, r1 = std::min(p.d0, r0 + p.pfRows);
            if (r1 > r0)
                p.postForward.narrow(0, 0, r1 - r0)
                    .copy_(p.unsharded.detach().narrow(0, r0, r1 - r0));
        }
        s.postForwardCopy = true;
    }
    for (int32_t pi : s.params)
        resizeStorage(paramStates[pi].unsharded, 0);
    s.unsharded = false;
}

}  // namespace shardscope::exec
