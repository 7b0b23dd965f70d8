// SPDX-License-Identifier: Apache-2.0
// NCCL's cost model against what others computed and published: the worked numbers of an
// independent restatement of tuning.cc at 2.30.7 (the shared reference's nccl-model.md,
// section 1.5, re-evaluated from the source by another hand), the choices NCCL logged on real
// nodes, and the cluster's nccl section read and refused as its loader promises.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "engine/sim/cost_model.h"
#include "engine/sim/nccl_model.h"
#include "plans/cluster/cluster.h"

using namespace shardscope;

namespace {

std::string sample(const std::string& name) {
    return std::string(SHARDSCOPE_SOURCE_DIR) + "/samples/clusters/" + name;
}

ClusterSpec load(const std::string& name) {
    auto c = loadClusterFile(sample(name));
    EXPECT_TRUE(c.ok()) << c.error();
    return *c;
}

// NCCL's raw model only: no correction, so the figures are tuning.cc's.
NcclSpec raw(NcclSpec s) {
    s.launchUs = 0;
    s.netLatencyUs = 0;
    s.nvlinkEfficiency = s.netEfficiency = s.nvlsEfficiency = 1;
    s.fillSlices = 0;
    return s;
}

const NcclEstimate* find(const std::vector<NcclEstimate>& v, NcclAlgo a, NcclProto p) {
    for (const auto& e : v)
        if (e.algo == a && e.proto == p) return &e;
    return nullptr;
}

constexpr int64_t MiB = int64_t{1} << 20;

}  // namespace

// Section 1.5, single node, 8 x H100, ring 12 x 30 GB/s, NVLS 8 channels: every
// algorithm's latency and algorithm bandwidth, and the sizes where all-gather changes protocol.
TEST(NcclModel, OneNodeH100MatchesTheWorkedTable) {
    ClusterSpec c = load("h100-sxm-80gb-ib.json");
    const NcclSpec s = raw(*c.nccl);
    const auto g = ncclGraphs(c, s, 1, 8);
    EXPECT_EQ(g.ring.channels, 12);
    EXPECT_DOUBLE_EQ(g.ring.bwIntra, 30.0);
    EXPECT_EQ(g.nvls.channels, 8);
    EXPECT_DOUBLE_EQ(g.nvls.bwIntra, 40.0);
    struct Row {
        OpKind kind;
        NcclAlgo algo;
        NcclProto proto;
        double latencyUs, algbw;
    };
    const Row rows[] = {
        {OpKind::AllGather, NcclAlgo::Ring, NcclProto::LL, 10.8, 161},
        {OpKind::AllGather, NcclAlgo::Ring, NcclProto::LL128, 27.3, 378.5},
        {OpKind::AllGather, NcclAlgo::Ring, NcclProto::Simple, 32.2, 411.4},
        {OpKind::AllReduce, NcclAlgo::Ring, NcclProto::LL, 15.0, 80.6},
        {OpKind::AllReduce, NcclAlgo::Ring, NcclProto::LL128, 40.6, 189.3},
        {OpKind::AllReduce, NcclAlgo::Ring, NcclProto::Simple, 56.0, 205.7},
        {OpKind::AllReduce, NcclAlgo::NVLS, NcclProto::Simple, 25.0, 272},
    };
    for (const Row& r : rows) {
        const auto all = ncclCandidates(c, s, r.kind, 1 << 30, 8, 1);
        const NcclEstimate* e = find(all, r.algo, r.proto);
        ASSERT_NE(e, nullptr) << ncclAlgoName(r.algo) << "/" << ncclProtoName(r.proto);
        EXPECT_NEAR(e->latencyUs, r.latencyUs, 0.05)
            << ncclAlgoName(r.algo) << "/" << ncclProtoName(r.proto);
        EXPECT_NEAR(e->algbwGBps, r.algbw, 0.5)
            << ncclAlgoName(r.algo) << "/" << ncclProtoName(r.proto);
    }
    // "Resulting choice for all-gather: LL below about 4.6 MB, LL128 from 4.6 to 23 MB, Simple
    // above."
    auto pick = [&](int64_t bytes) {
        return ncclCollective(c, s, OpKind::AllGather, bytes, 8, 1)->proto;
    };
    EXPECT_EQ(pick(4 * MiB), NcclProto::LL);
    EXPECT_EQ(pick(5 * MiB), NcclProto::LL128);
    EXPECT_EQ(pick(21 * MiB), NcclProto::LL128);
    EXPECT_EQ(pick(23 * MiB), NcclProto::Simple);
}

