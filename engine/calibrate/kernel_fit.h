// SPDX-License-Identifier: Apache-2.0
#pragma once
// Calibrates a cluster from the kernels of real profiler traces (`shardscope calibrate
// --from-trace`), and says how well the fit predicts kernels it never saw:
//  - the samples are split by step: the first, third, ... ProfilerStep are fitted, the others
//    held back (a trace without ProfilerSteps alternates each kernel's occurrences);
//  - GEMMs fit the compute-efficiency curve (achieved fraction of the dtype's peak, median
//    per half-decade of FLOPs per kernel);
//  - memory-bound kernels fit the memory efficiency (their bytes over HBM bandwidth times
//    their time, summed);
//  - collectives fit latency and bus bandwidth (fitCollectiveLine), within a node (group
//    no larger than the cluster's devices per node) and across nodes separately;
//  - attention ops (SDPA forward and backward, each op's kernels summed) fit their own
//    curve by FLOPs (attention_efficiency), as the kernel-level model prices them;
//  - other kernels are measured and reported, not priced.
// Before and after: each held-back kernel predicted with the base cluster and with the
// fitted one, its median |error| and the class total's error.
#include <string>
#include <vector>

#include "engine/calibrate/kernel_samples.h"
#include "plans/cluster/cluster.h"
#include "plans/core/expected.h"

namespace shardscope {

struct KernelClassFit {
    KernelClass cls = KernelClass::Other;
    int64_t fitted = 0, heldOut = 0;  // samples on each side of the split
    bool priced = false;              // the cost model predicts this class
    // Held-back kernels: measured total, predicted totals and median |relative error| with
    // the base cluster (before) and the calibrated one (after).
    double measuredNs = 0, beforeNs = 0, afterNs = 0;
    double beforeMedianErr = 0, afterMedianErr = 0;
};

// A median fitted on some steps and checked on the held-back ones (GPU traces).
struct SplitMedian {
    double fittedNs = 0, heldBackNs = 0;
    int64_t fitted = 0, heldBack = 0;  // how many values each
};

struct KernelFit {
    ClusterSpec cluster;
    std::string source;  // the traces fitted, as the cluster's "sources" name them
    std::string split;   // how the samples were split, in words
    std::vector<KernelClassFit> classes;
    std::vector<uint8_t> heldOut;    // per sample: 1 when held back
    std::vector<std::string> notes;  // what could not be fitted, and why
    SplitMedian launch;              // CPU per kernel launch: cpu_launch_ns
    // The same per thread outside the optimizer, as means, not medians (the simulator charges
    // a unit rate x kernels, so its total host time is what must match, hooks included):
    // cpu_launch_forward_ns and cpu_launch_backward_ns. fitted = 0 where not fitted.
    SplitMedian launchForward, launchBackward;
    // Host events the profiler recorded per kernel on each thread (the fitted steps); the
    // overhead per event taken out of the rates above is cluster.sim.profilerNsPerEvent (0:
    // none, the rates written are the profiled run's). See applyProfilerOverhead.
    double eventsPerLaunchForward = 0, eventsPerLaunchBackward = 0;
    SplitMedian kernelGap;  // the device's time between queued kernels: kernel_gap_ns
    // GPU traces: the median step's device span and the time in it the device waited for the
    // host (KernelSamples::stepDevice), over every step; steps = 0 where none was read.
    double stepSpanNs = 0, hostWaitNs = 0;
    int64_t hostWaitSteps = 0;
    // GPU traces: FSDP2's reduce-scatter copy-ins' host time per block of one chunk
    // (chunk_cat_host_ns_per_block): the median over the fitted steps' copy-ins, and on the
    // held-back steps' the median and the summed time, measured and predicted with the fit.
    struct PerBlock {
        double fittedNs = 0, heldBackNs = 0;  // per block
        int64_t fitted = 0, heldBack = 0;     // copy-ins each side
        double heldBackMeasuredNs = 0, heldBackPredictedNs = 0;
    } chunkCatHost;
};

// Takes the profiler's own host time out of the fitted per-thread launch rates: each becomes
// the profiled mean less nsPerEvent x that thread's events per kernel, kept at a quarter of
// the profiled mean at least; writes nsPerEvent into the cluster (profiler_ns_per_event).
// nsPerEvent 0 restores the profiled rates. Does nothing where the rates were not fitted.
void applyProfilerOverhead(KernelFit& fit, double nsPerEvent, const std::string& why);
// The rates alone, into `sim` (cpu_launch_forward_ns, cpu_launch_backward_ns and
// profiler_ns_per_event), for a search over nsPerEvent that simulates each candidate.
void setLaunchRatesWithout(const KernelFit& fit, double nsPerEvent, SimParams& sim);

// Predicted duration of one sample on a cluster (0 for a class the model does not price).
[[nodiscard]] double predictKernelNs(const ClusterSpec& c, const KernelSample& s);

[[nodiscard]] Expected<KernelFit> fitKernels(const KernelSamples& samples, const ClusterSpec& base,
                                             const std::string& sourceName);

}  // namespace shardscope
