// SPDX-License-Identifier: Apache-2.0
// NCCL's cost model, restated from NVIDIA/nccl src/graph/tuning.cc (ncclTopoTuneModel,
// ncclTopoGetAlgoTime), src/graph/search.cc (ncclTopoCompute, ncclTopoDupChannels) and
// src/enqueue.cc (topoGetAlgoInfo) at tags v2.27.7-1, v2.28.9-1 and v2.30.7-1.
// docs/collectives.md lists what is simplified (the topology search above all).
#include "engine/sim/nccl_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>

#include "plans/core/strings.h"

namespace shardscope {

namespace {

constexpr int kTree = 0, kRing = 1, kNvls = 2, kNvlsTree = 3, kPat = 4;
constexpr int kLL = 0, kLL128 = 1, kSimple = 2;
constexpr int kNvlink = 0, kPci = 1, kNet = 2;

// tuning.cc's constant tables, indexed [algorithm][protocol] (algorithms in this file's
// order: Tree, Ring, NVLS, NVLSTree, PAT; CollNet is not modelled), and by compute
// capability (Volta, Ampere, Hopper, Blackwell) x node count (1, 2, 3 or more).
struct Tables {
    const char* name;
    double baseLat[kNcclAlgos][kNcclProtos];
    double hwLat[3][kNcclAlgos][kNcclProtos];  // NVLink, PCI, network
    double llMaxBw[4][3];  // rows: Volta-N1/Intel-N2/Intel-N4, Ampere-N1/AMD-N2/AMD-N4, Hopper-N1,
                           // Blackwell-N1
    double ringLL128[4][3], treeLL128[4][3], treeBw[4][3], nvlsTreeBw[4][3];
    double nvlsEfficiency[4];
    bool nvlsEfficiencyModel;  // 2.28+: NVLS bandwidth from nvlsEfficiency; before, min(intra,
                               // inter) x 5/6
    std::array<double, 12> sm100Intra, sm100Inter;  // search.cc's SM100 speed lists (0 ends)
};

constexpr Tables kTables[] = {
    {"2.27",
     {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}, {0, 0, 0}, {0, 0, 0}, {8.0, 8.0, 8.0}},
     {{{.6, 1.25, 4.0}, {.6, 1.9, 3.4}, {0, 0, 25}, {0, 0, 25}, {0, 0, 4.0}},
      {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}, {0, 0, 0}, {0, 0, 0}, {0, 0, 4.0}},
      {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}, {0, 0, 18}, {0, 0, 14}, {0, 0, 14}}},
     {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {282.0, 90.0, 70.0}},
     {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 36.7}, {73.4, 73.4, 73.4}},
     {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29.0}, {73.4, 73.4, 58.0}},
     {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {77.4, 82.8, 72.0}},
     {{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}},
     {0, 0, .85, .74},
     false,
     {90, 80, 70, 60, 50, 40, 30, 24, 20, 19, 18, 0},
     {96, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12}},
    {"2.28",
     {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}, {0, 0, 0}, {0, 0, 0}, {8.0, 8.0, 8.0}},
     {{{.6, 1.25, 4.0}, {.6, 1.9, 3.4}, {0, 0, 25}, {0, 0, 25}, {0, 0, 4.0}},
      {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}, {0, 0, 0}, {0, 0, 0}, {0, 0, 4.0}},
      {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}, {0, 0, 18}, {0, 0, 20.9}, {0, 0, 14}}},
     {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {282.0, 90.0, 70.0}},
     {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 36.7}, {73.4, 34.6, 73.4}},
     {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}},
     {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}},
     {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {0.0, 57.7, 45.5}, {0.0, 96.0, 43.8}},
     {0, 0, .85, .74},
     true,
     {90, 80, 70, 60, 50, 40, 30, 24, 20, 19, 18, 0},
     {96, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5, 15, 12}},
    {"2.30",
     {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}, {0, 0, 0}, {0, 0, 0}, {8.0, 8.0, 8.0}},
     {{{.6, 1.25, 4.0}, {.6, 1.9, 3.4}, {0, 0, 25}, {0, 0, 25}, {0, 0, 4.0}},
      {{1.0, 1.9, 4.0}, {1.0, 2.5, 5.7}, {0, 0, 0}, {0, 0, 0}, {0, 0, 4.0}},
      {{5.0, 8.5, 14}, {2.7, 4.0, 14.0}, {0, 0, 18}, {0, 0, 20.9}, {0, 0, 14}}},
     {{39.0, 39.0, 20.4}, {87.7, 22.5, 19.0}, {141.0, 45.0, 35.0}, {282.0, 90.0, 70.0}},
     {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 36.7}, {40.0, 40.0, 40.0}},
     {{20, 20, 20}, {20, 20, 20}, {36.7, 36.7, 29.0}, {55.6, 31.67, 20.0}},
     {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {38.7, 41.4, 36.0}, {70.0, 42.8, 24.0}},
     {{26.5, 18.5, 10.0}, {24.0, 23.6, 17.8}, {0.0, 57.7, 45.5}, {0.0, 96.0, 80.0}},
     {0, 0, .85, .74},
     true,
     {90, 80, 70, 60, 50, 45, 40, 30, 24, 20, 19, 18},
     {96, 86, 80, 48, 45.1, 42, 40, 30, 24, 22, 20, 17.5}},
};

