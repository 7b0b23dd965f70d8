// SPDX-License-Identifier: Apache-2.0
#pragma once
// The hardware a plan runs on ("format": "shardscope.cluster"): the device (memory, peak
// FLOP/s per dtype, HBM bandwidth), the node (devices per node, intra-node link), the
// network (per-device NIC bandwidth and latency) and the host link. Every figure the
// simulator uses lives here, with its source in "sources"; nothing is hidden in code.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plans/core/dtype.h"
#include "plans/core/expected.h"

namespace shardscope {

inline constexpr const char* kClusterFormat = "shardscope.cluster";
inline constexpr int kClusterVersion = 1;

struct DeviceSpec {
    std::string name;
    std::string kind = "gpu";  // "gpu" or "cpu"
    // A CPU "device" is the host: its memory is the host's, and host work runs on it.
    [[nodiscard]] bool isHost() const { return kind == "cpu"; }
    int64_t memoryBytes = 0;
    std::map<DType, double> peakFlops;            // dense FLOP/s by dtype
    double hbmBandwidth = 0;                      // bytes/s
    [[nodiscard]] double peakFor(DType d) const;  // falls back to float32 when absent
};

struct NodeSpec {
    int64_t devicesPerNode = 1;
    double intraBandwidth = 0;  // bytes/s per device per direction
    int64_t intraLatencyNs = 0;
};

struct NetworkSpec {
    double nicBandwidth = 0;  // bytes/s per device (a 400 Gb/s NIC is 50e9)
    int64_t latencyNs = 0;
};

struct HostSpec {
    double linkBandwidth = 0;  // bytes/s host<->device (PCIe), per device
};

// What NCCL's topology search and tuning model read about a GPU node and its fabric
// (engine/sim/nccl_model.h), plus the corrections its model misses, fitted to published
// sweeps (docs/collectives.md). A cluster with this section prices its collectives with
// NCCL's own model; one without it (a CPU cluster over Gloo, a calibrated line) with the
// ring lines of sim.protocols.
struct NcclSpec {
    // The NCCL whose constants apply ("2.28.9"): tuning.cc's tables changed across releases.
    std::string version = "2.28.9";
    int computeCapability = 90;     // 80 A100, 90 H100/H200, 100 B200: NCCL's per-arch tables
    int nvlinks = 18;               // NVLink links from each GPU to the NVSwitches (0: PCIe only)
    bool nvls = true;               // NVLink SHARP (NVSwitch multicast, SM90 and later)
    int nicsPerNode = 8;            // the node's NICs NCCL uses (network.nic_bandwidth is per GPU)
    double gpuNicBandwidth = 48e9;  // bytes/s of each GPU's PCIe path to its NIC (Gen5 x16: 48e9)
    std::string cpuVendor = "intel";  // "intel", "amd" or "arm": the net overhead and LL caps
    double netLatencyUs = 0;          // latency the net plugin reports (InfiniBand: 0)
    int sms = 0;                      // the GPU's SMs (0: by compute capability)
    // Corrections to NCCL's estimate (it picks an algorithm, it does not time it):
    double launchUs = 0;            // device time per collective outside NCCL's latency
    double nvlinkEfficiency = 1.0;  // achieved bandwidth / NCCL's: Ring, Tree within a node
    double netEfficiency = 1.0;     // the same for Ring, Tree and PAT across nodes
    double nvlsEfficiency = 1.0;    // the same for NVLS and NVLSTree (NVLink SHARP)
    // Pipeline slices a collective fills before its links run at speed (engine/sim/
    // nccl_model.cpp); the default is fitted to every published sweep together.
    double fillSlices = kDefaultFillSlices;
    static constexpr double kDefaultFillSlices = 3.0;
};

// One NCCL protocol's ring cost constants (src/graph/tuning.cc): latency
// base + (n-1-(nodes-1))·intra_step + (nodes-1)·inter_step, bandwidth × bw_factor.
struct ProtocolSpec {
    std::string name;
    double baseNs = 0;
    double intraStepNs = 0;
    double interStepNs = 0;
    double bwFactor = 1;
};

// The achieved fraction of peak of one GEMM shape, measured: a GEMM of M x K by K x N in
// `dtype` (a batched one with its batch folded into M). cuBLAS picks its kernel by shape and
// layout, so GEMMs of equal FLOPs run at different rates (a linear layer's forward, input
// gradient and weight gradient: three shapes, one FLOP count).
struct GemmShapeEfficiency {
    int64_t m = 0, n = 0, k = 0;
    DType dtype = DType::Float32;
    double efficiency = 0;
    friend bool operator==(const GemmShapeEfficiency&, const GemmShapeEfficiency&) = default;
};

// Simulator parameters: how hardware figures become op durations. Defaults (used when
// a file has no "sim" section, and written out by clusterToJson) are documented in
// plans/README.md with their sources.
struct SimParams {
    // Achieved fraction of peak FLOP/s by the FLOPs of one module's matmuls: piecewise
    // linear in log10(FLOPs) through these (flops, efficiency) points, flat outside.
    std::vector<std::pair<double, double>> computeEfficiency{
        {1e6, 0.05}, {1e9, 0.45}, {1e10, 0.65}, {1e11, 0.75}, {1e12, 0.8}};
    double memoryEfficiency = 0.85;  // achieved fraction of HBM bandwidth
    // GEMM shapes measured on the cluster's device (`calibrate --from-trace` fits them from a
    // trace with record_shapes): a GEMM of a listed shape and dtype takes its efficiency,
    // any other computeEfficiency by its FLOPs. Empty (the default): none.
    std::vector<GemmShapeEfficiency> gemmEfficiencyByShape;
    // Achieved fraction of HBM bandwidth of one memory-bound kernel by the bytes it moves:
    // piecewise linear in log10(bytes), flat outside; small kernels pay their launch and
    // tail, mid-sized ones may run from cache. Empty (the default): memoryEfficiency for
    // all. The dense streaming kernel's: single-kernel copies (copy-in, copy-out) use it,
    // and a unit's or the optimizer's kernels where memoryEfficiencyByOp has no curve for
    // them (kModuleKernelsKey, kForeachOptimizerKey).
    std::vector<std::pair<double, double>> memoryEfficiencyByBytes;
    // The same curve for one operator's kernels ("aten::add", "aten::native_layer_norm"):
    // kernels of one size run at very different speeds by what they do (a strided copy, a
    // norm's reductions, an add). Fitted by `calibrate --from-trace` for operators with
    // enough kernels; kernels of other operators use memoryEfficiencyByBytes. Empty: none.
    std::map<std::string, std::vector<std::pair<double, double>>> memoryEfficiencyByOp;
    // Achieved fraction of peak of one attention kernel (SDPA forward or backward) by its
    // FLOPs, as computeEfficiency. Empty (the default): computeEfficiency.
    std::vector<std::pair<double, double>> attentionEfficiency;
    // The same for attention through a mask (sliding-window layers past the window): the
    // kernel does all s x s of the work, a causal one half. Empty (the default): half of
    // attentionEfficiencyFor.
    std::vector<std::pair<double, double>> maskedAttentionEfficiency;
    // CPU time eager PyTorch spends per kernel it launches (dispatch and launch): a unit's
    // compute cannot finish before its kernels are issued, so a small model shows as
    // CPU-bound. 0 (the default): not modelled beyond cpu_issue_ns per op.
    double cpuLaunchNs = 0;
    // The same, for the kernels of the units' forward (the thread that calls the model) and
    // of their backward and recompute (autograd's device thread, which runs FSDP's
    // post-backward hooks and checkpointing's recompute): inside the units eager PyTorch
    // spends far more per kernel than in the optimizer's foreach loop, whose kernels are
    // most of a step's launches (an H200 Llama-8B run: 50-92 us a kernel in the layers,
    // 8-15 in AdamW). 0 (the default): cpuLaunchNs.
    double cpuLaunchForwardNs = 0, cpuLaunchBackwardNs = 0;
    // Device time between two kernels of a stream when the second was already queued (the
    // GPU's own per-kernel overhead, outside each kernel's span): each kernel of a step
    // costs it on top of its own time. 0 (the default): not modelled.
    double kernelGapNs = 0;
    // CPU time FSDP2's reduce-scatter copy-in (torch._chunk_cat on CUDA) spends before it
    // launches its kernel, per block of its grid: PyTorch lists a block index for every 2 KiB
    // of one chunk of the output (one chunk per rank of the reduce-scatter group) on the
    // host, then copies that table to the device (TensorShape.cu,
    // get_chunk_cat_metadata). On an H200 host a Llama-8B layer's fp32 gradients over one
    // rank (426k blocks) took 1.3-1.6 ms, the device idle meanwhile in a short backward.
    // 0 (the default): not modelled; `calibrate --from-trace` fits it.
    double chunkCatHostNsPerBlock = 0;
    // Host time torch.profiler adds per event it records (an op, an annotation, a CUDA
    // runtime call; the allocations' memory events ride on them) on this cluster's hosts:
    // a profiled run launches slower than the one a user times. Not used by the simulator:
    // `calibrate --from-trace` takes it from its base cluster to remove the profiler's share
    // from the launch rates it reads off a trace, and fits it with --step-ms. 0 (the
    // default): not known, the rates stay the profiled run's.
    double profilerNsPerEvent = 0;
    double overlapSlowdown = 0.10;  // compute stretches by this fraction while overlapped by comm
    // A collective stretches by this fraction of the time compute overlaps it: on a CPU
    // device Gloo's threads share the cores with the compute (on two cores a reduce-scatter
    // under backward took 4-18 ms where alone it took 1.5-4.4). 0 (the default): not
    // modelled; `calibrate --trace` fits it on a CPU run.
    double commOverlapSlowdown = 0;
    double intraEfficiency = 0.82;    // ring busbw / intra-node link bandwidth (370/450 GB/s)
    double networkEfficiency = 0.90;  // ring busbw / NIC bandwidth
    double cpuIssueNs = 8000;         // CPU time to issue one step-program op (hooks, launches)
    double hostOptimizerBytesPerS = 20e9;  // CPU AdamW throughput when offloading
    std::vector<ProtocolSpec> protocols{{"LL", 3600, 470, 2700, 0.25},
                                        {"LL128", 10000, 1900, 4000, 0.92},
                                        {"Simple", 8400, 3400, 9600, 1.0}};
    [[nodiscard]] double efficiencyFor(double flops) const;
    // A GEMM's: its shape's where listed (gemmEfficiencyByShape), else efficiencyFor(flops).
    // m, n or k of 0: no shape known.
    [[nodiscard]] double gemmEfficiencyFor(double flops, int64_t m, int64_t n, int64_t k,
                                           DType dtype) const;
    [[nodiscard]] double memoryEfficiencyFor(double bytes) const;
    // The operator's own curve where the cluster has one, else memoryEfficiencyFor(bytes).
    [[nodiscard]] double memoryEfficiencyFor(double bytes, const std::string& op) const;
    [[nodiscard]] double attentionEfficiencyFor(double flops) const;
    [[nodiscard]] double maskedAttentionEfficiencyFor(double flops) const;
};

struct ClusterSpec {
    std::string name;
    int64_t nodes = 1;
    DeviceSpec device;
    NodeSpec node;
    NetworkSpec network;
    HostSpec host;
    SimParams sim;
    std::optional<NcclSpec> nccl;                // absent: the ring lines of sim.protocols
    bool simDefaulted = true;                    // no "sim" section in the file
    std::map<std::string, std::string> sources;  // field pointer -> citation
    [[nodiscard]] int64_t worldSize() const { return nodes * node.devicesPerNode; }
};

[[nodiscard]] Expected<ClusterSpec> clusterFromJson(const nlohmann::json& j,
                                                    const std::string& file);
[[nodiscard]] Expected<ClusterSpec> loadClusterFile(const std::string& path);
[[nodiscard]] nlohmann::json clusterToJson(const ClusterSpec& c);

}  // namespace shardscope