// Section 1.5, multi-node ring all-gather, 8 GPUs a node, 8 channels x 48 GB/s, Intel hosts,
// InfiniBand: the protocol NCCL picks, its time and busbw from 2 to 128 nodes.
TEST(NcclModel, MultiNodeH100MatchesTheWorkedTable) {
    ClusterSpec c = load("h100-sxm-80gb-ib.json");
    const NcclSpec s = raw(*c.nccl);
    struct Row {
        int ranks;
        int64_t bytes;
        NcclProto proto;
        double us, busbw;  // us < 0: not given
    };
    const Row rows[] = {
        {16, 2 * MiB, NcclProto::LL128, 51, 38},
        {16, 128 * MiB, NcclProto::Simple, 398, 316},
        {16, 2048 * MiB, NcclProto::Simple, -1, 379},
        {16, 8192 * MiB, NcclProto::Simple, -1, 383},
        {64, 2 * MiB, NcclProto::LL128, 155, 13},
        {64, 128 * MiB, NcclProto::LL128, 598, 221},
        {64, 2048 * MiB, NcclProto::Simple, -1, 364},
        {64, 8192 * MiB, NcclProto::Simple, -1, 379},
        {256, 2 * MiB, NcclProto::LL, 417, 5.0},
        {256, 128 * MiB, NcclProto::LL128, 1020, 131},
        {256, 2048 * MiB, NcclProto::Simple, -1, 316},
        {256, 8192 * MiB, NcclProto::Simple, -1, 364},
        {1024, 2 * MiB, NcclProto::LL, 1350, 1.6},
        {1024, 128 * MiB, NcclProto::LL128, 2680, 50},
        {1024, 2048 * MiB, NcclProto::LL128, -1, 225},
        {1024, 8192 * MiB, NcclProto::Simple, -1, 316},
    };
    for (const Row& r : rows) {
        const auto e = ncclCollective(c, s, OpKind::AllGather, r.bytes, r.ranks, r.ranks / 8);
        ASSERT_TRUE(e);
        EXPECT_EQ(e->algo, NcclAlgo::Ring);
        EXPECT_EQ(e->proto, r.proto) << r.ranks << " ranks, " << r.bytes << " B";
        if (r.us > 0) {
            EXPECT_NEAR(e->ncclUs, r.us, r.us * 0.01 + 0.5) << r.ranks << " ranks";
        }
        // The table gives two significant figures below 20 GB/s.
        const double busbw =
            static_cast<double>(r.bytes) / (e->ncclUs * 1e3) * (r.ranks - 1) / r.ranks;
        const double tol = r.busbw < 20 ? r.busbw * 0.05 : r.busbw * 0.01 + 0.1;
        EXPECT_NEAR(busbw, r.busbw, tol) << r.ranks << " ranks, " << r.bytes << " B";
    }
}