// Tree correction factors by log2(nBytes / 64), 64 B to 256 MB (ncclTopoGetAlgoTime).
constexpr double kTreeCorrection[kNcclProtos][23] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7,  .7,  .7,  .6, .5,
     .4,  .4,  .5,  .6,  .7, .8, .9, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7,  .6, .6,
     .6,  .6,  .6,  .6,  .8,  .9, .9, .9, .9, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9}};

// search.cc's speed lists (GB/s per channel) for SM80 and SM90; SM100's are per version.
constexpr double kIntraSpeeds[] = {40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0,
                                   9.0,  7.0,  6.0,  5.0,  4.0,  3.0};
constexpr double kInterSpeeds[] = {48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0,
                                   7.0,  6.0,  5.0,  4.0,  3.0,  2.4,  1.2,  0.24, 0.12};
constexpr double kSm90Intra[] = {60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0};
constexpr double kSm90Inter[] = {48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5,
                                 15.0, 12.0, 6.0,  3.0,  2.4,  1.2,  0.24, 0.12};

std::vector<double> speedList(const Tables& t, int cc, bool inter) {
    auto from = [](const auto& a) { return std::vector<double>(std::begin(a), std::end(a)); };
    if (cc >= 100) {
        std::vector<double> v;
        for (double x : inter ? t.sm100Inter : t.sm100Intra)
            if (x > 0) v.push_back(x);
        // The lists go on below 12 GB/s as SM90's do.
        if (inter)
            for (double x : {6.0, 3.0, 2.4, 1.2, 0.24, 0.12})
                if (x < v.back()) v.push_back(x);
        return v;
    }
    if (cc >= 90) return inter ? from(kSm90Inter) : from(kSm90Intra);
    return inter ? from(kInterSpeeds) : from(kIntraSpeeds);
}

// Per-NVLink bandwidth NCCL assumes, GB/s (topo.h ncclTopoNVLinkBw): SM90 20.6 since 2.20.
double nvlinkBw(int cc) {
    if (cc >= 100) return 40.1;
    if (cc >= 90) return 20.6;
    if (cc == 86) return 12.0;
    if (cc >= 70) return 20.0;
    return 18.0;
}

int archIndex(int cc) {
    return cc >= 100 ? 3 : cc >= 90 ? 2 : cc >= 80 ? 1 : 0;
}

int minorOf(const std::string& version) {
    int major = 0, minor = 0;
    if (std::sscanf(version.c_str(), "%d.%d", &major, &minor) != 2 || major != 2) return -1;
    return minor;
}

