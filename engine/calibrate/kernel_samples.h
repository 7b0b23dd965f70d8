// SPDX-License-Identifier: Apache-2.0
#pragma once
// The kernels of a real profiler trace as samples a cost model can be fitted to: each with
// its class (GEMM, attention, memory-bound, collective), what it computed or moved, and how
// long it ran.
//  - GPU traces: every kernel is tied to the host op that launched it (Kineto's launch
//    flows, then the enclosing ops on the launching thread). A GEMM kernel (by name: cuBLAS,
//    CUTLASS, nvjet, rocBLAS/Tensile ...) takes its FLOPs from the innermost matmul op above
//    the launch (aten::mm, addmm, bmm, baddbmm, _scaled_mm: 2·M·N·K from record_shapes'
//    "Input Dims", the dtype from "Input type"); a memory-bound kernel takes the bytes of the
//    innermost op with tensor inputs (inputs read, plus one output the size of the largest
//    input unless the op is in-place); NCCL kernels take their "Collective name", message
//    size and group size.
//  - CPU-only traces (Gloo jobs, `torch.profiler` without CUDA): the host ops are the
//    kernels. A matmul op is a GEMM sample; a leaf op that moves data (not a view or an
//    allocation) is a memory-bound one; Gloo's collectives are collective samples.
//  - Steps: ProfilerStep#N ranges on the launching thread give each sample its step, so a fit
//    can hold whole steps back.
// Kernels that cannot be priced (no record_shapes, a convolution, a kernel with no launch
// flow) are counted by reason, never guessed.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "plans/core/dtype.h"
#include "profiler/trace/trace.h"

namespace shardscope {

enum class KernelClass : uint8_t { Gemm, Attention, MemoryBound, Collective, Other };
[[nodiscard]] const char* kernelClassName(KernelClass c);

struct KernelSample {
    KernelClass cls = KernelClass::Other;
    int32_t trace = 0;  // index of the trace it came from
    int32_t event = -1;
    int32_t step = -1;  // ProfilerStep number; -1 outside any step
    int64_t durNs = 0;
    double flops = 0;             // GEMM: 2·M·N·K (times the batch)
    int64_t m = 0, n = 0, k = 0;  // GEMM: M x K by K x N, a batch folded into M
    double bytes = 0;             // memory-bound: bytes moved; collective: NCCL's size S
    DType dtype = DType::Float32;
    int32_t groupSize = 0;   // collectives
    std::string collective;  // "allreduce", "allgather", "reduce_scatter", "broadcast", ...
    std::string op;          // the launching (or host) op, "aten::addmm"
    std::string kernel;      // the kernel's name (the op's on a CPU-only trace)
    bool masked = false;     // attention: the SDPA op had a mask (no causal skipping)
    // Memory-bound: an input was broadcast to the output (a weight, x * rsqrt over [..., 1],
    // an expand). Such kernels run well below dense streaming ones of their size (on an H200
    // 1.4-2.7 TB/s against 4-4.5 for Llama-3.1-8B's at 4,096 tokens): they feed their
    // operator's curve, not the curve by bytes (kernel_fit).
    bool broadcast = false;
};

struct KernelSamples {
    std::vector<KernelSample> samples;
    bool hostOnly = false;      // a CPU-only trace: host ops are the kernels
    bool hasShapes = false;     // some host op carried record_shapes' inputs
    int64_t deviceKernels = 0;  // device kernels seen (GPU traces)
    // Kernels (or host ops) left out, by reason ("GEMM without record_shapes", ...).
    std::map<std::string, int64_t> skipped;
    std::vector<int32_t> steps;            // ProfilerStep numbers seen, ascending
    std::vector<std::string> deviceNames;  // the traces' GPUs ("NVIDIA B200"), once each
    // GPU traces: the CPU time from one kernel launch to the next on the launching thread
    // (gaps under 1 ms, within one ProfilerStep): what eager PyTorch spends per kernel; each
    // by who launched the later kernel: the optimizer (inside an Optimizer.step# range), the
    // thread that runs the ProfilerSteps (the model's forward), or another (autograd's device
    // thread: backward and recompute).
    enum class Launcher : uint8_t { Forward, Backward, Optimizer };
    struct LaunchGap {
        int32_t step = -1;
        int64_t ns = 0;
        Launcher by = Launcher::Forward;
    };
    std::vector<LaunchGap> launchGaps;
    // GPU traces, per ProfilerStep and launcher, on the threads that launched kernels: the
    // kernels launched and the host events recorded (ops, annotations, CUDA runtime and
    // driver calls): what the profiler did per kernel (SimParams::profilerNsPerEvent).
    struct LauncherEvents {
        int32_t step = -1;
        Launcher by = Launcher::Forward;
        int64_t launches = 0, events = 0;
    };
    std::vector<LauncherEvents> launcherEvents;
    // GPU traces: the device time from a kernel's end to the next queued one's start on its
    // stream (copies and memsets included): the GPU's overhead per kernel.
    std::vector<LaunchGap> deviceGaps;
    // GPU traces, per ProfilerStep: the device span of the work the step launched (first
    // start to last end, every stream) and the time in it that no stream had anything to
    // run because the next op was launched after the device went idle: the host was behind.
    struct StepDevice {
        int32_t step = -1;
        int64_t spanNs = 0, hostWaitNs = 0;
    };
    std::vector<StepDevice> stepDevice;
    // GPU traces: FSDP2's reduce-scatter copy-ins (aten::_chunk_cat with record_shapes), each
    // the blocks of one chunk of its output and the host's time from entering the op to
    // launching its kernel (SimParams::chunkCatHostNsPerBlock).
    struct ChunkCatHost {
        int32_t step = -1;
        int64_t blocks = 0, ns = 0;
    };
    std::vector<ChunkCatHost> chunkCatHost;
};

struct KernelSampleOptions {
    // The bytes of parameters one rank's torch.optim.AdamW steps (its trainable shards, as
    // resolvePlan's ForeachShape::bytes), when the model and plan are known. A trace does not
    // size the optimizer's foreach kernels itself (record_shapes gives a TensorList's dims as
    // []): with this, each _foreach_* op of kAdamWForeach inside an Optimizer.step# range
    // moves its bytes per byte of parameters, shared equally by its kernels, which are then
    // samples of the operator kForeachOptimizerKey. 0: those kernels are left out.
    double optimizerParamBytes = 0;
};

// Appends the samples of one trace (its index `traceIndex` in `out.samples[i].trace`).
void collectKernelSamples(const Trace& t, int32_t traceIndex, KernelSamples& out,
                          const KernelSampleOptions& o = {});

// Whether a cluster's device name names the GPU a trace ran on ("NVIDIA A100-SXM4-80GB" and
// "A100 80GB SXM": yes; "NVIDIA B200" and "H200 SXM": no); a trace name without a model
// word ("AMD Radeon Graphics") matches anything.
[[nodiscard]] bool sameDevice(const std::string& traceDevice, const std::string& clusterDevice);

// The collective a sample's name means, as one word: "allreduce", "allgather",
// "reduce_scatter", "broadcast", "alltoall", "" when unknown ("_allgather_base",
// "all_gather_into_tensor", "ncclKernel_AllReduce_RING_LL_Sum_float" -> "allgather"...).
[[nodiscard]] std::string collectiveKind(const std::string& name);

}  // namespace shardscope
