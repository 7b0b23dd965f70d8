// SPDX-License-Identifier: Apache-2.0
// trace export is lossless for what the trace model holds: importing the export gives the
// same events, lanes, collectives, memory and flows, for ShardScope's own traces and for
// the PyTorch profiler traces in ../shared/data/traces.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "profiler/export/chrome_export.h"
#include "profiler/export/chrome_trace_writer.h"
#include "profiler/import/kineto_import.h"
#include "tests/support/golden.h"

using namespace shardscope;

namespace {

Trace roundTrip(const Trace& t, const std::string& name) {
    const std::string path = shardscope::test::testTempDir() / name;
    std::ofstream(path) << exportChromeTrace(t).dump();
    auto back = importKinetoFile(path);
    EXPECT_TRUE(back) << back.error();
    std::filesystem::remove(path);
    return back ? std::move(*back) : Trace{};
}

void expectSame(const Trace& a, const Trace& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    EXPECT_EQ(a.start, b.start) << what;
    EXPECT_EQ(a.dur, b.dur) << what;
    EXPECT_EQ(a.lane, b.lane) << what;
    EXPECT_EQ(a.cls, b.cls) << what;
    EXPECT_EQ(a.opId, b.opId) << what;
    for (size_t i = 0; i < a.size(); ++i) {
        ASSERT_EQ(a.strings.at(a.name[i]), b.strings.at(b.name[i])) << what << " event " << i;
        ASSERT_EQ(a.strings.at(a.category[i]), b.strings.at(b.category[i])) << what << " " << i;
        ASSERT_EQ(a.unit[i] < 0, b.unit[i] < 0) << what << " " << i;
        if (a.unit[i] >= 0) {
            ASSERT_EQ(a.strings.at(a.unit[i]), b.strings.at(b.unit[i])) << what;
        }
        ASSERT_EQ(a.phase[i] < 0, b.phase[i] < 0) << what << " " << i;
    }
    ASSERT_EQ(a.lanes.size(), b.lanes.size()) << what;
    for (size_t l = 0; l < a.lanes.size(); ++l) {
        EXPECT_EQ(a.lanes[l].name, b.lanes[l].name) << what;
        EXPECT_EQ(a.lanes[l].kind, b.lanes[l].kind) << what;
        EXPECT_EQ(a.lanes[l].rank, b.lanes[l].rank) << what;
    }
    ASSERT_EQ(a.collectives.size(), b.collectives.size()) << what;
    for (size_t c = 0; c < a.collectives.size(); ++c) {
        EXPECT_EQ(a.collectives[c].event, b.collectives[c].event) << what;
        EXPECT_EQ(a.collectives[c].name, b.collectives[c].name) << what;
        EXPECT_EQ(a.collectives[c].bytes, b.collectives[c].bytes) << what;
        EXPECT_EQ(a.collectives[c].fullBytes, b.collectives[c].fullBytes) << what;
        EXPECT_EQ(a.collectives[c].groupSize, b.collectives[c].groupSize) << what;
        EXPECT_EQ(a.collectives[c].elements, b.collectives[c].elements) << what;
    }
    ASSERT_EQ(a.memory.size(), b.memory.size()) << what;
    for (size_t m = 0; m < a.memory.size(); ++m) {
        EXPECT_EQ(a.memory[m].ts, b.memory[m].ts) << what;
        EXPECT_EQ(a.memory[m].allocated, b.memory[m].allocated) << what;
        EXPECT_EQ(a.memory[m].reserved, b.memory[m].reserved) << what;
    }
    ASSERT_EQ(a.hostMemory.size(), b.hostMemory.size()) << what;
    for (size_t m = 0; m < a.hostMemory.size(); ++m)
        EXPECT_EQ(a.hostMemory[m].allocated, b.hostMemory[m].allocated) << what;
    ASSERT_EQ(a.opInputs.size(), b.opInputs.size()) << what;
    for (const auto& [e, in] : a.opInputs) {
        ASSERT_TRUE(b.opInputs.count(e)) << what << " event " << e;
        EXPECT_EQ(in.dims, b.opInputs.at(e).dims) << what << " event " << e;
        EXPECT_EQ(in.types, b.opInputs.at(e).types) << what << " event " << e;
    }
    EXPECT_EQ(a.flowEvents, b.flowEvents) << what;
    EXPECT_EQ(a.rank, b.rank) << what;
    EXPECT_EQ(a.worldSize, b.worldSize) << what;
    EXPECT_EQ(a.processGroups.size(), b.processGroups.size()) << what;
}

}  // namespace