const Tables* tablesFor(const std::string& version) {
    const int m = minorOf(version);
    if (m < 23) return nullptr;
    if (m <= 27) return &kTables[0];
    if (m == 28) return &kTables[1];
    return &kTables[2];
}

// ncclTopoDupChannels: doubles the channels at half the bandwidth where bandwidth allows.
void dupChannels(NcclGraph& g, int cc) {
    if (g.channels == 0 || g.bwIntra < 25.0) return;
    if (cc > 80 && g.bwIntra < 50.0 && g.channels > 4) return;
    g.channels *= 2;
    g.bwIntra /= 2;
    g.bwInter /= 2;
}

int funcIndex(OpKind k) {
    return k == OpKind::AllGather ? 0 : k == OpKind::ReduceScatter ? 1 : 2;
}

// log2 rounded down, 0 below 1 (NCCL's log2i).
int log2i(double x) {
    return x >= 1 ? static_cast<int>(std::floor(std::log2(x))) : 0;
}

// Data bytes of one pipeline slice per channel (the unit whose fill a collective pays once):
// a step of NCCL's buffer per channel (NCCL_STEPS = 8 steps a buffer), times the slice's
// steps. Simple: 4 MiB / 8 x 2 steps (ALLGATHER/ALLREDUCE_SLICESTEPS); LL: 8 lines a thread
// x 512 threads of 16-B lines carrying 8 B of data; LL128: 120 of each 128 8-B elements of
// 640 threads (src/include/device.h, collectives.h).
double sliceBytes(int proto) {
    switch (proto) {
        case kLL:
            return 8.0 * 512 * 8;
        case kLL128:
            return 120.0 * 640 * 8 * 120 / 128;
        default:
            return 4.0 * 1024 * 1024 / 8 * 2;
    }
}

}  // namespace

const char* ncclAlgoName(NcclAlgo a) {
    static const char* names[] = {"Tree", "Ring", "NVLS", "NVLSTree", "PAT"};
    return names[static_cast<int>(a)];
}

const char* ncclProtoName(NcclProto p) {
    static const char* names[] = {"LL", "LL128", "Simple"};
    return names[static_cast<int>(p)];
}

std::string ncclTableFor(const std::string& version) {
    const Tables* t = tablesFor(version);
    return t ? t->name : "";
}

RankPlacement placeRanks(const ClusterSpec& c, int64_t ranks) {
    const int64_t dpn = std::max<int64_t>(1, c.node.devicesPerNode);
    RankPlacement p;
    p.perNode = static_cast<int>(std::max<int64_t>(1, std::min(ranks, dpn)));
    p.nodes = static_cast<int>((ranks + p.perNode - 1) / p.perNode);
    return p;
}

