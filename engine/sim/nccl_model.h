// SPDX-License-Identifier: Apache-2.0
#pragma once
// NCCL's own cost model for all-gather, reduce-scatter and all-reduce: the topology search
// that sets each algorithm's channels and per-channel bandwidth, tuning.cc's latency and
// bandwidth tables for the NCCL version the cluster names, and the algorithm and protocol
// NCCL would pick (the one with the least estimated time). docs/collectives.md states every
// formula with its source file and what is simplified.
//
// NCCL's estimate only ranks its choices; what the chosen collective then takes is that
// estimate corrected by what published sweeps measured (docs/collectives.md): a time per
// call outside NCCL's latency, the achieved fraction of NCCL's bandwidth within a node and
// across nodes (the cluster's nccl section), and the pipeline's fill of one slice.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/schedule/step_program.h"
#include "plans/cluster/cluster.h"
#include "plans/core/expected.h"

namespace shardscope {

enum class NcclAlgo : uint8_t { Tree, Ring, NVLS, NVLSTree, PAT };
enum class NcclProto : uint8_t { LL, LL128, Simple };
inline constexpr int kNcclAlgos = 5;
inline constexpr int kNcclProtos = 3;
[[nodiscard]] const char* ncclAlgoName(NcclAlgo a);    // "Ring", "NVLSTree", ...
[[nodiscard]] const char* ncclProtoName(NcclProto p);  // "LL", "LL128", "Simple"

// What NCCL's environment restricts: NCCL_ALGO and NCCL_PROTO (NCCL's grammar: a list,
// "^" to exclude, "allreduce:tree;allgather:ring" per function) and NCCL_NVLS_ENABLE.
struct NcclEnv {
    // enabled[function][algorithm or protocol]; function 0 all-gather, 1 reduce-scatter,
    // 2 all-reduce.
    bool algo[3][kNcclAlgos] = {{true, true, true, true, true},
                                {true, true, true, true, true},
                                {true, true, true, true, true}};
    bool proto[3][kNcclProtos] = {{true, true, true}, {true, true, true}, {true, true, true}};
    bool nvls = true;
};
[[nodiscard]] Expected<NcclEnv> parseNcclEnv(const std::string& algo, const std::string& proto,
                                             const std::string& nvlsEnable);

// One channel layout the topology search found: channels and GB/s per channel, within a
// node (bwIntra) and across nodes (bwInter), as NCCL's ncclTopoGraph holds them.
struct NcclGraph {
    int channels = 0;
    double bwIntra = 0, bwInter = 0;
};

struct NcclEstimate {
    NcclAlgo algo = NcclAlgo::Ring;
    NcclProto proto = NcclProto::Simple;
    int channels = 0;
    int nodes = 1;
    double ppn = 1;                   // ranks per node
    double ncclUs = 0;                // NCCL's own estimate, what it picks by
    double latencyUs = 0;             // its latency term
    double algbwGBps = 0;             // its algorithm bandwidth (nBytes per us / 1000)
    double busbwGBps = 0;             // its bus bandwidth before the algorithm conversion
    double us = 0;                    // corrected: what the collective takes
    double launchUs = 0, fillUs = 0;  // the corrections' parts of `us`
    double efficiency = 1;            // the achieved fraction of NCCL's bandwidth applied
};

// `bytes` as NCCL counts them (ncclFuncMaxSendRecvCount): the gathered output of an
// all-gather, the input of a reduce-scatter, the buffer of an all-reduce. Ranks sit on
// `nodes` nodes, nRanks / nodes each. Empty where no algorithm applies (a group of one).
[[nodiscard]] std::optional<NcclEstimate> ncclCollective(const ClusterSpec& c, const NcclSpec& s,
                                                         OpKind kind, int64_t bytes, int nRanks,
                                                         int nodes, const NcclEnv& env = {});
// Every algorithm and protocol NCCL would consider for this call, cheapest first.
[[nodiscard]] std::vector<NcclEstimate> ncclCandidates(const ClusterSpec& c, const NcclSpec& s,
                                                       OpKind kind, int64_t bytes, int nRanks,
                                                       int nodes, const NcclEnv& env = {});

// The topology search's result for a communicator of `localRanks` GPUs a node on `nodes`
// nodes: ring (and tree, which takes the ring's channels), and NVLS where the node has it.
struct NcclGraphs {
    NcclGraph ring, nvls;
};
[[nodiscard]] NcclGraphs ncclGraphs(const ClusterSpec& c, const NcclSpec& s, int nodes,
                                    int localRanks);

// What a running collective takes from the compute beside it. NCCL launches one CTA per
// channel, each holding an SM for the whole collective (the runtime connects twice the
// channels of the topology graph for Ring and Tree: "24 coll channels" on an H100 node whose
// ring graph has 12); and its kernels move the data through HBM: a ring all-gather writes
// each received byte and reads it to forward it (2 bytes of traffic a bus byte), a
// reduce-scatter also reads its own contribution (3), an all-reduce does both (5).
struct NcclOccupancy {
    int ctas = 0, sms = 0;
    double smShare = 0;   // ctas / sms
    double hbmShare = 0;  // the collective's HBM traffic over its duration / HBM bandwidth
};
[[nodiscard]] NcclOccupancy ncclOccupancy(const ClusterSpec& c, const NcclSpec& s,
                                          const NcclEstimate& e, OpKind kind, int64_t bytes,
                                          int nRanks);
// SMs of a GPU of this compute capability (A100 108, H100/H200 132, B200 148) unless the
// profile says (nccl.sms).
[[nodiscard]] int smCount(const NcclSpec& s);

// Which constant table a version string selects: "2.27" (2.23 to 2.27), "2.28" or "2.30"
// (2.29 and 2.30); empty for versions before 2.23, whose tables are not modelled.
[[nodiscard]] std::string ncclTableFor(const std::string& version);

// Fill-a-node-first placement of `ranks` on a cluster: nodes and ranks per node.
struct RankPlacement {
    int nodes = 1, perNode = 1;
};
[[nodiscard]] RankPlacement placeRanks(const ClusterSpec& c, int64_t ranks);

}  // namespace shardscope