// stas00's 8 x H200 sweep (NCCL 2.27.7): "NCCL uses Ring with the LL protocol up to a 1MiB
// payload and NVLS with SIMPLE from 2MiB up"; with NVLS disabled, Ring.
TEST(NcclModel, PicksWhatNcclPickedOnAnH200Node) {
    ClusterSpec c = load("h200-sxm-1x8.json");
    NcclSpec s = *c.nccl;
    s.version = "2.27.7";
    for (int64_t b = 32 * 1024; b <= MiB; b *= 2) {
        const auto e = ncclCollective(c, s, OpKind::AllReduce, b, 8, 1);
        EXPECT_EQ(e->algo, NcclAlgo::Ring) << b;
        EXPECT_EQ(e->proto, NcclProto::LL) << b;
    }
    for (int64_t b = 2 * MiB; b <= 16384 * MiB; b *= 2)
        EXPECT_EQ(ncclCollective(c, s, OpKind::AllReduce, b, 8, 1)->algo, NcclAlgo::NVLS) << b;
    auto off = parseNcclEnv("", "", "0");
    ASSERT_TRUE(off.ok());
    EXPECT_EQ(ncclCollective(c, s, OpKind::AllReduce, 8192 * MiB, 8, 1, *off)->algo,
              NcclAlgo::Ring);
    // FSDP's collectives stay on the ring: NVLS never wins an all-gather of a node.
    for (int64_t b = 1 * MiB; b <= 8192 * MiB; b *= 4)
        EXPECT_EQ(ncclCollective(c, s, OpKind::AllGather, b, 8, 1)->algo, NcclAlgo::Ring) << b;
}

TEST(NcclModel, PatOnlyWithOneGpuPerNodeAndTreeOnlyForAllReduce) {
    ClusterSpec c = load("h100-sxm-80gb-ib.json");
    const NcclSpec s = raw(*c.nccl);
    bool pat = false;
    for (const auto& e : ncclCandidates(c, s, OpKind::AllGather, 64 * MiB, 16, 16))
        pat = pat || e.algo == NcclAlgo::PAT;
    EXPECT_TRUE(pat);
    for (const auto& e : ncclCandidates(c, s, OpKind::AllGather, 64 * MiB, 16, 2)) {
        EXPECT_NE(e.algo, NcclAlgo::PAT);
        EXPECT_NE(e.algo, NcclAlgo::Tree);
    }
    // An HSDP replicate group: one rank a node, all-reduce over the network only.
    const auto ar = ncclCollective(c, s, OpKind::AllReduce, 512 * MiB, 8, 8);
    ASSERT_TRUE(ar);
    EXPECT_EQ(ar->nodes, 8);
    EXPECT_DOUBLE_EQ(ar->ppn, 1.0);
}

TEST(NcclModel, TheCorrectionsAddToNcclsEstimate) {
    ClusterSpec c = load("h100-sxm-80gb-ib.json");
    NcclSpec s = raw(*c.nccl);
    const auto base = ncclCollective(c, s, OpKind::ReduceScatter, 256 * MiB, 64, 8);
    s.launchUs = 10;
    s.netEfficiency = 0.5;
    const auto slow = ncclCollective(c, s, OpKind::ReduceScatter, 256 * MiB, 64, 8);
    ASSERT_TRUE(base && slow);
    EXPECT_EQ(base->algo, slow->algo);  // NCCL picks by its own estimate
    EXPECT_DOUBLE_EQ(base->ncclUs, slow->ncclUs);
    const double bwUs = base->ncclUs - base->latencyUs;
    EXPECT_NEAR(slow->us, base->us + 10 + bwUs, 1e-6);
}

TEST(NcclModel, TheStepSimulatorPricesCollectivesWithTheSameFunction) {
    ClusterSpec c = load("h100-sxm-80gb-ib.json");
    const auto e = ncclCollective(c, *c.nccl, OpKind::AllGather, 436 * MiB, 128, 16);
    const auto cost = collectiveTime(c, OpKind::AllGather, 436 * MiB, 128, 16, 8);
    ASSERT_TRUE(e);
    EXPECT_EQ(cost.ns, static_cast<int64_t>(std::llround(e->us * 1000)));
    EXPECT_EQ(cost.algorithm, static_cast<int>(e->algo));
}