Expected<NcclEnv> parseNcclEnv(const std::string& algoStr, const std::string& protoStr,
                               const std::string& nvlsEnable) {
    NcclEnv e;
    static const std::vector<std::string> funcs{"allgather", "reducescatter", "allreduce"};
    static const std::vector<std::string> algos{"tree", "ring", "nvls", "nvlstree", "pat"};
    static const std::vector<std::string> protos{"ll", "ll128", "simple"};
    // NCCL's parseList: "[prefix:]list;prefix:list", a list led by "^" disables its items.
    auto apply = [&](const std::string& str, const std::vector<std::string>& elems, bool* table,
                     int width, const char* var) -> Status {
        if (str.empty()) return {};
        bool first = true;
        for (const std::string& entry : split(str, ';')) {
            std::string prefix, list = entry;
            if (const auto colon = entry.find(':'); colon != std::string::npos) {
                prefix = toLower(trim(entry.substr(0, colon)));
                list = entry.substr(colon + 1);
            } else if (!first) {
                return Error{std::string(var) + "=\"" + str +
                             "\": every entry after the first needs a function prefix "
                             "(allgather:, reducescatter:, allreduce:)"};
            }
            first = false;
            list = trim(list);
            const bool negate = !list.empty() && list[0] == '^';
            if (negate) list = list.substr(1);
            std::vector<bool> named(elems.size(), false);
            for (const std::string& raw : split(list, ',')) {
                const std::string item = toLower(trim(raw));
                if (item == "collnetdirect" || item == "collnetchain") continue;  // not modelled
                const auto it = std::find(elems.begin(), elems.end(), item);
                if (it == elems.end())
                    return Error{std::string(var) + "=\"" + str + "\": unknown element \"" + raw +
                                 "\"" + didYouMean(item, elems)};
                named[static_cast<size_t>(it - elems.begin())] = true;
            }
            bool matched = false;
            for (size_t f = 0; f < funcs.size(); ++f) {
                if (!prefix.empty() && prefix != funcs[f]) continue;
                matched = true;
                for (size_t i = 0; i < elems.size(); ++i)
                    table[f * static_cast<size_t>(width) + i] = negate ? !named[i] : named[i];
            }
            if (!matched && prefix != "broadcast" && prefix != "reduce")
                return Error{std::string(var) + "=\"" + str + "\": unknown function \"" + prefix +
                             "\"" + didYouMean(prefix, funcs)};
        }
        return {};
    };
    if (auto st = apply(algoStr, algos, &e.algo[0][0], kNcclAlgos, "NCCL_ALGO"); !st.ok())
        return Error{st.error()};
    if (auto st = apply(protoStr, protos, &e.proto[0][0], kNcclProtos, "NCCL_PROTO"); !st.ok())
        return Error{st.error()};
    if (!nvlsEnable.empty()) {
        if (nvlsEnable != "0" && nvlsEnable != "1" && nvlsEnable != "2")
            return Error{"NCCL_NVLS_ENABLE=\"" + nvlsEnable + "\": expected 0, 1 or 2"};
        e.nvls = nvlsEnable != "0";
    }
    return e;
}

NcclGraphs ncclGraphs(const ClusterSpec& c, const NcclSpec& s, int nodes, int localRanks) {
    NcclGraphs g;
    const Tables* t = tablesFor(s.version);
    if (!t) t = &kTables[1];
    const int cc = s.computeCapability;
    // The GPU's bandwidth into the node: its NVLinks to the NVSwitches, else its PCIe path.
    const double totalBw = s.nvlinks > 0 ? s.nvlinks * nvlinkBw(cc) : s.gpuNicBandwidth / 1e9;
    double nicSpeed = 0;  // GB/s of one channel through a NIC, across nodes
    if (nodes <= 1) {
        // One node: the most channels times speed, at the first speed of the list that the
        // GPU's bandwidth allows, stopping once channels x speed reach that bandwidth
        // (ncclTopoCompute's search over an NVSwitch, where every channel takes the same path).
        double best = 0;
        for (double sp : speedList(*t, cc, false)) {
            if (sp > totalBw) continue;
            const int nc = std::min(16, static_cast<int>(std::floor(totalBw / sp + 1e-9)));
            if (nc * sp > best + 1e-9) {
                best = nc * sp;
                g.ring = {nc, sp, sp};
            }
            if (nc * sp >= totalBw - 1e-9) break;
        }
        dupChannels(g.ring, cc);
    } else {
        // Across nodes each channel leaves the node through one NIC, at the first speed of the
        // list its GPU-NIC path and the NIC allow; a node's channels are its NICs.
        const double perNic =
            c.network.nicBandwidth * static_cast<double>(c.node.devicesPerNode) / s.nicsPerNode;
        const double path = std::min(perNic, s.gpuNicBandwidth) / 1e9;
        double sp = 0.12;
        for (double x : speedList(*t, cc, true))
            if (x <= path + 1e-9) {
                sp = x;
                break;
            }
        nicSpeed = sp;
        const double nicsPerGpu = static_cast<double>(s.nicsPerNode) /
                                  static_cast<double>(std::max<int64_t>(1, c.node.devicesPerNode));
        const int nc = std::max(
            1,
            static_cast<int>(std::floor(std::min<double>(s.nicsPerNode, nicsPerGpu * localRanks))));
        g.ring = {nc, sp, sp};
        dupChannels(g.ring, cc);
    }
    // NVLS: one channel per GPU of the node pulling from the switch (NCCL_MAX_NVLS_ARITY 32),
    // or one per NIC head across nodes. Its per-channel speed is the first of the list at or
    // below the GPU's NVLink bandwidth over ranks + 1 (a reduction through the switch sends
    // n + 1 times the data for 2n of a ring); inter is the list's top within 2x that, within
    // a node, or the NIC path across nodes. This rule reproduces the graphs NCCL logs on H100
    // (8 channels at 40 GB/s) and the B200 NVLS bandwidth (docs/collectives.md).
    if (s.nvls && cc >= 90 && s.nvlinks > 0 && localRanks >= 2) {
        const double per = totalBw / (localRanks + 1);
        const auto intra = speedList(*t, cc, false);
        double sp = intra.back();
        for (double x : intra)
            if (x <= per + 1e-9) {
                sp = x;
                break;
            }
        double inter = sp;
        for (double x : intra)
            if (x < 2 * sp) {
                inter = std::max(inter, x);
                break;
            }
        int nc = std::min(32, localRanks);
        if (nodes > 1) {
            nc = std::min(nc, s.nicsPerNode);
            inter = nicSpeed;
        }
        g.nvls = {nc, sp, inter};
    }
    return g;
}

