// SPDX-License-Identifier: Apache-2.0
// The step program's forward, recompute and backward passes (step_builder.h).
#include "engine/schedule/step_builder.h"

#include <algorithm>

namespace shardscope {

// FSDP1's (and fairscale's) gradient divide factors over the data-parallel ranks: the
// pre-divide doubles while it divides the size and stays below the size over it
// (DefaultState._get_gradient_predivide_factor: 2 for 2 or 4 ranks, 4 for 8 or 16, 8 for
// 64), the post-divide is the rest (1.5 for 6 ranks).
std::pair<int64_t, double> StepBuilder::flatGradientDivideFactors() const {
    const int64_t dp = m_plan.noShard
                           ? m_replicateGroup.size
                           : m_shardGroup.size * (m_plan.hsdp ? m_replicateGroup.size : 1);
    int64_t pre = 1;
    while (dp % pre == 0 && dp / pre > pre)
        pre *= 2;
    return {pre, static_cast<double>(dp) / static_cast<double>(pre)};
}

// FSDP2 accumulating gradients without a reduce in every micro-batch, with a reduce
// dtype other than the parameters': each backward's gradients come in the param dtype and
// are added at the unit's post-backward to one copy in the reduce dtype, made the first
// time (FSDPParam.to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed),
// which the last micro-batch reduces. Otherwise autograd accumulates in place.
bool StepBuilder::upcastsGradients(const ResolvedUnit& unit) const {
    return !fsdp1() && !m_plan.flatParams && m_opts.microBatches > 1 &&
           !m_plan.plan.syncEveryMicroBatch && unit.reduceDtype != unit.allGatherDtype;
}

// A segment's forward, backward or recompute, emitted (filled in place by the caller).
Op& StepBuilder::computeOp(OpKind kind, Phase phase, const Segment& sg, int32_t mb, double flops,
                           double mem) {
    Op& c = emit(kind, phase, Stream::Compute, UnitId(sg.unit), mb);
    c.flops = flops;
    c.memBytes = mem;
    c.computeDtype = m_plan.units[sg.unit].allGatherDtype;
    c.groupSize = std::max(1, sg.kernels);  // kernels: for the size-dependent efficiency
    c.mix = kind == OpKind::Forward    ? sg.fwdMixId
            : kind == OpKind::Backward ? sg.bwdMixId
                                       : sg.recomputeMixId;
    return c;
}

// Memory-bound kernels moving `moved` bytes in all, added to compute op `c`: to its
// kernel list where it has one, else to its bytes.
void StepBuilder::addMemoryKernels(Op& c, double moved, int64_t kernels) {
    if (c.mix >= 0)
        c.mix = m_mixes.withMemoryKernels(c.mix, moved, kernels, c.computeDtype);
    else
        c.memBytes += moved;
}

void StepBuilder::forward(int32_t mb) {
    m_agStreamWait = OpId();
    m_stashedCopyOut = OpId();
    m_stashedAg = BufferId();
    m_savedBuf.assign(m_table.segs.size(), BufferId());
    m_savedLateBuf.assign(m_table.segs.size(), BufferId());
    std::vector<int32_t> lastSeg(m_plan.units.size(), -1);
    for (size_t i = 0; i < m_table.segs.size(); ++i)
        lastSeg[m_table.segs[i].unit] = static_cast<int32_t>(i);
    std::vector<char> started(m_plan.units.size(), 0);
    // The root's pre-forward runs first, before any child unit.
    unshardAndWait(0, Phase::Forward, mb);
    prefetchForward(0, mb);
    started[0] = 1;
    OpId lastCompute;
    for (size_t i = 0; i < m_table.segs.size(); ++i) {
        const Segment& sg = m_table.segs[i];
        if (!started[sg.unit]) {
            started[sg.unit] = 1;
            unshardAndWait(sg.unit, Phase::Forward, mb);
            prefetchForward(sg.unit, mb);
        }
        Op& c = computeOp(OpKind::Forward, Phase::Forward, sg, mb, sg.fwdFlops, sg.fwdMem);
        const bool late = (sg.recomputes || sg.lateWithoutRecompute) && sg.savedLate > 0;
        m_savedBuf[i] =
            buffer(static_cast<int64_t>(sg.saved - (late ? sg.savedLate : 0.0)),
                   MemCategory::Activations, Stream::Compute, m_plan.units[sg.unit].allGatherDtype);
        c.allocs.push_back(m_savedBuf[i]);
        if (sg.fwdTransient > 0) {
            // The loss's logits and their fp32 upcast: two tensors.
            const int64_t all = static_cast<int64_t>(sg.fwdTransient);
            const DType dt = m_plan.units[sg.unit].allGatherDtype;
            const int64_t e = dtypeSize(dt);
            const int64_t logits = e < 4 ? all / (e + 4) * e : all;
            temporaries(c, {logits, all - logits}, MemCategory::Temporaries, dt);
        }
        m_savedLateBuf[i] = BufferId();
        if (late) {
            m_savedLateBuf[i] = buffer(static_cast<int64_t>(sg.savedLate), MemCategory::Activations,
                                       Stream::Compute, m_plan.units[sg.unit].allGatherDtype);
            c.allocs.push_back(m_savedLateBuf[i]);
        }
        lastCompute = lastOp();
        if (lastSeg[sg.unit] == static_cast<int32_t>(i) && sg.unit != 0) {
            const auto& u = m_plan.units[sg.unit];
            if (u.reshard != Reshard::False)
                reshardAt(sg.unit, lastCompute, u.reshard == Reshard::Int);
        }
    }
    // Root post-forward: frees the last stashed all-gather buffer; the root reshards only
    // if asked (None makes it False).
    if (lastCompute.valid()) {
        if (m_stashedAg.valid()) op(lastCompute).frees.push_back(m_stashedAg);
        m_stashedAg = BufferId();
        if (m_plan.units[0].reshard != Reshard::False)
            reshardAt(0, lastCompute, m_plan.units[0].reshard == Reshard::Int);
    }
}

// Post-forward order: units by the end of their forward. Only parameter groups record it
// (FSDPParamGroup.post_forward): a unit without parameters is not in it, so the unit
// before it prefetches the one after.
std::vector<int32_t> StepBuilder::postForwardOrder() const {
    std::vector<int32_t> order;
    std::vector<int32_t> lastSeg(m_plan.units.size(), -1);
    for (size_t i = 0; i < m_table.segs.size(); ++i)
        lastSeg[m_table.segs[i].unit] = static_cast<int32_t>(i);
    std::vector<std::pair<int32_t, int32_t>> byEnd;
    for (size_t u = 0; u < m_plan.units.size(); ++u)
        if (lastSeg[u] >= 0 && !m_plan.units[u].params.empty())
            byEnd.push_back({lastSeg[u], static_cast<int32_t>(u)});
    std::sort(byEnd.begin(), byEnd.end());
    for (const auto& [_, u] : byEnd)
        order.push_back(u);
    return order;
}

// A checkpointed segment's recompute before its backward: what it saves again, and the
// gradients made before the rest (Segment::gradLateBytes). Returns those gradients'
// bytes; `lateTemp` is what the recompute saves after the last attention.
int64_t StepBuilder::recompute(size_t i, int32_t mb, bool upcast, BufferId& lateTemp) {
    const Segment& sg = m_table.segs[i];
    const int32_t u = sg.unit;
    int64_t lateGrads = 0;
    Op& rc = computeOp(OpKind::Recompute, Phase::Backward, sg, mb, sg.recomputeFlops, 0);
    const BufferId tmp =
        buffer(static_cast<int64_t>(sg.recomputeSaved - sg.recomputeLate), MemCategory::Activations,
               Stream::Compute, m_plan.units[sg.unit].allGatherDtype);
    rc.allocs.push_back(tmp);
    if (sg.recomputeLate > 0) {
        lateTemp = buffer(static_cast<int64_t>(sg.recomputeLate), MemCategory::Activations,
                          Stream::Compute, m_plan.units[sg.unit].allGatherDtype);
        rc.allocs.push_back(lateTemp);
    }
    // Selective: PyTorch reaches the checkpointed attention in the middle of the
    // layer's backward; what comes after it in forward has made its gradients
    // and freed its activations by then.
    if (!m_gradLateBuf[i].valid() && sg.gradLateBytes > 0) {
        const BufferId lb = buffer(sg.gradLateBytes, MemCategory::Gradients, Stream::Compute,
                                   m_plan.units[sg.unit].allGatherDtype);
        rc.allocs.push_back(lb);
        lateGrads = sg.gradLateBytes;
        if (upcast)
            m_transientGrads.push_back({u, lb});
        else
            m_gradLateBuf[i] = lb;
    }
    if (m_savedLateBuf[i].valid()) rc.frees.push_back(m_savedLateBuf[i]);
    m_savedTemp.push_back(tmp);
    return lateGrads;
}

// The post-backward's own kernels, with the unit's last backward ones: the accumulating
// copy in the reduce dtype, FSDP1's flat gradient and its divisions. Returns the
// gradient bytes it allocates.
int64_t StepBuilder::postBackwardKernels(Op& c, int32_t u, bool sync, bool upcast) {
    int64_t newGrads = 0;
    // Accumulating in the reduce dtype: the unit's post-backward makes the copy that
    // every later micro-batch adds to (FSDPParam.to_accumulated_grad_if_needed, then
    // accumulate_unsharded_grad_if_needed): a cast (read the param dtype, write the
    // reduce dtype) the first time, an add (read both, write) after, one kernel per
    // parameter on the compute stream.
    if (upcast && !m_plan.units[u].params.empty()) {
        const auto& unit = m_plan.units[u];
        const int64_t agSize = dtypeSize(unit.allGatherDtype);
        const int64_t elems = unshardedElems(unit);
        const int64_t redSize = dtypeSize(unit.reduceDtype);
        const bool first = !m_accumulatedGrad[u].valid();
        if (first) {
            m_accumulatedGrad[u] =
                buffer(elems * redSize, MemCategory::Gradients, Stream::Compute, unit.reduceDtype);
            c.allocs.push_back(m_accumulatedGrad[u]);
            newGrads += elems * redSize;
        }
        const double moved = static_cast<double>(elems) *
                             static_cast<double>(first ? agSize + redSize : 2 * redSize + agSize);
        addMemoryKernels(c, moved, static_cast<int64_t>(unit.params.size()));
    }
    // A FlatParameter's (FSDP1, fairscale) parameters are views of it (split, then
    // view), so autograd makes the flat gradient at the end of the unit's backward:
    // SplitWithSizesBackward's cat, one kernel reading every parameter's gradient and
    // writing the flat one (a device-to-device copy for a unit of one parameter). On
    // an H200 a Llama-8B layer's took 0.21-0.25 ms, a quarter of its post-backward's
    // copies. Where it reduces, the post-backward then divides the gradient in place
    // before and after the reduction (a sum), by factors of the data-parallel size
    // (FSDP1's _div_if_needed, fairscale's the same): each a read and a write in the
    // reduce dtype, the first of the unsharded gradient, the second of the reduced
    // shard (of the whole gradient under NO_SHARD). They run on the post-backward
    // stream; counted here, with the unit's last backward kernels.
    if (m_plan.flatParams && !m_plan.units[u].params.empty()) {
        const auto& unit = m_plan.units[u];
        const auto elems = static_cast<double>(unshardedElems(unit));
        addMemoryKernels(c, 2.0 * elems * static_cast<double>(dtypeSize(unit.allGatherDtype)), 1);
        const auto [pre, post] = flatGradientDivideFactors();
        const double reduced = elems * static_cast<double>(dtypeSize(unit.reduceDtype));
        if (sync && pre > 1) addMemoryKernels(c, 2.0 * reduced, 1);
        if (sync && post > 1)
            addMemoryKernels(
                c, 2.0 * reduced / static_cast<double>(m_plan.noShard ? 1 : m_shardGroup.size), 1);
    }
    return newGrads;
}

void StepBuilder::backward(int32_t mb, bool sync) {
    // Post-forward order: units by the end of their forward. Only parameter groups
    // record it (FSDPParamGroup.post_forward): a unit without parameters is not in it,
    // so the unit before it prefetches the one after.
    const std::vector<int32_t> order = postForwardOrder();
    std::vector<int32_t> posInOrder(m_plan.units.size(), -1);
    for (size_t i = 0; i < order.size(); ++i)
        posInOrder[order[i]] = static_cast<int32_t>(i);
    std::vector<int32_t> firstSeg(m_plan.units.size(), -1);
    for (size_t i = m_table.segs.size(); i-- > 0;)
        firstSeg[m_table.segs[i].unit] = static_cast<int32_t>(i);
    // Units fed by the model input (token ids need no gradient) and the root reduce
    // in the root's final callback at the end of backward.
    std::vector<int32_t> deferred;
    const int32_t inputUnit = m_table.segs.empty() ? 0 : m_table.segs.front().unit;
    std::vector<char> begun(m_plan.units.size(), 0);
    const auto bp = m_plan.plan.fsdp1.backwardPrefetch;
    for (size_t i = m_table.segs.size(); i-- > 0;) {
        const Segment& sg = m_table.segs[i];
        const int32_t u = sg.unit;
        const bool upcast = upcastsGradients(m_plan.units[u]);
        if (!begun[u]) {
            begun[u] = 1;
            unshardAndWait(u, Phase::Backward, mb);
            const bool pre = !fsdp1() || bp == "BACKWARD_PRE";
            if (m_plan.units[u].explicitBackwardPrefetch) {
                for (UnitId t : m_plan.units[u].backwardPrefetch)
                    unshard(t.value, Phase::Backward, mb);
            } else if (pre && posInOrder[u] > 0 && !m_plan.units[u].params.empty()) {
                // Implicit prefetch is the parameter group's (FSDPParamGroup.pre_backward;
                // FSDP1 prefetches from a handle): a unit without parameters, such as a
                // root whose modules all have units of their own, prefetches nothing, so
                // the loss's backward runs with no parameters gathered.
                unshard(order[posInOrder[u] - 1], Phase::Backward, mb);
            }
        }
        BufferId lateTemp;
        const int64_t lateGrads = sg.recomputes ? recompute(i, mb, upcast, lateTemp) : 0;
        Op& c = computeOp(OpKind::Backward, Phase::Backward, sg, mb, sg.bwdFlops, sg.bwdMem);
        if (lateTemp.valid()) {  // Segment::recomputeLate: gone before the rest is made
            c.frees.push_back(lateTemp);
            c.freesFirst = 1;
            lateTemp = BufferId();
        }
        int64_t newGrads = 0;
        const int64_t restGrads = sg.gradBytes - (sg.recomputes ? sg.gradLateBytes : 0);
        if (!m_gradSegBuf[i].valid() && restGrads > 0) {
            const BufferId gb = buffer(restGrads, MemCategory::Gradients, Stream::Compute,
                                       m_plan.units[u].allGatherDtype);
            c.allocs.push_back(gb);
            newGrads = restGrads;
            if (upcast)
                m_transientGrads.push_back({u, gb});
            else
                m_gradSegBuf[i] = gb;
        }
        // Segment::savedLate without a recompute: backward frees it as the gradients
        // after the attention appear, before the attention's are made. Held as working
        // memory for the op is what of it outlives the gradients made after it.
        int64_t lateHeld = 0;
        if (!sg.recomputes && m_savedLateBuf[i].valid()) {
            c.frees.push_back(m_savedLateBuf[i]);
            c.freesFirst = static_cast<uint8_t>(c.frees.size());
            m_savedLateBuf[i] = BufferId();
            // At the part's start (its first gradients made), at its end (its loop's
            // activations but the last member's freed), and from the attention on
            // (none of it), above the gradients and the rest of the saved activations.
            const int64_t attnGrads = newGrads > 0 ? newGrads - sg.gradLateBytes : 0;
            const auto late = static_cast<int64_t>(sg.savedLate);
            const int64_t loopGrads = newGrads > 0 ? sg.lateLoopGrads : 0;
            lateHeld =
                std::max<int64_t>({0, late - attnGrads - loopGrads,
                                   late - static_cast<int64_t>(sg.lateLoopFreed) - attnGrads});
        }
        newGrads += lateGrads;
        const bool postBackward = firstSeg[u] == static_cast<int32_t>(i);
        if (postBackward) newGrads += postBackwardKernels(c, u, sync, upcast);
        // The activation gradients' working memory, for the op's duration. Gradients
        // allocated by the same backward mostly appear after it has shrunk, so only the
        // part above them counts (all of it in a later micro-batch, which allocates none).
        if (const auto tmp = std::max(static_cast<int64_t>(sg.bwdTransient) - newGrads,
                                      static_cast<int64_t>(sg.bwdGradExtra)) +
                             sg.tiedGradTemp + lateHeld;
            tmp > 0)  // two tensors: the gradients of the op's output and of its input
            temporaries(c, {tmp / 2, tmp - tmp / 2}, MemCategory::Temporaries,
                        m_plan.units[u].allGatherDtype);
        c.frees.push_back(m_savedBuf[i]);
        for (BufferId t : m_savedTemp)
            c.frees.push_back(t);
        m_savedTemp.clear();
        const OpId cid = lastOp();
        // BACKWARD_POST: FSDP1 prefetches the previous unit in post-forward order only
        // if that unit's backward has not begun (_get_handle_to_prefetch checks
        // _needs_pre_backward_unshard); the root, last in that order but first to start
        // backward, finishes after the unit before it has.
        if (fsdp1() && bp == "BACKWARD_POST" && posInOrder[u] > 0 &&
            firstSeg[u] == static_cast<int32_t>(i) && !begun[order[posInOrder[u] - 1]])
            unshard(order[posInOrder[u] - 1], Phase::Backward, mb);
        if (postBackward) {
            // Post-backward of unit u. Gradients of the param dtype are added to the
            // reduce-dtype copy and dropped (accumulate_unsharded_grad_if_needed).
            std::erase_if(m_transientGrads, [&](const std::pair<int32_t, BufferId>& t) {
                if (t.first != u) return false;
                op(cid).frees.push_back(t.second);
                return true;
            });
            // A unit kept unsharded after backward reshards after the last micro-batch's
            // (samples/apply_plan.py's prepare_micro_batch: set_reshard_after_backward(
            // last)), so the step ends sharded, as the next one's all-gathers assume.
            if (m_plan.units[u].reshardAfterBackward || mb + 1 == m_opts.microBatches)
                reshardAt(u, cid, false);
            if (u == 0 || u == inputUnit)
                deferred.push_back(u);
            else
                reduceUnit(u, mb, sync);
        }
    }
    for (int32_t u : deferred)
        reduceUnit(u, mb, sync);
    // The root's final callback waits for the last reduce-scatter and drops its input
    // (FSDP2's finalize_backward): it goes when that reduce-scatter ends.
    if (m_prevRsIn.valid() && m_prevReduce.valid()) op(m_prevReduce).frees.push_back(m_prevRsIn);
    m_prevRsIn = BufferId();
    for (BufferId b : m_accumulatedOutputs)
        op(m_reduceOps.back()).frees.push_back(b);
    m_accumulatedOutputs.clear();
}

}  // namespace shardscope