TEST(NcclModel, ACollectiveHoldsOneSmPerChannelAndHbmForItsCopies) {
    // 8 x H100, ring all-gather: a 12-channel graph, connected twice over at run time
    // ("24 coll channels" in p5's logs): 24 CTAs of 132 SMs. Its HBM traffic is two bytes a
    // bus byte (written as received, read to forward) over its time; a reduce-scatter three.
    ClusterSpec c = load("h100-sxm-80gb-ib.json");
    const int64_t bytes = 436 * MiB;
    const auto ag = ncclCollective(c, *c.nccl, OpKind::AllGather, bytes, 8, 1);
    ASSERT_TRUE(ag);
    EXPECT_EQ(ag->channels, 12);
    const NcclOccupancy o = ncclOccupancy(c, *c.nccl, *ag, OpKind::AllGather, bytes, 8);
    EXPECT_EQ(o.sms, 132);
    EXPECT_EQ(o.ctas, 24);
    EXPECT_DOUBLE_EQ(o.smShare, 24.0 / 132);
    const double bus = static_cast<double>(bytes) * 7 / 8;
    EXPECT_NEAR(o.hbmShare, 2 * bus / (ag->us * 1e-6) / c.device.hbmBandwidth, 1e-12);
    const auto rs = ncclCollective(c, *c.nccl, OpKind::ReduceScatter, bytes, 8, 1);
    const NcclOccupancy r = ncclOccupancy(c, *c.nccl, *rs, OpKind::ReduceScatter, bytes, 8);
    EXPECT_NEAR(r.hbmShare / o.hbmShare, 1.5 * ag->us / rs->us, 1e-9);
    // The step simulator's price carries the same shares.
    const CollectiveCost cost = collectiveTime(c, OpKind::AllGather, bytes, 8, 1, 8);
    EXPECT_DOUBLE_EQ(cost.smShare, o.smShare);
    EXPECT_DOUBLE_EQ(cost.hbmShare, o.hbmShare);
    // A100 has 108 SMs; a profile may say its own.
    ClusterSpec a = load("a100-sxm-80gb-1x8.json");
    EXPECT_EQ(smCount(*a.nccl), 108);
    a.nccl->sms = 100;
    EXPECT_EQ(smCount(*a.nccl), 100);
}

TEST(NcclModel, VersionsSelectTheirTables) {
    EXPECT_EQ(ncclTableFor("2.23.4"), "2.27");
    EXPECT_EQ(ncclTableFor("2.27.7"), "2.27");
    EXPECT_EQ(ncclTableFor("2.28.9"), "2.28");
    EXPECT_EQ(ncclTableFor("2.30.7"), "2.30");
    EXPECT_EQ(ncclTableFor("2.21.5"), "");
    // NVLSTree's per-channel cap on Blackwell across 3+ nodes: 43.8 GB/s in 2.28, 80 in 2.30.
    ClusterSpec c = load("b200-ib.json");
    NcclSpec s = raw(*c.nccl);
    s.version = "2.28.9";
    const auto a = find(ncclCandidates(c, s, OpKind::AllReduce, 4096 * MiB, 32, 4),
                        NcclAlgo::NVLSTree, NcclProto::Simple);
    s.version = "2.30.7";
    const auto b = find(ncclCandidates(c, s, OpKind::AllReduce, 4096 * MiB, 32, 4),
                        NcclAlgo::NVLSTree, NcclProto::Simple);
    ASSERT_TRUE(a && b);
    EXPECT_LT(a->busbwGBps, b->busbwGBps);
}

