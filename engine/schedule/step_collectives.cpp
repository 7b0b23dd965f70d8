// SPDX-License-Identifier: Apache-2.0
// The step program's unshard, reshard and reduce (step_builder.h).
#include "engine/schedule/step_builder.h"

namespace shardscope {

RankGroup StepBuilder::placed(int64_t size, bool contiguous) const {
    RankGroup gr;
    gr.size = static_cast<int32_t>(size);
    const int64_t dpn = std::max<int64_t>(1, m_opts.devicesPerNode);
    if (contiguous) {
        gr.perNode = static_cast<int32_t>(std::min(size, dpn));
    } else {  // stride = shard size: ranks of one shard index on a node
        const int64_t per =
            m_plan.shardSize >= dpn ? 1 : dpn / std::max<int64_t>(1, m_plan.shardSize);
        gr.perNode = static_cast<int32_t>(std::min(size, per));
    }
    gr.nodes = static_cast<int32_t>((size + gr.perNode - 1) / gr.perNode);
    return gr;
}

void StepBuilder::planGroups() {
    m_shardGroup = placed(m_plan.shardSize, true);
    m_replicateGroup =
        placed(m_plan.noShard ? m_plan.worldSize : m_plan.replicateSize, m_plan.noShard);
    for (const auto& u : m_plan.units)
        m_postForwardGroup.push_back(u.reshard == Reshard::Int ? placed(u.reshardK, true)
                                                               : m_shardGroup);
    const size_t n = m_plan.units.size();
    m_unsharded.assign(n, 0);
    m_pendingAg.assign(n, OpId());
    m_pendingLocal.assign(n, 0);
    m_agBuf.assign(n, BufferId());
    m_unshardedBuf.assign(n, BufferId());
    m_unshardedRest.assign(n, {});
    m_postForwardBuf.assign(n, BufferId());
    m_lastFree.assign(n, OpId());
    m_gradReduced.assign(n, 0);
    m_accumulatedGrad.assign(n, BufferId());
}

// unshard(): copy-in and all-gather of unit u, unless its parameters are resident or
// already being gathered (FSDPParamGroup.unshard).
void StepBuilder::unshard(int32_t u, Phase phase, int32_t mb) {
    // A unit without parameters has no parameter group and never all-gathers.
    if (m_unsharded[u] || m_pendingAg[u].valid() || m_pendingLocal[u] || m_plan.noShard ||
        m_plan.units[u].params.empty())
        return;
    const auto& unit = m_plan.units[u];
    const bool fromPostForward = phase == Phase::Backward && unit.reshard == Reshard::Int;
    const RankGroup gr = fromPostForward ? m_postForwardGroup[u] : m_shardGroup;
    // FSDP2 over a group of one gathers nothing: unshard() only records an event, and
    // wait_for_unshard() copies each parameter into its unsharded storage on the current
    // stream (FSDPParamGroup's world_size == 1 path). Prefetching it does nothing.
    if (gr.size == 1 && !m_plan.flatParams && !unit.offload.enabled) {
        m_pendingLocal[u] = 1;
        return;
    }
    OpId h2d;
    if (unit.offload.enabled) {
        Op h{OpKind::H2D, phase, Stream::H2D, UnitId(u), mb};
        h.memBytes = static_cast<double>(unit.shardedBytes);
        h2d = add(std::move(h));
    }
    Op& ci = emit(OpKind::CopyIn, phase, Stream::CopyIn, UnitId(u), mb);
    ci.memBytes =
        2.0 * static_cast<double>(fromPostForward ? unit.postForwardBytes : unit.shardedBytes);
    // FSDP1 under a lower param dtype: the cast of its flat shard into the low-precision
    // shard the all-gather sends (_use_low_precision_shard), which reads the shard and
    // writes it in the param dtype: 6 bytes an element from fp32 to bf16, not 8.
    if (fsdp1() && !unit.params.empty()) {
        const int64_t stored = dtypeSize(m_model.param(unit.params[0]).dtype);
        const int64_t ag = dtypeSize(unit.allGatherDtype);
        if (stored != ag)
            ci.memBytes = static_cast<double>(unit.shardedNumel) * static_cast<double>(stored + ag);
    }
    // FSDP1's gathered flat buffer is the unsharded parameters themselves.
    m_agBuf[u] =
        buffer(unit.unshardedBytes,
               m_plan.flatParams ? MemCategory::UnshardedParams : MemCategory::AllGatherBuffer,
               Stream::CopyIn, unit.allGatherDtype);
    ci.allocs.push_back(m_agBuf[u]);
    if (h2d.valid()) ci.waits.push_back(h2d);
    // FSDP1 limit_all_gathers: at most two unsharded units in flight; the CPU blocks on
    // the oldest one's free event (_limiter_utils._FreeEventQueue, limit 2).
    if (fsdp1() && m_plan.plan.fsdp1.limitAllGathers && m_inflightFrees.size() >= 2) {
        ci.waits.push_back(m_inflightFrees.front());
        ci.cpuBlocks = true;
        m_inflightFrees.erase(m_inflightFrees.begin());
    }
    const OpId ciId = lastOp();
    Op& agOp = emit(OpKind::AllGather, phase, Stream::AllGather, UnitId(u), mb);
    agOp.commBytes = unit.unshardedBytes;
    agOp.groupSize = gr.size;
    agOp.groupNodes = gr.nodes;
    agOp.ranksPerNode = gr.perNode;
    agOp.processGroup = fromPostForward && gr.size != m_shardGroup.size ? 2 : 0;
    agOp.waits.push_back(ciId);
    // In forward the all-gather streams wait on the previous group's copy-out, recorded
    // when the current group waited for its unshard; it lets the previous flat buffer go.
    if (phase == Phase::Forward && m_agStreamWait.valid()) agOp.waits.push_back(m_agStreamWait);
    m_pendingAg[u] = lastOp();
}

// wait_for_unshard(): the copy-out on the compute stream, when the unit is about to run.
void StepBuilder::waitForUnshard(int32_t u, Phase phase, int32_t mb) {
    if (m_pendingLocal[u]) {
        localCopyOut(u, phase, mb);
        return;
    }
    if (!m_pendingAg[u].valid()) return;
    if (m_plan.flatParams) {
        // FSDP1 / fairscale: the all-gather wrote the padded flat parameter itself and
        // the parameters become views of it (FlatParamHandle._use_unsharded_views): no
        // copy. The compute stream waits for the all-gather here, and the gathered
        // buffer is the unsharded parameters until the reshard frees it.
        Op co{OpKind::CopyOut, phase, Stream::Compute, UnitId(u), mb};
        co.waits.push_back(m_pendingAg[u]);
        m_unshardedBuf[u] = m_agBuf[u];
        m_agBuf[u] = BufferId();
        add(std::move(co));
        m_pendingAg[u] = OpId();
        m_unsharded[u] = 1;
        return;
    }
    const auto& unit = m_plan.units[u];
    const bool fromPostForward = phase == Phase::Backward && unit.reshard == Reshard::Int;
    Op& co = emit(OpKind::CopyOut, phase, Stream::Compute, UnitId(u), mb);
    co.memBytes = 2.0 * static_cast<double>(unit.unshardedBytes);
    co.waits.push_back(m_pendingAg[u]);
    m_unshardedBuf[u] = buffer(unit.unshardedBytes, MemCategory::UnshardedParams, Stream::Compute,
                               unit.allGatherDtype);
    co.allocs.push_back(m_unshardedBuf[u]);
    if (phase == Phase::Forward) {
        // Release the previous group's flat buffer; keep this one until the next group.
        if (m_stashedAg.valid()) co.frees.push_back(m_stashedAg);
        m_agStreamWait = m_stashedCopyOut;
        m_stashedAg = m_agBuf[u];
    } else {
        co.frees.push_back(m_agBuf[u]);
    }
    m_agBuf[u] = BufferId();
    if (fromPostForward && m_postForwardBuf[u].valid()) {
        co.frees.push_back(m_postForwardBuf[u]);
        m_postForwardBuf[u] = BufferId();
    }
    co.freesFirst = static_cast<uint8_t>(co.frees.size());
    const OpId id = lastOp();
    if (phase == Phase::Forward) m_stashedCopyOut = id;
    m_pendingAg[u] = OpId();
    m_unsharded[u] = 1;
}

// FSDP2's unshard over a group of one, on the compute stream: per parameter, the shard
// cast to the parameter dtype (all_gather_inputs; a temporary, none without a cast) and
// copied into the unsharded storage (tensor.copy_).
void StepBuilder::localCopyOut(int32_t u, Phase phase, int32_t mb) {
    const auto& unit = m_plan.units[u];
    Op co{OpKind::CopyOut, phase, Stream::Compute, UnitId(u), mb};
    const int64_t agSize = dtypeSize(unit.allGatherDtype);
    int64_t cast = 0;
    for (ParamId pid : unit.params) {
        const auto& pi = m_model.param(pid);
        if (pi.dtype != unit.allGatherDtype) cast += pi.bytes() + pi.numel * agSize;
    }
    co.memBytes = static_cast<double>(cast + 2 * unit.unshardedBytes);
    if (phase == Phase::Backward && unit.reshard == Reshard::Int && m_postForwardBuf[u].valid()) {
        co.frees.push_back(m_postForwardBuf[u]);
        co.freesFirst = 1;
        m_postForwardBuf[u] = BufferId();
    }
    // Per parameter: its cast (a temporary, released when the next one is made), then
    // its storage (alloc_storage).
    co.interleaved = true;
    for (ParamId pid : unit.params) {
        const auto& pi = m_model.param(pid);
        if (pi.dtype != unit.allGatherDtype) {
            const BufferId t = buffer(pi.numel * agSize, MemCategory::UnshardedParams,
                                      Stream::Compute, unit.allGatherDtype);
            co.allocs.push_back(t);
            co.frees.push_back(t);
        }
        const BufferId b = buffer(pi.numel * agSize, MemCategory::UnshardedParams, Stream::Compute,
                                  unit.allGatherDtype);
        co.allocs.push_back(b);
        if (!m_unshardedBuf[u].valid())
            m_unshardedBuf[u] = b;
        else
            m_unshardedRest[u].push_back(b);
    }
    add(std::move(co));
    m_pendingLocal[u] = 0;
    m_unsharded[u] = 1;
}

void StepBuilder::unshardAndWait(int32_t u, Phase phase, int32_t mb) {
    unshard(u, phase, mb);
    waitForUnshard(u, phase, mb);
}

// Frees unit u's unsharded parameters as part of op `at` (a CPU-side reshard).
void StepBuilder::reshardAt(int32_t u, OpId at, bool keepPostForwardCopy) {
    if (!m_unsharded[u] || m_plan.noShard) return;
    op(at).frees.push_back(m_unshardedBuf[u]);
    for (BufferId b : m_unshardedRest[u])
        op(at).frees.push_back(b);
    m_unshardedRest[u].clear();
    m_unshardedBuf[u] = BufferId();
    if (keepPostForwardCopy) {
        m_postForwardBuf[u] = buffer(m_plan.units[u].postForwardBytes, MemCategory::UnshardedParams,
                                     Stream::Compute, m_plan.units[u].allGatherDtype);
        op(at).allocs.push_back(m_postForwardBuf[u]);
    }
    m_unsharded[u] = 0;
    m_lastFree[u] = at;
    if (fsdp1()) m_inflightFrees.push_back(at);
}

void StepBuilder::prefetchForward(int32_t u, int32_t mb) {
    const auto& unit = m_plan.units[u];
    if (unit.explicitForwardPrefetch) {
        for (UnitId t : unit.forwardPrefetch)
            unshard(t.value, Phase::Forward, mb);
    } else if (fsdp1() && m_plan.plan.fsdp1.forwardPrefetch &&
               u + 1 < static_cast<int32_t>(m_plan.units.size())) {
        unshard(u + 1, Phase::Forward, mb);
    }
}

void StepBuilder::reduceUnit(int32_t u, int32_t mb, bool sync) {
    const auto& unit = m_plan.units[u];
    if (!sync) return;  // gradients stay unsharded (requires_gradient_sync(False))
    // A unit without parameters to train has no parameter group (FSDP2's fully_shard on
    // a module whose parameters are all ignored or owned by other units, a parameterless
    // root) or none with a gradient: it reduces nothing, in FSDP and in HSDP.
    if (unit.params.empty() || unit.trainableShardedBytes == 0) return;
    SmallVector<BufferId, 4> grads;
    for (int32_t i : m_table.unitSegs(u))
        for (BufferId* gb : {&m_gradSegBuf[i], &m_gradLateBuf[i]})
            if (gb->valid()) {
                grads.push_back(*gb);
                *gb = BufferId();
            }
    if (m_accumulatedGrad[u].valid()) {
        grads.push_back(m_accumulatedGrad[u]);
        m_accumulatedGrad[u] = BufferId();
    }
    Op& ci = emit(OpKind::ReduceScatterCopyIn, Phase::Backward, Stream::Compute, UnitId(u), mb);
    const int64_t rsIn = unshardedElems(unit) * dtypeSize(unit.reduceDtype);
    // FSDP2 copies the gradients into the reduce-scatter input (torch._chunk_cat, casting
    // on the way). A FlatParameter's gradient is already flat: FSDP1 and fairscale only
    // cast it where the reduce dtype differs from the gradient's, and copy nothing where
    // it does not.
    ci.flatGradCast = m_plan.flatParams;
    if (!m_plan.flatParams || unit.reduceDtype != unit.allGatherDtype)
        ci.memBytes = static_cast<double>(unit.unshardedBytes + rsIn);
    if (m_prevReduce.valid())
        ci.waits.push_back(m_prevReduce);  // waits on the previous reduce-scatter
    const BufferId in =
        buffer(rsIn, MemCategory::ReduceScatterBuffer, Stream::Compute, unit.reduceDtype);
    ci.allocs.push_back(in);
    // FSDP2 drops the previous reduce-scatter's input at this post-backward, once that
    // reduce-scatter is done (this copy-in waits for it), not the moment it completes,
    // and before it makes this one's (FSDPParamGroup.post_backward sets
    // comm_ctx.reduce_scatter_state to None, then calls foreach_reduce): the two are
    // never live together. The gradients go after the copy.
    if (m_prevRsIn.valid()) {
        ci.frees.push_back(m_prevRsIn);
        ci.freesFirst = 1;
    }
    for (BufferId gb : grads)
        ci.frees.push_back(gb);
    const OpId ciId = lastOp();
    Op& rs = emit(m_plan.noShard ? OpKind::AllReduce : OpKind::ReduceScatter, Phase::Backward,
                  Stream::ReduceScatter, UnitId(u), mb);
    const RankGroup gr = m_plan.noShard ? m_replicateGroup : m_shardGroup;
    rs.commBytes = rsIn;
    rs.groupSize = gr.size;
    rs.groupNodes = gr.nodes;
    rs.ranksPerNode = gr.perNode;
    rs.processGroup = m_plan.noShard ? 1 : 0;
    // FSDP2 over a group of one copies the input to the output on the reduce-scatter
    // stream instead (foreach_reduce's world_size == 1 branch).
    if (gr.size == 1 && !m_plan.noShard && !m_plan.flatParams)
        rs.memBytes = 2.0 * static_cast<double>(rsIn);
    rs.waits.push_back(ciId);
    const BufferId sharded =
        buffer(unit.shardedBytes, MemCategory::Gradients, Stream::ReduceScatter,
               unit.params.empty() ? DType::Float32 : m_model.param(unit.params[0]).dtype);
    rs.allocs.push_back(sharded);
    m_prevRsIn = in;
    m_prevReduce = lastOp();
    m_reduceOps.push_back(m_prevReduce);
    // A unit reduced in an earlier micro-batch of this step already has its sharded
    // .grad: this reduce-scatter's output is added to it and dropped (FSDP2's
    // foreach_reduce `grad._local_tensor += new_sharded_grad`, FSDP1's
    // `_saved_grad_shard += sharded_grad`), so the step holds one sharded gradient
    // however many micro-batches reduce.
    const bool accumulate = m_gradReduced[u] != 0;
    m_gradReduced[u] = 1;
    const bool toHost = unit.offload.enabled && !m_opts.hostIsDevice;
    if (!accumulate && !toHost) m_shardedGrads.push_back(sharded);
    if (m_plan.hsdp && !m_plan.noShard) {
        Op ar{OpKind::AllReduce, Phase::Backward, Stream::AllReduce, UnitId(u), mb};
        ar.commBytes = unit.shardedNumel * dtypeSize(unit.reduceDtype);
        ar.groupSize = m_replicateGroup.size;
        ar.groupNodes = m_replicateGroup.nodes;
        ar.ranksPerNode = m_replicateGroup.perNode;
        ar.processGroup = 1;
        ar.waits.push_back(m_prevReduce);
        m_reduceOps.push_back(add(std::move(ar)));
    }
    if (unit.offload.enabled) {
        Op d{OpKind::D2H, Phase::Backward, Stream::D2H, UnitId(u), mb};
        d.memBytes = static_cast<double>(unit.shardedBytes);
        d.waits.push_back(m_reduceOps.back());
        // CPUOffloadPolicy: the reduced shard is copied to the host's gradient and the
        // device copy dropped (foreach_reduce's non_blocking .to(cpu)); it does not stay
        // on the device until the optimizer step (unless the device is the host).
        if (toHost) d.frees.push_back(sharded);
        m_reduceOps.push_back(add(std::move(d)));
    }
    if (accumulate && !toHost) {
        // HSDP keeps the output as the all-reduce's input until the end of backward
        // (FSDPParamGroup._all_reduce_state, cleared by finalize_backward); otherwise it
        // goes as foreach_reduce returns, right after the reduce-scatter is issued.
        if (m_plan.hsdp && !m_plan.noShard)
            m_accumulatedOutputs.push_back(sharded);
        else
            op(m_prevReduce).frees.push_back(sharded);
    }
}

}  // namespace shardscope