std::vector<NcclEstimate> ncclCandidates(const ClusterSpec& c, const NcclSpec& s, OpKind kind,
                                         int64_t bytes, int nRanks, int nodes, const NcclEnv& env) {
    std::vector<NcclEstimate> out;
    if (nRanks <= 1 || bytes <= 0 || nodes < 1 || nodes > nRanks) return out;
    if (kind != OpKind::AllGather && kind != OpKind::ReduceScatter && kind != OpKind::AllReduce)
        return out;
    const Tables* tp = tablesFor(s.version);
    if (!tp) tp = &kTables[1];
    const Tables& t = *tp;
    const int cc = s.computeCapability;
    const int arch = archIndex(cc);
    const int f = funcIndex(kind);
    const bool allReduce = kind == OpKind::AllReduce;
    const double ppn = static_cast<double>(nRanks) / nodes;
    const int localRanks = static_cast<int>(std::ceil(ppn));
    const NcclGraphs graphs = ncclGraphs(c, s, nodes, localRanks);
    const int index2 = nodes <= 2 ? nodes - 1 : 2;
    const int index1 = nodes == 1 ? arch : (s.cpuVendor == "amd" ? 1 : 0);
    const double llMaxBw = t.llMaxBw[index1][index2];
    const int nsteps = allReduce ? 2 * (nRanks - 1) : nRanks - 1;
    const int intraHw = s.nvlinks > 0 ? kNvlink : kPci;
    const bool patEnabled = nodes == nRanks && minorOf(s.version) >= 23;
    const double nb = static_cast<double>(bytes);

    for (int a = 0; a < kNcclAlgos; ++a) {
        if (!env.algo[f][a]) continue;
        if (!allReduce && a != kPat && a != kRing && a != kNvls) continue;
        if (allReduce && a == kPat) continue;
        if (a == kPat && !patEnabled) continue;
        const bool nvlsFamily = a == kNvls || a == kNvlsTree;
        if (nvlsFamily && (!env.nvls || graphs.nvls.channels < 2)) continue;
        // NVLS across nodes needs CollNet (SHARP), not modelled; NVLSTree needs several nodes.
        if (a == kNvls && nodes > 1) continue;
        if (a == kNvlsTree && nodes == 1) continue;
        const NcclGraph& g = nvlsFamily ? graphs.nvls : graphs.ring;
        for (int p = 0; p < kNcclProtos; ++p) {
            if (!env.proto[f][p]) continue;
            if (nvlsFamily && p != kSimple) continue;
            if (a == kPat && p != kSimple) continue;
            // LL128 is on by default over NVLink (typeIntra <= NVB) and, on SM90+, any NIC path.
            if (p == kLL128 && s.nvlinks == 0) continue;
            double bw = nodes <= 2 ? g.bwIntra : g.bwInter;
            if (nvlsFamily) {
                if (t.nvlsEfficiencyModel) {
                    double intraBw =
                        g.bwIntra * t.nvlsEfficiency[arch] * (g.channels - 1) / g.channels;
                    intraBw *= allReduce ? 2.0 : (ppn - 1) / ppn;
                    const double interBw = g.bwInter * ((nodes <= 2 && a == kNvlsTree) ? 2 : 1);
                    bw = std::min(intraBw, interBw);
                    if (a == kNvlsTree) bw = std::min(bw, t.nvlsTreeBw[arch][index2]);
                } else if (a == kNvls) {
                    bw = allReduce ? std::min(g.bwIntra, g.bwInter)
                                   : std::min(g.bwIntra * (ppn - 1) / ppn, g.bwInter * 0.9);
                } else {
                    bw = std::min(g.bwIntra, nodes <= 2 ? g.bwInter : g.bwInter / 2);
                }
            }
            double busBw = g.channels * bw;
            if (a == kRing && p == kLL) busBw = std::min(llMaxBw, busBw * .5);
            if (a == kRing && p == kLL128)
                busBw = std::min(busBw * 0.92, g.channels * t.ringLL128[arch][index2]);
            if (a == kTree && allReduce)
                busBw = std::min(busBw * .92, g.channels * t.treeBw[arch][index2]);
            if (a == kTree && p == kLL) busBw = std::min(busBw / 3.8, llMaxBw);
            if (a == kTree && p == kLL128)
                busBw = std::min(busBw * (nodes == 1 ? 7.0 / 9.0 : 120.0 / 128.0),
                                 g.channels * t.treeLL128[arch][index2]);
            if (a == kPat) busBw *= .75;
            if (busBw <= 0) continue;
            const double bus = busBw;
            // Bus to algorithm bandwidth.
            if (!(a != kRing && !allReduce)) {
                if (a == kRing || (nvlsFamily && t.nvlsEfficiencyModel))
                    busBw *= static_cast<double>(nRanks) / nsteps;
                else if (nvlsFamily)
                    busBw *= 5.0 / 6.0;
                else
                    busBw *= .5;
            }
            double lat = t.baseLat[a][p];
            const double intraLat = t.hwLat[intraHw][a][p];
            double interLat = (ppn == 1 ? t.hwLat[kNet][kTree][p] : t.hwLat[kNet][a][p]) +
                              s.netLatencyUs * (p == kSimple ? 2 : 1);
            if (a == kRing) {
                double netOverhead = 0;
                if (nodes > 1) {
                    netOverhead = s.cpuVendor == "amd" ? 2.0 : 1.0;
                    if (p == kSimple) netOverhead *= 3;
                }
                // Each intra-node step costs at least the network post overhead once the ring
                // crosses nodes ("inter-node rings still have to launch nsteps * net overhead").
                const double il = std::max(intraLat, netOverhead);
                const int nInter = nodes == 1 ? 0 : allReduce ? 2 * (nodes - 1) : nodes - 1;
                lat += (nsteps - nInter) * il + nInter * interLat;
            } else if (a == kTree) {
                lat += 2 * ((nRanks / nodes - 1) * intraLat + log2i(nodes) * interLat);
            } else if (a == kNvls) {
                lat = intraLat + (nodes > 1 ? interLat : 0);
            } else if (a == kNvlsTree) {
                lat += intraLat + 2 * log2i(nodes) * interLat;
            } else if (a == kPat) {
                lat += log2i(nodes) * (interLat / 3.5) + nRanks * 2.8;
            }
            // ncclTopoGetAlgoTime's call-time corrections.
            double algBw = busBw;
            const int logSize = log2i(nb / 64);
            if (a == kTree && allReduce && logSize >= 0 && logSize < 23)
                algBw *= kTreeCorrection[p][logSize];
            if (a == kRing && p == kSimple && nodes > 1 && allReduce &&
                nb / (g.channels * nRanks) >= 64)
                lat *= cc < 80 ? 1.9 : 1.4;
            NcclEstimate e;
            e.algo = static_cast<NcclAlgo>(a);
            e.proto = static_cast<NcclProto>(p);
            e.channels = g.channels;
            e.nodes = nodes;
            e.ppn = ppn;
            e.latencyUs = lat;
            e.algbwGBps = algBw;
            e.busbwGBps = bus;
            e.ncclUs = lat + nb / (1000 * algBw);
            // Corrections: what the call costs outside NCCL's latency, the achieved fraction of
            // its bandwidth, and the pipeline's fill of one slice per channel at the channel's
            // bus bandwidth.
            e.efficiency = nvlsFamily  ? s.nvlsEfficiency
                           : nodes > 1 ? s.netEfficiency
                                       : s.nvlinkEfficiency;
            const double perRankChannel =
                a == kRing ? nb / (static_cast<double>(nRanks) * g.channels) : nb / g.channels;
            e.launchUs = s.launchUs;
            // NVLS within a node is one hop through the switch: one slice fills it.
            const double slices = a == kNvls ? 1.0 : s.fillSlices;
            e.fillUs = slices * std::min(perRankChannel, sliceBytes(p)) /
                       (1000 * (bus / g.channels) * e.efficiency);
            e.us = lat + e.launchUs + nb / (1000 * algBw * e.efficiency) + e.fillUs;
            out.push_back(e);
        }
    }
    std::stable_sort(out.begin(), out.end(), [](const NcclEstimate& x, const NcclEstimate& y) {
        return x.ncclUs < y.ncclUs;
    });
    return out;
}