TEST(NcclModel, EnvironmentGrammarAsNcclParsesIt) {
    auto e = parseNcclEnv("allreduce:tree;allgather:ring", "^LL", "");
    ASSERT_TRUE(e.ok()) << e.error();
    EXPECT_TRUE(e->algo[2][0]);   // all-reduce: tree
    EXPECT_FALSE(e->algo[2][1]);  // not ring
    EXPECT_TRUE(e->algo[0][1]);   // all-gather: ring
    EXPECT_TRUE(e->algo[1][1]);   // reduce-scatter untouched
    EXPECT_FALSE(e->proto[0][0]);
    EXPECT_TRUE(e->proto[0][2]);
    auto bad = parseNcclEnv("ringg", "", "");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().find("did you mean \"ring\""), std::string::npos) << bad.error();
    auto order = parseNcclEnv("ring;tree", "", "");
    ASSERT_FALSE(order.ok());
    EXPECT_NE(order.error().find("function prefix"), std::string::npos);
    EXPECT_FALSE(parseNcclEnv("", "", "yes").ok());
    ClusterSpec c = load("h200-sxm-1x8.json");
    auto ringOnly = parseNcclEnv("ring", "simple", "");
    const auto r = ncclCollective(c, *c.nccl, OpKind::AllReduce, 64 * MiB, 8, 1, *ringOnly);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->algo, NcclAlgo::Ring);
    EXPECT_EQ(r->proto, NcclProto::Simple);
}

TEST(NcclModel, TheClusterSectionIsCheckedNamingTheField) {
    auto parse = [](const std::string& extra) {
        auto j = nlohmann::json::parse(R"({"format": "shardscope.cluster", "version": 1,
            "name": "x", "nodes": 2,
            "device": {"name": "g", "memory_bytes": 1000, "peak_flops": {"bfloat16": 1e15},
                       "hbm_bandwidth_bytes_per_s": 3e12},
            "node": {"devices_per_node": 8, "intra_bandwidth_bytes_per_s": 4.5e11, "intra_latency_ns": 0},
            "network": {"nic_bandwidth_bytes_per_s": 5e10, "latency_ns": 0},
            "host": {"link_bandwidth_bytes_per_s": 5e10}, "nccl": )" +
                                       extra + "}");
        return clusterFromJson(j, "c.json");
    };
    EXPECT_TRUE(parse("{}").ok());
    auto v = parse(R"({"version": "2.1"})");
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.error().find("c.json:/nccl/version"), std::string::npos) << v.error();
    auto cpu = parse(R"({"cpu_vendor": "ibm"})");
    ASSERT_FALSE(cpu.ok());
    EXPECT_NE(cpu.error().find("/nccl/cpu_vendor"), std::string::npos) << cpu.error();
    auto eff = parse(R"({"net_efficiency": 0})");
    ASSERT_FALSE(eff.ok());
    EXPECT_NE(eff.error().find("/nccl/net_efficiency"), std::string::npos) << eff.error();
    auto typo = parse(R"({"nvlink": 18})");
    ASSERT_FALSE(typo.ok());
    EXPECT_NE(typo.error().find("nvlinks"), std::string::npos) << typo.error();
}

TEST(NcclModel, AProfileExtendsItsBase) {
    ClusterSpec mega = load("h100-sxm-80gb-gcp-a3mega.json");
    ClusterSpec ib = load("h100-sxm-80gb-ib.json");
    EXPECT_EQ(mega.device.name, ib.device.name);        // from the base
    EXPECT_DOUBLE_EQ(mega.network.nicBandwidth, 25e9);  // its own
    ASSERT_TRUE(mega.nccl && ib.nccl);
    EXPECT_EQ(mega.nccl->nvlinks, ib.nccl->nvlinks);
    // A missing base and a cycle are refused naming the file.
    const std::string dir = ::testing::TempDir();
    std::ofstream(dir + "/loop-a.json") << R"({"extends": "loop-b.json"})";
    std::ofstream(dir + "/loop-b.json") << R"({"extends": "loop-a.json"})";
    auto loop = loadClusterFile(dir + "/loop-a.json");
    ASSERT_FALSE(loop.ok());
    EXPECT_NE(loop.error().find("extends"), std::string::npos) << loop.error();
    std::ofstream(dir + "/orphan.json") << R"({"extends": "no-such-base.json"})";
    auto orphan = loadClusterFile(dir + "/orphan.json");
    ASSERT_FALSE(orphan.ok());
    EXPECT_NE(orphan.error().find("no-such-base.json"), std::string::npos) << orphan.error();
}
