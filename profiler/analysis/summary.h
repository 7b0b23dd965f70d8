// SPDX-License-Identifier: Apache-2.0
#pragma once
// Per-rank summary of a trace, computed as HolisticTraceAnalysis defines it
// (hta/analyzers/breakdown_analysis.py; docs/pytorch-traces.md):
//  - temporal breakdown over GPU events: kernel_time = last end - first start;
//    idle = kernel_time - |union of all|; compute = |union of computation kernels|;
//    non_compute = kernel_time - compute - idle (communication hidden under compute counts
//    as compute);
//  - communication-computation overlap = |union(comm) ∩ union(compute)| / |union(comm)|;
//  - NCCL collectives by name with message sizes; device-memory peaks.
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "profiler/trace/trace.h"

namespace shardscope {

struct TraceSummary {
    int64_t rank = 0;
    std::string dialect;
    size_t events = 0;
    // HTA's filter: ProfilerSteps seen, whether the last was left out, GPU events dropped.
    int64_t profilerSteps = 0;
    bool droppedLastStep = false;
    int64_t droppedDeviceEvents = 0;
    size_t deviceLanes = 0, hostLanes = 0;
    int64_t kernelTimeNs = 0, computeNs = 0, nonComputeNs = 0, idleNs = 0;
    int64_t commNs = 0;  // |union of communication kernels|
    double overlapRatio = 0;
    struct CollectiveStats {
        int64_t count = 0, bytes = 0, durationNs = 0;
    };
    std::map<std::string, CollectiveStats> collectives;
    // Achieved bandwidth by collective and message size (NCCL's size S), as nccl-tests
    // defines it: algorithm bandwidth S / t; bus bandwidth S / t x (n-1)/n for all-gather
    // and reduce-scatter, x 2(n-1)/n for all-reduce, x 1 otherwise (-1: group size unknown).
    struct Bandwidth {
        std::string collective;
        int64_t minBytes = 0, maxBytes = 0;  // [min, max) of the size bucket; max 0: open
        int64_t count = 0, bytes = 0, durationNs = 0;
        double algGBps = 0, busGBps = -1;
    };
    std::vector<Bandwidth> bandwidth;
    // CPU runs (no device events): Gloo collectives' union and the part of it during which
    // the issuing thread ran no op; the CPU allocator's peak ([memory], Device Type 0).
    int64_t hostCommNs = 0, hostExposedNs = 0, hostPeakAllocated = 0;
    int64_t peakAllocated = 0, peakReserved = 0;
    int64_t skippedPythonFunctions = 0, orphanFlowEnds = 0, flows = 0;
    std::map<std::string, int64_t> eventsByCategory;
};

// HolisticTraceAnalysis' defaults (hta/common/trace.py, trace_parser.py), each of which can
// be turned off:
//  - the last ProfilerStep is left out (include_last_profiler_step=False): host events from
//    its start on are dropped, and GPU events whose launch was dropped or is not in the
//    trace (HTA joins them by correlation; here by the launch flow) go with them. HTA does
//    this only when the trace has at least two ProfilerStep ranges;
//  - fractional-microsecond times are rounded as HTA rounds them (start up, end down, in
//    the file's microseconds), which can leave a short kernel a zero or negative length,
//    merged as HTA merges (merge_kernel_intervals);
//  - cuda_sync events on a stream count as GPU events (the importer keeps them on their
//    stream; classified "other");
//  - a host op that carries a "stream" argument (Triton's launcher cpu_op) counts as GPU
//    time, classified by its name, as HTA's stream != -1 test counts it.
struct SummaryOptions {
    bool dropLastStep = true;
    bool dropUnlinkedKernels = true;
    bool roundToMicroseconds = true;
    bool hostOpsWithStream = true;
};

[[nodiscard]] TraceSummary summarize(const Trace& t, const SummaryOptions& o = {});

// A collective's kind by its name, whichever form the trace used
// ("ncclDevKernel_ReduceScatter_...", "_reduce_scatter_base", "allreduce", "all_gather").
enum class CollectiveKind { AllGather, ReduceScatter, AllReduce, Other };
[[nodiscard]] CollectiveKind collectiveKindOf(std::string_view name);
// nccl-tests' bus bandwidth over algorithm bandwidth: (n-1)/n for all-gather and
// reduce-scatter, 2(n-1)/n for all-reduce, 1 otherwise; -1 when n is needed and unknown.
[[nodiscard]] double busBandwidthFactor(CollectiveKind k, int32_t groupSize);
[[nodiscard]] nlohmann::json summaryToJson(const TraceSummary& s);

}  // namespace shardscope