int smCount(const NcclSpec& s) {
    if (s.sms > 0) return s.sms;
    if (s.computeCapability >= 100) return 148;
    if (s.computeCapability >= 90) return 132;
    if (s.computeCapability >= 80) return 108;
    return 80;  // V100
}

NcclOccupancy ncclOccupancy(const ClusterSpec& c, const NcclSpec& s, const NcclEstimate& e,
                            OpKind kind, int64_t bytes, int nRanks) {
    NcclOccupancy o;
    o.sms = smCount(s);
    const bool nvls = e.algo == NcclAlgo::NVLS || e.algo == NcclAlgo::NVLSTree;
    o.ctas = nvls ? e.channels : 2 * e.channels;
    o.smShare = std::min(1.0, static_cast<double>(o.ctas) / o.sms);
    if (e.us > 0 && c.device.hbmBandwidth > 0 && nRanks > 1) {
        const double bus = static_cast<double>(bytes) * (nRanks - 1) / nRanks;
        const double passes = kind == OpKind::AllGather ? 2 : kind == OpKind::ReduceScatter ? 3 : 5;
        o.hbmShare = std::min(1.0, passes * bus / (e.us * 1e-6) / c.device.hbmBandwidth);
    }
    return o;
}

std::optional<NcclEstimate> ncclCollective(const ClusterSpec& c, const NcclSpec& s, OpKind kind,
                                           int64_t bytes, int nRanks, int nodes,
                                           const NcclEnv& env) {
    auto all = ncclCandidates(c, s, kind, bytes, nRanks, nodes, env);
    if (all.empty()) return std::nullopt;
    return all.front();
}

}  // namespace shardscope