TEST(ChromeExport, ShardScopeTracesRoundTrip) {
    // A multi-rank ShardScope trace with op ids, units, phases, collectives and memory.
    const std::string path = shardscope::test::testTempDir() / "shardscope_export_in.json";
    std::ofstream(path)
        << R"JSON({"displayTimeUnit": "ns", "metadata": {"producer": "shardscope run", "rank_pid_offset": 1},
      "traceEvents": [
      {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "rank 0 (measured)"}},
      {"ph": "M", "pid": 1, "tid": 1000, "name": "thread_name", "args": {"name": "compute"}},
      {"ph": "M", "pid": 1, "tid": 1002, "name": "thread_name", "args": {"name": "all_gather"}},
      {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "rank 1 (measured)"}},
      {"ph": "M", "pid": 2, "tid": 2000, "name": "thread_name", "args": {"name": "compute"}},
      {"ph": "X", "pid": 1, "tid": 1002, "name": "layers.0 all gather", "cat": "all_gather", "ts": 10.5, "dur": 3.25,
       "args": {"op_id": 1, "unit": "layers.0", "phase": "forward", "kind": "all_gather", "bytes": 4096, "group_size": 2}},
      {"ph": "X", "pid": 1, "tid": 1000, "name": "layers.0 forward", "cat": "forward", "ts": 14.0, "dur": 20.0,
       "args": {"op_id": 3, "unit": "layers.0", "phase": "forward", "kind": "forward"}},
      {"ph": "X", "pid": 2, "tid": 2000, "name": "layers.0 forward", "cat": "forward", "ts": 14.125, "dur": 19.0,
       "args": {"op_id": 3, "unit": "layers.0", "phase": "forward", "kind": "forward"}},
      {"ph": "C", "pid": 1, "tid": 1101, "name": "memory (bytes)", "ts": 12.0, "args": {"allocated": 1048576}},
      {"ph": "C", "pid": 2, "tid": 2101, "name": "memory (bytes)", "ts": 12.0, "args": {"allocated": 5}}
    ]})JSON";
    auto t = importKinetoFile(path);
    ASSERT_TRUE(t) << t.error();
    ASSERT_EQ(t->size(), 3u);
    ASSERT_EQ(t->collectives.size(), 1u);
    expectSame(*t, roundTrip(*t, "shardscope_export_out.json"), "ShardScope trace");
    std::filesystem::remove(path);
}

TEST(ChromeExport, EverySharedTraceRoundTrips) {
    const std::string dir = std::string(SHARDSCOPE_SOURCE_DIR) + "/../shared/data/traces";
    if (!std::filesystem::exists(dir))
        GTEST_SKIP() << "needs ../shared/data/traces beside the checkout";
    int files = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
        const std::string p = e.path().string();
        if (!e.is_regular_file() || !(p.ends_with(".json") || p.ends_with(".json.gz")) ||
            p.find("trace") == std::string::npos)
            continue;
        auto t = importKinetoFile(p);
        if (!t || t->size() == 0) continue;  // not a trace (configs and the like)
        expectSame(*t, roundTrip(*t, "shardscope_export_shared.json"), p);
        ++files;
    }
    EXPECT_GT(files, 3);
    std::printf("%d shared traces exported and read back identical\n", files);
}

TEST(ChromeTraceWriter, WritesTheRecordsTheImporterReads) {
    ChromeTraceWriter w;
    w.processName(1, "rank 0");
    w.lane(1, 1001, "compute", 0);
    w.span(1, 1001, "layers.0 forward", "forward", 2000, 1500,
           {{"op_id", 0}, {"unit", "layers.0"}});
    w.span(1, 1001, "step 0", "step", 0, 9000);
    w.counter(1, 1101, "memory (bytes)", 2500, {{"allocated", 64}});
    w.flowStart(1, 1001, "launch", "ac2g", 7, 2000);
    w.flowEnd(1, 1001, "launch", "ac2g", 7, 2100, true);
    const nlohmann::json t = w.finish({{"producer", "test"}}, {{"distributedInfo", {{"rank", 0}}}});
    const auto& ev = t["traceEvents"];
    ASSERT_EQ(ev.size(), 8u);
    EXPECT_EQ(ev[1]["name"], "thread_name");
    EXPECT_EQ(ev[2]["args"]["sort_index"], 0);
    EXPECT_DOUBLE_EQ(ev[3]["ts"].get<double>(), 2.0);  // microseconds
    EXPECT_DOUBLE_EQ(ev[3]["dur"].get<double>(), 1.5);
    EXPECT_FALSE(ev[4].contains("args"));  // none given
    EXPECT_EQ(ev[5]["ph"], "C");
    EXPECT_EQ(ev[7]["bp"], "e");
    EXPECT_EQ(t["displayTimeUnit"], "ns");
    EXPECT_EQ(t["metadata"]["producer"], "test");
    EXPECT_EQ(t["distributedInfo"]["rank"], 0);
    EXPECT_TRUE(w.finish({})["traceEvents"].empty());  // the writer starts over

    // What the importer makes of it: one span with ShardScope's op id on the named lane.
    const auto path = shardscope::test::testTempDir() / "shardscope_writer_test.json";
    std::ofstream(path) << t.dump();
    auto back = importKinetoFile(path.string());
    std::filesystem::remove(path);
    ASSERT_TRUE(back) << back.error();
    ASSERT_EQ(back->size(), 2u);
    EXPECT_EQ(back->strings.at(back->name[0]), "layers.0 forward");
    EXPECT_EQ(back->start[0], 2000);
}
