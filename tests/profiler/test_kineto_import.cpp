// SPDX-License-Identifier: Apache-2.0
// Golden tests on every real trace in ../shared/data/traces/: event counts by category,
// NCCL collectives with their sizes, memory peaks, overlap and breakdown figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "profiler/analysis/summary.h"
#include "profiler/import/kineto_import.h"
#include "tests/support/golden.h"
#include "tests/support/sample_traces.h"

using namespace shardscope;
using shardscope::test::matchesGolden;

namespace {

std::string sharedTraces() {
    return std::string(SHARDSCOPE_SOURCE_DIR) + "/../shared/data/traces";
}

std::vector<std::string> traceFiles() {
    std::vector<std::string> out;
    std::error_code ec;
    if (!std::filesystem::exists(sharedTraces(), ec)) return out;
    for (const auto& e : std::filesystem::recursive_directory_iterator(sharedTraces(), ec))
        if (e.path().string().size() > 8 &&
            e.path().string().rfind(".json.gz") == e.path().string().size() - 8)
            out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

TEST(KinetoImport, GoldenSummariesOfEverySharedTrace) {
    const auto files = traceFiles();
    if (files.empty()) GTEST_SKIP() << "needs ../shared/data/traces beside the checkout";
    EXPECT_EQ(files.size(), 6u);
    for (const auto& f : files) {
        auto t = importKinetoFile(f);
        ASSERT_TRUE(t.ok()) << t.error();
        const std::string name = std::filesystem::path(f).filename().string();
        EXPECT_TRUE(matchesGolden("traces/" + name + ".summary.json",
                                  summaryToJson(summarize(*t)).dump(1) + "\n"));
    }
}

TEST(KinetoImport, DialectsAndHtaFigures) {
    if (traceFiles().empty()) GTEST_SKIP() << "needs ../shared/data/traces beside the checkout";
    auto nccl = importKinetoFile(
        sharedTraces() + "/HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz");
    ASSERT_TRUE(nccl.ok());
    const TraceSummary s = summarize(*nccl);
    EXPECT_EQ(s.dialect, "modern (relative ts, baseTimeNanoseconds)");
    // Breakdown identities as HTA defines them.
    EXPECT_EQ(s.computeNs + s.nonComputeNs + s.idleNs, s.kernelTimeNs);
    EXPECT_GT(s.collectives.at("allreduce").bytes, 0);
    auto legacy = importKinetoFile(
        sharedTraces() +
        "/kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz");
    ASSERT_TRUE(legacy.ok());
    EXPECT_EQ(legacy->dialect, "legacy 2021 categories");
    bool stream7 = false;
    for (const auto& l : legacy->lanes)
        stream7 = stream7 || l.tid == "\"stream 7\"" || l.tid == "stream 7";
    EXPECT_TRUE(stream7);
    auto b200 =
        importKinetoFile(sharedTraces() + "/TraceLens/tests/traces/b200/eager_trace.json.gz");
    ASSERT_TRUE(b200.ok());
    EXPECT_GT(b200->skippedPythonFunctions, 10000);
    EXPECT_EQ(summarize(*b200).collectives.count("_allgather_base"), 1u);
}

TEST(KinetoImport, BadInputIsAClearError) {
    const std::string dir = shardscope::test::testTempDir() / "shardscope_trace_test";
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/bad.json") << R"({"traceEvents": [{"ph": "X", "ts": 1,)";
    auto r = importKinetoFile(dir + "/bad.json");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().rfind(dir + "/bad.json: not a valid Chrome/Kineto trace JSON", 0), 0u)
        << r.error();
    EXPECT_EQ(importKinetoFile(dir + "/missing.json").error(),
              dir + "/missing.json: cannot open file");
}

// `shardscope run --trace` writes one file for all ranks: each rank a process, each stream
// a thread, the step program's op kind in args, the allocator's total as a counter.
TEST(KinetoImport, ShardScopeMultiRankTrace) {
    const std::string dir = shardscope::test::testTempDir() / "shardscope_trace_test";
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/run.json") << R"JSON({"traceEvents": [
      {"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "rank 0 (measured)"}},
      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "rank 1 (measured)"}},
      {"ph": "M", "pid": 0, "tid": 0, "name": "thread_name", "args": {"name": "compute"}},
      {"ph": "M", "pid": 0, "tid": 2, "name": "thread_name", "args": {"name": "all_gather"}},
      {"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {"name": "compute"}},
      {"ph": "X", "pid": 0, "tid": 2, "ts": 0, "dur": 10, "name": "model.layers.0 all gather",
       "args": {"op_id": 1, "kind": "all_gather", "bytes": 4096, "group_size": 2}},
      {"ph": "X", "pid": 0, "tid": 0, "ts": 5, "dur": 20, "name": "model.layers.0 forward",
       "args": {"op_id": 3, "kind": "forward"}},
      {"ph": "X", "pid": 1, "tid": 0, "ts": 6, "dur": 20, "name": "model.layers.0 forward",
       "args": {"op_id": 3, "kind": "forward"}},
      {"ph": "C", "pid": 0, "ts": 0, "name": "memory (bytes)", "args": {"allocated": 100}},
      {"ph": "C", "pid": 0, "ts": 7, "name": "memory (bytes)", "args": {"allocated": 300}},
      {"ph": "C", "pid": 1, "ts": 7, "name": "memory (bytes)", "args": {"allocated": 999}}
    ]})JSON";
    auto t = importKinetoFile(dir + "/run.json");
    ASSERT_TRUE(t.ok()) << t.error();
    ASSERT_EQ(t->lanes.size(), 3u);
    EXPECT_EQ(t->lanes[0].name, "rank 0 \u00b7 all_gather");
    EXPECT_EQ(t->lanes[1].name, "rank 0 \u00b7 compute");
    EXPECT_EQ(t->lanes[2].name, "rank 1 \u00b7 compute");
    EXPECT_EQ(t->lanes[2].rank, 1);
    EXPECT_EQ(t->lanes[0].kind, LaneKind::DeviceStream);
    EXPECT_EQ(t->cls[0], EventClass::Communication);
    EXPECT_EQ(t->cls[1], EventClass::Computation);
    ASSERT_EQ(t->collectives.size(), 1u);
    EXPECT_EQ(t->collectives[0].name, "all_gather");
    EXPECT_EQ(t->collectives[0].bytes, 4096);
    ASSERT_EQ(t->memory.size(), 2u);  // rank 0's counter only
    EXPECT_EQ(t->memory[1].allocated, 300);
    const TraceSummary s = summarize(*t);
    EXPECT_GT(s.commNs, 0);
}

TEST(KinetoImport, ReportsProgressAndStopsWhenCancelled) {
    const std::string path =
        shardscope::test::writeKernelTrace("shardscope_progress.json", 60000);  // ~8 MiB
    std::vector<double> seen;
    KinetoImportOptions o;
    o.progress = [&](double f) { seen.push_back(f); };
    auto t = importKinetoFile(path, o);
    ASSERT_TRUE(t) << t.error();
    EXPECT_EQ(t->size(), 60000u);
    ASSERT_GE(seen.size(), 20u);  // every 256 KiB
    EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
    EXPECT_GT(seen.back(), 0.8);
    EXPECT_LE(seen.back(), 1.0);
    // Cancelled after the third chunk: an error naming the file, not a partial trace.
    std::atomic<bool> cancel{false};
    int calls = 0;
    o.cancel = &cancel;
    o.progress = [&](double) {
        if (++calls == 3) cancel = true;
    };
    auto c = importKinetoFile(path, o);
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error(), path + ": cancelled");
    EXPECT_LE(calls, 4);
    std::filesystem::remove(path);
}

TEST(KinetoImport, LaunchToKernelFlowsBindToTheirEvents) {
    const std::string path = shardscope::test::writeLaunchFlowTrace("shardscope_flows.json");
    auto t = importKinetoFile(path);
    ASSERT_TRUE(t) << t.error();
    EXPECT_EQ(t->orphanFlowEnds, 1);
    ASSERT_EQ(t->flowEvents.size(), 2u);
    auto name = [&](int32_t e) { return t->strings.at(t->name[static_cast<size_t>(e)]); };
    EXPECT_EQ(name(t->flowEvents[0].first), "cudaLaunchKernel");
    EXPECT_EQ(name(t->flowEvents[0].second), "gemm");
    EXPECT_EQ(name(t->flowEvents[1].second), "relu");
    EXPECT_EQ(t->start[static_cast<size_t>(t->flowEvents[1].first)], 200'000);  // ns from start
    std::filesystem::remove(path);
}

TEST(KinetoImport, FlowsOfARealTraceGoFromHostToDevice) {
    const std::string f = std::string(SHARDSCOPE_SOURCE_DIR) +
                          "/../shared/data/traces/TraceLens/tests/traces/b200/eager_trace.json.gz";
    if (!std::filesystem::exists(f))
        GTEST_SKIP() << "needs ../shared/data/traces beside the checkout";
    auto t = importKinetoFile(f);
    ASSERT_TRUE(t) << t.error();
    ASSERT_GT(t->flowEvents.size(), 100u);
    for (const auto& [from, to] : t->flowEvents) {
        EXPECT_EQ(t->lanes[static_cast<size_t>(t->lane[static_cast<size_t>(from)])].kind,
                  LaneKind::HostThread);
        EXPECT_EQ(t->lanes[static_cast<size_t>(t->lane[static_cast<size_t>(to)])].kind,
                  LaneKind::DeviceStream);
        EXPECT_LE(t->start[static_cast<size_t>(from)], t->start[static_cast<size_t>(to)]);
    }
    std::printf("%zu launch-to-kernel flows of %lld flow starts\n", t->flowEvents.size(),
                static_cast<long long>(t->flows));
}

TEST(TraceSummary, BandwidthByCollectiveAndSizeAsNcclTestsDefinesIt) {
    Trace t;
    for (int i = 0; i < 3; ++i) {
        t.start.push_back(i * 2'000'000);
        t.dur.push_back(1'000'000);  // 1 ms
        t.lane.push_back(0);
        t.name.push_back(0);
        t.category.push_back(0);
        t.cls.push_back(EventClass::Communication);
    }
    t.lanes.push_back({});
    t.strings.intern("nccl");
    // Two 8 MiB all-gathers over 8 ranks, one 512 MiB all-reduce of unknown group size.
    t.collectives = {{0, "_allgather_base", 1 << 20, 8 << 20, 8, 0, ""},
                     {1, "_allgather_base", 1 << 20, 8 << 20, 8, 0, ""},
                     {2, "allreduce", 512 << 20, 512 << 20, 0, 0, ""}};
    const TraceSummary s = summarize(t);
    ASSERT_EQ(s.bandwidth.size(), 2u);
    const auto& ag = s.bandwidth[0];
    EXPECT_EQ(ag.collective, "_allgather_base");
    EXPECT_EQ(ag.count, 2);
    EXPECT_EQ(ag.minBytes, 1 << 20);
    EXPECT_EQ(ag.maxBytes, 16 << 20);
    EXPECT_NEAR(ag.algGBps, (8 << 20) / 1e6, 1e-9);  // bytes per ns = GB/s
    EXPECT_NEAR(ag.busGBps, ag.algGBps * 7 / 8, 1e-9);
    const auto& ar = s.bandwidth[1];
    EXPECT_EQ(ar.minBytes, 256 << 20);
    EXPECT_EQ(ar.maxBytes, 0);  // the open bucket
    EXPECT_LT(ar.busGBps, 0);   // group size unknown
}

// The importer cuts events out 64 bytes at a time and parses the whole ones of each 256 KiB
// chunk as one batch. Names full of quotes, backslash runs, brackets and escapes, at every
// alignment and across chunk boundaries, must read as nlohmann's own encoder wrote them, and
// timestamps as their digits say.
TEST(KinetoImport, EscapesBracketsAndChunkEdgesReadAsWritten) {
    const std::string dir = shardscope::test::testTempDir() / "shardscope_trace_test";
    std::filesystem::create_directories(dir);
    const std::vector<std::string> pieces = {"\"", "\\",       "\\\\", "{",    "}", "[",   "]",
                                             "\n", "\xc3\xa9", "],{",  "\\\"", ",", "\"}]"};
    std::vector<std::pair<std::string, int64_t>> expected;  // name, ts in ns
    std::string text = "{\"traceEvents\": [\n";
    const int n = 12000;  // about 2 MB: eight chunks
    for (int i = 0; i < n; ++i) {
        std::string name = "op" + std::to_string(i);
        for (int k = 0; k < i % 9; ++k)
            name += pieces[static_cast<size_t>((i * 7 + k * 3)) % pieces.size()] +
                    std::string(static_cast<size_t>((i + k) % 5), 'x');
        const int64_t ns = 1000 + static_cast<int64_t>(i) * 1237;
        // Microseconds as Kineto writes them (three decimals), with fewer decimals, or in
        // forms the digit reader leaves to simdjson (an exponent, a fourth decimal).
        const std::string whole = std::to_string(ns / 1000);
        const std::string frac = std::to_string(1000 + ns % 1000).substr(1);
        std::string ts;
        switch (i % 4) {
            case 0:
                ts = whole + "." + frac;
                break;
            case 1:
                ts = whole + "." + frac + "0";
                break;
            case 2:
                ts = std::to_string(ns) + "e-3";
                break;
            default:
                ts = ns % 1000 == 0 ? whole : whole + "." + frac;
                break;
        }
        const std::string quoted = nlohmann::json(name).dump();
        text += std::string(static_cast<size_t>(i % 3), ' ') +
                "{\"ph\": \"X\", \"cat\": \"cpu_op\", \"name\": " + quoted +
                ", \"pid\": 1, \"tid\": " + std::to_string(i % 7) + ", \"ts\": " + ts +
                ", \"dur\": 1" +
                (i % 5 == 0 ? ", \"args\": {\"x\": [[{\"a\": " + quoted + "}]]}" : "") + "}" +
                (i + 1 < n ? ",\n" : "\n");
        expected.emplace_back(name, ns);
    }
    text += "]}\n";
    const std::string path = dir + "/escapes.json";
    std::ofstream(path, std::ios::binary) << text;
    auto r = importKinetoFile(path);
    ASSERT_TRUE(r.ok()) << r.error();
    const Trace& t = *r;
    ASSERT_EQ(t.size(), static_cast<size_t>(n));
    for (size_t i = 0; i < expected.size(); ++i) {
        ASSERT_EQ(t.strings.at(t.name[i]), expected[i].first) << "event " << i;
        ASSERT_EQ(t.start[i] + t.timeOriginNs, expected[i].second) << "event " << i;
    }

    // A bad event among whole ones: the error gives that event's own byte offset.
    const size_t bad = text.find("\"name\": \"op6001");
    ASSERT_NE(bad, std::string::npos);
    const size_t eventStart = text.rfind('{', bad);
    std::string broken = text;
    broken.replace(bad, 8, "\"name\"  ");  // the colon gone, the length kept
    std::ofstream(dir + "/escapes_bad.json", std::ios::binary) << broken;
    auto b = importKinetoFile(dir + "/escapes_bad.json");
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.error().find("byte " + std::to_string(eventStart) + ": "), std::string::npos)
        << b.error();
}

TEST(KinetoImport, NegativeTimesAreSkippedAndCounted) {
    // A kernel with a negative dur and an op with a negative ts have no interval on the
    // timeline: each is skipped and counted (never summed into a breakdown), the good kernel
    // loads, and `trace summary` says so in a warning line (docs/input-policy.md).
    const std::string path = shardscope::test::sourcePath("data/hostile-traces/negative-dur.json");
    auto t = importKinetoFile(path);
    ASSERT_TRUE(t.ok()) << t.error();
    EXPECT_EQ(t->size(), 1u);
    EXPECT_EQ(t->skippedNegativeTime, 2);
    const auto r = shardscope::test::runCommand(
        std::string(SHARDSCOPE_BINARY) + " trace summary " + path, true);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("warning: skipped 2 events with a negative \"ts\" or \"dur\""),
              std::string::npos)
        << r.out;
    // Only such events: refused, saying why.
    const auto only = shardscope::test::testTempDir() / "negative-only.json";
    std::ofstream(only) << "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k\","
                           "\"ts\":1,\"dur\":-1}]}";
    auto o = importKinetoFile(only.string());
    ASSERT_FALSE(o.ok());
    EXPECT_NE(o.error().find("no usable event: 1 had a negative \"ts\" or \"dur\""),
              std::string::npos)
        << o.error();
}
