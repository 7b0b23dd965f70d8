// SPDX-License-Identifier: Apache-2.0
#pragma once
// Published NCCL measurements ("format": "shardscope.nccl_sweeps", samples/published/
// nccl-sweeps.json): nccl-tests and torch.distributed sweeps that vendors and users
// published, each with its source, the cluster profile it ran on and its points. The
// collective model is checked against them: every point predicted from the profile, no
// calibration on the point itself.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/sim/nccl_model.h"
#include "plans/cluster/cluster.h"
#include "plans/core/expected.h"

namespace shardscope {

inline constexpr const char* kNcclSweepsFormat = "shardscope.nccl_sweeps";

struct SweepPoint {
    OpKind kind = OpKind::AllReduce;
    int64_t bytes = 0;
    int ranks = 0;
    double measuredUs = 0;  // the source's time, or bytes over the algbw its busbw implies
    NcclEnv env;
    std::string envText;  // "NCCL_NVLS_ENABLE=0", as the source set it
};

struct Sweep {
    std::string id, source, quote, tool;
    // The tool waits for each call before the next (torch.distributed benchmarks, nccl-tests
    // -z): its time holds the host's launch and wait, which FSDP's queued calls overlap.
    bool blocking = false;
    std::string tuner;     // "" (NCCL's own) or the tuner plugin that chose ("aws-ofi")
    bool heldOut = false;  // kept out of fitNcclCorrections: a prediction, not a fit
    std::string clusterName;
    std::string ncclVersion;  // the NCCL the source ran, where it says ("" otherwise)
    ClusterSpec cluster;      // the profile, with ncclVersion where the source states it
    std::vector<SweepPoint> points;
};

struct SweepFile {
    std::vector<Sweep> sweeps;
};

// Reads a sweep file; each sweep's cluster is `clusterDir`/<cluster>.json.
[[nodiscard]] Expected<SweepFile> loadNcclSweeps(const std::string& path,
                                                 const std::string& clusterDir);

struct SweepPointResult {
    SweepPoint point;
    NcclEstimate estimate;
    double predictedUs = 0;
    double error = 0;  // (predicted - measured) / measured
};
[[nodiscard]] std::vector<SweepPointResult> evaluateSweep(const Sweep& s);

// The bands the published sweeps are judged in: small (<= 1 MiB), middle, large (>= 16 MiB).
enum class SweepBand { Small, Middle, Large };
[[nodiscard]] SweepBand sweepBand(int64_t bytes);
[[nodiscard]] const char* sweepBandName(SweepBand b);
struct BandSummary {
    int points = 0;
    double medianAbsError = 0, maxAbsError = 0;
};
[[nodiscard]] BandSummary summarize(const std::vector<SweepPointResult>& r, SweepBand b);

// The corrections fitted to the sweeps: per cluster profile, the time per call, the
// achieved fraction of NCCL's bandwidth within a node (from its one-node points) and across
// nodes (from the others) and, where its sweeps cross nodes, the net plugin's latency; for every
// sweep together, the pipeline slices filled and what a blocking tool's wait adds. Each minimises
// the sum of |log(predicted / measured)| over the points it applies to (a robust fit: a stray point
// moves it little).
struct NcclProfileFit {
    std::string clusterName;
    double launchUs = 0, nvlinkEfficiency = 1, netEfficiency = 1, nvlsEfficiency = 1,
           netLatencyUs = 0;
    int points = 0, nodePoints = 0, netPoints = 0, nvlsPoints = 0;
    double medianAbsErrorBefore = 0, medianAbsErrorAfter = 0;
};
struct NcclSweepFit {
    double fillSlices = NcclSpec::kDefaultFillSlices;
    std::vector<NcclProfileFit> profiles;
};
// Fits and applies the corrections to `f`'s clusters.
[[nodiscard]] NcclSweepFit fitNcclCorrections(SweepFile& f);

}  // namespace shardscope
