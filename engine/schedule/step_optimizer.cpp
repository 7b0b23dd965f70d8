// SPDX-License-Identifier: Apache-2.0
// The step program's persistent state and optimizer step (step_builder.h).
#include "engine/schedule/step_builder.h"

#include "engine/schedule/run_kernels.h"

namespace shardscope {

namespace {

// The bytes torch.optim.AdamW moves per byte of parameters, foreach or single-tensor
// alike: weight decay p *= (1 - lr wd) 2, exp_avg.lerp_(g) 3, exp_avg_sq *= beta2 2,
// exp_avg_sq.addcmul_(g, g) 3, sqrt 2, / bias correction 2, + eps 2, p.addcdiv_ 4. Each
// foreach kernel of an H200 run moved its count at the same rate (3.7 TB/s), 41 ms a
// step for 1.92 G parameters: seven passes (a fused kernel's) predicted a third of it.
constexpr double kAdamWPasses = 20.0;

}  // namespace

void StepBuilder::persistent() {
    int64_t sharded = 0, optim = 0;
    for (const auto& u : m_plan.units) {
        // Sharded state of an offloaded unit lives on the host, which is not the device
        // memory the peak counts unless the device is the host.
        if (u.offload.enabled && !m_opts.hostIsDevice) continue;
        sharded += u.shardedBytes;
        // AdamW's exp_avg and exp_avg_sq in the parameter dtype, for parameters that
        // have gradients (the state is made at the first step that sees one).
        optim += 2 * u.trainableShardedBytes;
    }
    for (ParamId pid : m_plan.ignoredParams)
        sharded += m_model.param(pid).bytes();
    m_prog.persistentBytes[static_cast<int>(MemCategory::ShardedParams)] = sharded;
    m_prog.persistentBytes[static_cast<int>(MemCategory::OptimizerState)] = optim;
}

// The foreach path's kernels: kAdamWForeach (resolve.h), each op's kernels by its
// tensor-list limit, moving its share of its bytes per byte of parameters (kAdamWPasses
// in all). Each op runs as ceil(chunks / 320) kernels or more, so a kernel moves hundreds
// of MB on a large shard and is priced by its size (memory_efficiency_by_bytes, or the
// foreach curve a calibration fitted): on the H200 they moved 3.6-4.0 TB/s, where the
// aggregate memory efficiency says 2.8.

// The device optimizer's kernels when it takes the foreach path on a GPU; -1 otherwise
// (the single-tensor path, a CPU device: priced by its bytes as one op).
int32_t StepBuilder::optimizerMix(int64_t shardedBytes) {
    if (m_opts.hostIsDevice || shardedBytes <= 0) return -1;
    bool offloaded = false;
    for (const auto& u : m_plan.units)
        offloaded = offloaded || u.offload.enabled;
    if (offloaded || (m_plan.flatParams && m_plan.plan.api != PlanApi::Fsdp1)) return -1;
    ForeachShape f = m_plan.optimizerForeach;
    if (f.tensors == 0) {  // a plan not made by resolvePlan: one fp32 tensor per unit
        std::vector<int64_t> numels;
        for (const auto& u : m_plan.units)
            if (u.trainableShardedBytes > 0) numels.push_back(u.trainableShardedBytes / 4);
        f.bytes = shardedBytes;
        for (int i = 0; i < 4; ++i)
            f.kernels[i] = foreachKernels(numels, kForeachTensorLimits[i]);
    }
    KernelMix m;
    for (const AdamWForeachOp& op : kAdamWForeach) {
        const int32_t n = f.kernels[op.limit];
        if (n > 0)
            addKernels(m, KernelKind::MemoryBound, op.perByte * static_cast<double>(f.bytes) / n,
                       n);
    }
    return m_mixes.intern(m, DType::Float32);
}

// torch.optim.AdamW's temporaries with its defaults, on the device. It takes the foreach
// path when every parameter is a Tensor, nn.Parameter or DTensor on a CUDA device
// (_default_to_fused_or_foreach): exp_avg_sq's square roots for all parameters at once
// (_multi_tensor_adam's exp_avg_sq_sqrt), one block per unit here. FSDP1's FlatParameter
// is a plain nn.Parameter object (FlatParameter.__new__; the class only answers
// isinstance), so FSDP1 takes it too, with or without use_orig_params: two H200 runs
// peaked at the step exactly as FSDP2 does. Otherwise, on a CPU, with fairscale's
// FlatParameter (a true subclass, which _default_to_fused_or_foreach refuses) or with a
// parameter offloaded to the host, the single-tensor path: one parameter at a time,
// exp_avg_sq.sqrt() and its quotient by the bias correction live together.
std::vector<int64_t> StepBuilder::optimizerTemporaries() const {
    bool offloaded = false;
    int64_t largest = 0;
    std::vector<int64_t> perUnit;
    for (const auto& u : m_plan.units) {
        if (u.offload.enabled) {
            offloaded = true;
            if (!m_opts.hostIsDevice) continue;  // its step runs in host memory
        }
        if (u.trainableShardedBytes > 0) perUnit.push_back(u.trainableShardedBytes);
        largest = std::max(largest, u.largestShardBytes);
    }
    const bool flatToOptimizer = m_plan.flatParams && m_plan.plan.api != PlanApi::Fsdp1;
    if (!m_opts.hostIsDevice && !offloaded && !flatToOptimizer) return perUnit;  // foreach
    if (largest == 0) return {};
    return {largest, largest};
}

void StepBuilder::optimizer() {
    int64_t sharded = 0;
    double hostBytes = 0;
    for (const auto& u : m_plan.units) {
        if (u.offload.enabled)
            hostBytes += static_cast<double>(u.shardedBytes);
        else
            sharded += u.shardedBytes;
    }
    Op st{OpKind::OptimizerStep, Phase::Optimizer, Stream::Compute, UnitId(0),
          static_cast<int32_t>(m_opts.microBatches - 1)};
    st.memBytes = kAdamWPasses * static_cast<double>(sharded);
    st.mix = optimizerMix(sharded);
    for (const int64_t tmp : optimizerTemporaries())
        temporaries(st, {tmp}, MemCategory::OptimizerState, DType::Float32);
    for (OpId w : m_reduceOps)
        st.waits.push_back(w);
    for (BufferId b : m_shardedGrads)
        st.frees.push_back(b);  // zero_grad(set_to_none=True)
    // torchao's precompute_float8_dynamic_scale_for_fsdp after the step: the amax of every
    // float8 weight's shard (one foreach norm reading the fp32 shards) and one all-reduce
    // of the amaxes (4 bytes a weight) over the shard group.
    double amaxBytes = 0;
    int64_t weights = 0;
    for (const auto& u : m_plan.units)
        if (u.float8.precomputeScales && !u.float8Linears.empty()) {
            amaxBytes += 4.0 * static_cast<double>(u.float8WeightNumel) /
                         static_cast<double>(std::max(1, m_shardGroup.size));
            weights += static_cast<int64_t>(u.float8Linears.size());
        }
    if (weights > 0 && st.mix >= 0) {
        KernelMix& m = m_mixes.at(st.mix);
        addKernels(m, KernelKind::MemoryBound, amaxBytes, 1);
    }
    const OpId step = add(std::move(st));
    if (weights > 0 && m_shardGroup.size > 1) {
        Op ar{OpKind::AllReduce, Phase::Optimizer, Stream::AllReduce, UnitId(0),
              static_cast<int32_t>(m_opts.microBatches - 1)};
        ar.commBytes = 4 * weights;
        ar.groupSize = m_shardGroup.size;
        ar.groupNodes = m_shardGroup.nodes;
        ar.ranksPerNode = m_shardGroup.perNode;
        ar.processGroup = 0;
        ar.waits.push_back(step);
        add(std::move(ar));
    }
    if (hostBytes > 0) {
        Op h{OpKind::OptimizerStep, Phase::Optimizer, Stream::Host, UnitId(0),
             static_cast<int32_t>(m_opts.microBatches - 1)};
        h.memBytes = kAdamWPasses * hostBytes;
        for (OpId w : m_reduceOps)
            h.waits.push_back(w);
        add(std::move(h));
    }
}

}  // namespace shardscope
