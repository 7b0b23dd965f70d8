// SPDX-License-Identifier: Apache-2.0
#pragma once
// Durations of step-program ops on a cluster. Every parameter comes from the cluster JSON
// (ClusterSpec::sim and the hardware figures); plans/README.md documents each.
//  - compute: FLOPs / (peak(dtype) · efficiency(FLOPs per kernel)) + bytes / (HBM · eff);
//  - copies: bytes / (HBM · eff); host copies: bytes / host link;
//  - collectives: NCCL's own model where the cluster has an nccl section (nccl_model.h);
//    otherwise a ring line per protocol, the fastest of the cluster's protocols:
//      time = base + (n-1-(nodes-1))·intra_step + (nodes-1)·inter_step
//           + factor · bytes / (busbw · bw_factor),
//    factor (n-1)/n for all-gather and reduce-scatter, 2(n-1)/n for all-reduce, and
//    busbw = intra bandwidth · intra_efficiency within a node, else
//    min(intra · intra_efficiency, ranks-per-node · NIC · network_efficiency): across
//    nodes NCCL's channels leave each node through all its NICs at once.
#include <cstdint>

#include "engine/schedule/step_program.h"
#include "plans/cluster/cluster.h"

namespace shardscope {

struct CollectiveCost {
    int64_t ns = 0;
    // Index into ClusterSpec::sim.protocols; with an nccl section, the NcclProto.
    int protocol = 0;
    int algorithm = 1;  // with an nccl section, the NcclAlgo (Ring otherwise)
    // What the collective holds while it runs (with an nccl section; 0 otherwise): the
    // fraction of the device's SMs its CTAs occupy and of its HBM bandwidth its copies and
    // reductions use (ncclOccupancy).
    double smShare = 0, hbmShare = 0;
};

[[nodiscard]] CollectiveCost collectiveTime(const ClusterSpec& c, OpKind kind, int64_t bytes,
                                            int32_t groupSize, int32_t groupNodes,
                                            int32_t ranksPerNode);
// A compute op with a kernel mix (`program` given) is priced kernel by kernel:
//   GEMM:         FLOPs / (peak(dtype) · compute_efficiency(FLOPs of that kernel))
//   attention:    FLOPs / (peak(dtype) · attention_efficiency(FLOPs of that kernel))
//   memory-bound: bytes / (HBM · the modules' curve (kModuleKernelsKey) at the bytes of that
//                 kernel, or memory_efficiency_by_bytes where the cluster has none)
// times each entry's count; otherwise by its FLOPs and bytes as one aggregate.
[[nodiscard]] int64_t opDurationNs(const ClusterSpec& c, const Op& op,
                                   const StepProgram* program = nullptr);
[[nodiscard]] double mixSeconds(const ClusterSpec& c, const KernelMix& mix, DType dtype);
// CPU time to launch one kernel of an op of this kind: the units' forward on the thread that
// calls the model, their backward and recompute on autograd's device thread (where FSDP's
// post-backward hooks and checkpointing run), each at its own rate where the cluster has one
// (cpu_launch_forward_ns, cpu_launch_backward_ns); cpu_launch_ns otherwise (the optimizer).
[[nodiscard]] inline double cpuLaunchNsFor(const SimParams& s, OpKind kind) {
    if (kind == OpKind::Forward && s.cpuLaunchForwardNs > 0) return s.cpuLaunchForwardNs;
    if ((kind == OpKind::Backward || kind == OpKind::Recompute) && s.cpuLaunchBackwardNs > 0)
        return s.cpuLaunchBackwardNs;
    return s.cpuLaunchNs;
}
// The optimizer's foreach kernels (a GPU's AdamW step): memory-bound kernels priced by the
// cluster's memory_efficiency_by_op curve under this name where it has one (`calibrate
// --trace` fits it from a measured step), else by memory_efficiency_by_bytes.
inline constexpr const char* kForeachOptimizerKey = "torch.optim (foreach)";
// The memory-bound kernels that modules launch (norms, rotary, activations, residual adds,
// casts, the loss), broadcast ones included: a compute op's memory-bound entries are priced
// by the cluster's memory_efficiency_by_op curve under this name where it has one
// (`calibrate --from-trace` fits it over every memory-bound kernel of the trace but the
// optimizer's and FSDP's copies), else by memory_efficiency_by_bytes. That curve is the
// dense streaming kernel's: on an H200 a Llama layer's kernels (broadcast multiplies,
// casts, RoPE's strided halves and cat) moved 2.7-2.9 TB/s where dense kernels of their
// sizes moved 4.1-4.2.
inline constexpr const char* kModuleKernelsKey = "nn.Module (memory-bound kernels)";
// FSDP2's reduce-scatter copy-in (torch._chunk_cat): its own curve under its operator's name,
// which `calibrate --from-trace` fits from its kernels and `calibrate --trace` from the
// measured copy-ins.
inline constexpr const char* kChunkCatKey = "aten::_chunk_cat";
// Its CUDA path lists a block index on the host for every this many bytes of one chunk of
// its output (BYTES_PER_BLOCK = 16 x 128 in ATen's TensorShape.cu): what
// chunk_cat_host_ns_per_block is per.
inline constexpr int64_t kChunkCatBytesPerBlock = 2048;
// FSDP's copy-in and copy-out: dense casts and copies, priced by the curve of aten::copy_'s
// vectorized kernels where `calibrate --from-trace` fitted one (FSDP2 over one GPU runs
// exactly those, a cast and a copy per parameter; on an H200 they moved 0.85-0.88 of the
// bandwidth from 0.35 to 3 GB), else by memory_efficiency_by_bytes. The curve by bytes pools
// every dense kernel: its top bins can hold a few slow ones alone (the loss's log-softmax,
// 5.3 GB at 0.50), which had priced a Llama-70B layer's copies at 1.7x their time.
inline constexpr const char* kCopyKernelsKey = "aten::copy_ [vectorized]";
// A widening cast (bf16 to fp32) runs aten::copy_'s unrolled kernel (a cast on load and
// store): FSDP1's and fairscale's gradient cast before the reduce-scatter is one, priced by
// this curve where `calibrate --from-trace` fitted one. On an H200 it moved 0.39 of the
// bandwidth at 1.3 GB (a Llama-8B layer's flat gradient), half the narrowing casts' rate.
inline constexpr const char* kCastKernelsKey = "aten::copy_ [unrolled]";
[[nodiscard]] double optimizerMixSeconds(const ClusterSpec& c, const KernelMix& mix);
// The parts of a mix's time: GEMM + attention seconds and FLOPs, memory-bound seconds.
struct MixParts {
    double computeFlops = 0, computeSeconds = 0, memorySeconds = 0;
    int64_t computeKernels = 0;
};
[[nodiscard]] MixParts mixParts(const ClusterSpec& c, const KernelMix& mix, DType dtype);

// The kernels of a whole step (every compute op of every micro-batch, recompute included)
// by class, with their priced device time and the CPU time to launch them.
struct KernelClassTotal {
    int64_t count = 0;
    double work = 0;  // FLOPs (GEMM, attention) or bytes (memory-bound)
    double deviceSeconds = 0;
};
struct KernelTotals {
    KernelClassTotal byKind[3];  // indexed by KernelKind
    double launchSeconds = 0;
    [[nodiscard]] int64_t count() const {
        return byKind[0].count + byKind[1].count + byKind[2].count;
    }
};
[[nodiscard]] KernelTotals kernelTotals(const ClusterSpec& c, const StepProgram& p);
[[nodiscard]] const char* kernelKindName(KernelKind k);  // "gemm", "attention", "memory_bound"

}  // namespace shardscope
