// SPDX-License-Identifier: Apache-2.0
// Randomised robustness test of the one trace loader (expandTraceArgs / forEachTrace /
// importKinetoFile) and of everything that reads its result (HTA summary, FSDP structure,
// ShardScope step view, Chrome export): thousands of mutated traces, plain and gzip, built
// from a seed that has every kind of event the importer treats specially. Each must load or
// be rejected with a message that names the file; nothing may crash or hang (ctest's
// timeout catches a hang; the sanitizer build of the fuzzers catches memory errors).
// Then the inputs that broke the first release, one by one.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "profiler/analysis/fsdp_trace.h"
#include "engine/measure/step_trace.h"
#include "profiler/analysis/summary.h"
#include "profiler/analysis/trace_loader.h"
#include "profiler/export/chrome_export.h"
#include "profiler/import/kineto_import.h"
#include "tests/support/exercise.h"
#include "tests/support/golden.h"

using namespace shardscope;
using Json = nlohmann::json;

namespace {

Json x(const char* cat, const std::string& name, int tid, double ts, double dur,
       Json args = nullptr) {
    Json e = {{"ph", "X"},  {"cat", cat}, {"name", name}, {"pid", 7},
              {"tid", tid}, {"ts", ts},   {"dur", dur}};
    if (!args.is_null()) e["args"] = std::move(args);
    return e;
}

// A 2-rank FSDP2 CPU step and a GPU stream, with every special event kind.
Json seed() {
    Json ev = Json::array();
    ev.push_back(
        {{"ph", "M"}, {"name", "process_name"}, {"pid", 7}, {"args", {{"name", "rank 0"}}}});
    ev.push_back({{"ph", "M"},
                  {"name", "thread_name"},
                  {"pid", 7},
                  {"tid", 1},
                  {"args", {{"name", "python"}}}});
    ev.push_back({{"ph", "M"},
                  {"name", "process_sort_index"},
                  {"pid", "Spans"},
                  {"tid", 0},
                  {"args", {{"sort_index", 1}}}});
    ev.push_back(x("user_annotation", "ProfilerStep#1", 1, 0, 1000));
    ev.push_back(x("user_annotation", "FSDP::root_pre_forward", 1, 1, 2));
    ev.push_back(x("user_annotation", "FSDP::pre_forward (model.layers.0)", 1, 5, 100));
    ev.push_back(x("user_annotation", "FSDP::all_gather (model.layers.0)", 1, 6, 90));
    ev.push_back(x("cpu_op", "fsdp::all_gather_copy_in", 1, 7, 5));
    ev.push_back(x("cpu_op", "c10d::_allgather_base_", 1, 13, 3,
                   {{"Input Dims", {{8}, {4}}}, {"Input type", {"float", "float"}}}));
    ev.push_back(x("user_annotation", "gloo:all_gather", 2, 14, 60,
                   {{"Input Dims", {{4}}}, {"Input type", {"float"}}}));
    ev.push_back(x("user_annotation", "FSDP::all_gather_copy_out (model.layers.0)", 1, 80, 5));
    ev.push_back(x("cpu_op", "aten::embedding", 1, 110, 5,
                   {{"Input Dims", {{10, 4}, {2, 8}}}, {"Input type", {"float", "long int"}}}));
    ev.push_back(x("user_annotation", "FSDP::forward_prefetch for model.layers.1", 1, 116, 3));
    ev.push_back(x("user_annotation", "FSDP::post_forward (model.layers.0)", 1, 200, 3));
    ev.push_back(x("user_annotation", "FSDP::pre_backward (model.layers.0)", 1, 300, 10));
    ev.push_back(
        x("user_annotation", "FSDP::post_backward_accumulate (model.layers.0)", 1, 400, 1));
    ev.push_back(x("user_annotation", "FSDP::post_backward_reduce (model.layers.0)", 1, 402, 50));
    ev.push_back(x("cpu_op", "fsdp::chunk_cat", 1, 403, 5));
    ev.push_back(x("cpu_op", "c10d::_reduce_scatter_base_", 1, 410, 3,
                   {{"Input Dims", {{4}, {8}}}, {"Input type", {"float", "float"}}}));
    ev.push_back(x("user_annotation", "gloo:all_reduce", 2, 412, 30,
                   {{"Input Dims", {{8}}}, {"Input type", {"float"}}}));
    ev.push_back(x("user_annotation", "Optimizer.step#AdamW.step", 1, 600, 50));
    ev.push_back(x("cuda_runtime", "cudaLaunchKernel", 1, 700, 4, {{"correlation", 9}}));
    ev.push_back(x("kernel", "ncclDevKernel_AllGather_RING_LL", 3, 705, 40,
                   {{"stream", 7},
                    {"correlation", 9},
                    {"Collective name", "_allgather_base"},
                    {"In msg nelems", 16},
                    {"Out msg nelems", 32},
                    {"dtype", "BFloat16"},
                    {"Group size", 2},
                    {"External id", 4}}));
    ev.push_back(x("kernel", "sm90_gemm", 3, 750, 20, {{"stream", 7}, {"correlation", 10}}));
    ev.push_back(x("cuda_sync", "Stream Sync", 3, 780, 2, {{"stream", 7}, {"correlation", 11}}));
    ev.push_back(x("cpu_op", "triton_launch", 1, 790, 2, {{"stream", 0}}));
    ev.push_back(
        x("cpu_op", "record_param_comms", 1, 701, 2,
          {{"External id", 4}, {"Collective name", "_allgather_base"}, {"dtype", "Float"}}));
    ev.push_back({{"ph", "s"},
                  {"id", 9},
                  {"cat", "ac2g"},
                  {"name", "ac2g"},
                  {"pid", 7},
                  {"tid", 1},
                  {"ts", 701}});
    ev.push_back({{"ph", "f"},
                  {"id", 9},
                  {"bp", "e"},
                  {"cat", "ac2g"},
                  {"name", "ac2g"},
                  {"pid", 7},
                  {"tid", 3},
                  {"ts", 705}});
    ev.push_back({{"ph", "f"},
                  {"id", "orphan"},
                  {"bp", "e"},
                  {"cat", "ac2g"},
                  {"name", "ac2g"},
                  {"pid", 7},
                  {"tid", 3},
                  {"ts", 750}});
    for (int device : {0, 1})
        ev.push_back({{"ph", "i"},
                      {"s", "t"},
                      {"name", "[memory]"},
                      {"cat", "cpu_instant_event"},
                      {"pid", 7},
                      {"tid", 1},
                      {"ts", 20 + device},
                      {"args",
                       {{"Device Type", device},
                        {"Bytes", 64},
                        {"Total Allocated", 128},
                        {"Total Reserved", 256}}}});
    // ShardScope's own op and counter.
    ev.push_back(x("all_gather", "model.layers.0 all-gather", 5, 900, 10,
                   {{"op_id", 1},
                    {"kind", "all_gather"},
                    {"unit", "model.layers.0"},
                    {"phase", "forward"},
                    {"step", 0},
                    {"bytes", 64},
                    {"group_size", 2}}));
    ev.push_back({{"ph", "C"},
                  {"name", "memory (bytes)"},
                  {"pid", 7},
                  {"ts", 905},
                  {"args", {{"allocated", 100}, {"reserved", 200}}}});
    return {
        {"schemaVersion", 1},
        {"distributedInfo",
         {{"rank", 0},
          {"world_size", 2},
          {"pg_config",
           {{{"pg_name", "0"}, {"pg_desc", "default_pg"}, {"pg_size", 2}, {"ranks", {0, 1}}}}}}},
        {"baseTimeNanoseconds", 1700000000000000000},
        {"traceEvents", ev},
        {"metadata",
         {{"producer", "shardscope run"}, {"rank_pid_offset", 1}, {"run", {{"model", "m"}}}}}};
}

Json randomValue(std::mt19937& rng) {
    switch (rng() % 12) {
        case 0:
            return nullptr;
        case 1:
            return true;
        case 2:
            return -1;
        case 3:
            return int64_t{1} << 62;
        case 4:
            return -(int64_t{1} << 62);
        case 5:
            return 1e308;
        case 6:
            return -1e300;
        case 7:
            return "";
        case 8:
            return "c10::BFloat16";
        case 9:
            return Json::array({1, "x", nullptr, Json::array({Json::array({2})})});
        case 10:
            return 0.5;
        default:
            return Json::object({{"k", 1}});
    }
}

void collect(Json& j, std::vector<Json*>& out) {
    out.push_back(&j);
    if (j.is_object())
        for (auto& [k, v] : j.items())
            collect(v, out);
    else if (j.is_array())
        for (auto& v : j)
            collect(v, out);
}

std::string mutated(std::mt19937& rng) {
    Json j = seed();
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
        std::vector<Json*> nodes;
        collect(j, nodes);
        Json* t = nodes[rng() % nodes.size()];
        if (t == &j) continue;
        *t = randomValue(rng);
    }
    std::string text = j.dump();
    switch (rng() % 6) {
        case 0:  // flip a byte
            text[rng() % text.size()] = static_cast<char>(rng() % 256);
            break;
        case 1:  // truncate
            text.resize(rng() % text.size());
            break;
        case 2: {  // deep nesting somewhere
            const size_t at = rng() % text.size();
            text.insert(at, std::string(20000 + rng() % 20000, '['));
            break;
        }
        case 3: {  // a huge number or a long name
            const size_t at = text.find("\"sm90_gemm\"");
            if (at != std::string::npos)
                text.replace(at, 11, rng() % 2 ? "1e400" : "\"" + std::string(30000, 'a') + ".*\"");
            break;
        }
        default:
            break;
    }
    return text;
}

std::string write(const std::string& name, const std::string& text, bool gz) {
    const std::string path =
        (shardscope::test::testTempDir() / (name + (gz ? ".json.gz" : ".json"))).string();
    if (gz) {
        gzFile f = gzopen(path.c_str(), "wb");
        gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
        gzclose(f);
    } else {
        std::ofstream(path, std::ios::binary) << text;
    }
    return path;
}

// Everything downstream of the loader, on whatever it accepted.
void useAll(const Trace& t) {
    static const ClusterSpec cluster = [] {
        auto c = loadClusterFile(std::string(SHARDSCOPE_SOURCE_DIR) +
                                 "/samples/clusters/h100-sxm-8x8.json");
        return c.ok() ? *c : ClusterSpec{};
    }();
    fuzzing::exerciseTrace(t, &cluster);
}

}  // namespace

TEST(TraceLoaderFuzz, MutatedTracesLoadOrFailWithTheirPath) {
    // The seed itself loads, with every kind of event it was built for.
    const std::string seedPath = write("shardscope_fuzz_seed", seed().dump(), false);
    int loaded = 0;
    ASSERT_TRUE(forEachTrace({seedPath}, {}, [&](const std::string&, Trace&& t) -> Status {
                    EXPECT_GE(t.collectives.size(), 3u);  // gloo x2, nccl, ours
                    EXPECT_EQ(t.hostMemory.size(), 1u);
                    EXPECT_EQ(t.memory.size(), 2u);  // the [memory] event and our counter
                    EXPECT_EQ(t.flowEvents.size(), 1u);
                    EXPECT_EQ(t.orphanFlowEnds, 1);
                    EXPECT_EQ(t.worldSize, 2);
                    useAll(t);
                    ++loaded;
                    return {};
                }).ok());
    ASSERT_EQ(loaded, 1);

    std::mt19937 rng(20261124);
    int accepted = 0, rejected = 0;
    for (int i = 0; i < 3000; ++i) {
        const bool gz = rng() % 4 == 0;
        std::string text = mutated(rng);
        const std::string path = write("shardscope_fuzz_" + std::to_string(i % 7), text, gz);
        if (gz && rng() % 3 == 0) {  // damage the compressed bytes or cut the trailer
            std::string bytes;
            {
                std::ifstream in(path, std::ios::binary);
                bytes.assign(std::istreambuf_iterator<char>(in), {});
            }
            if (bytes.size() > 20) {
                if (rng() % 2)
                    bytes.resize(bytes.size() - 1 - rng() % 8);
                else
                    bytes[10 + rng() % (bytes.size() - 10)] ^= 0x5a;
                std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
            }
        }
        const Status st = forEachTrace({path}, {}, [&](const std::string&, Trace&& t) -> Status {
            useAll(t);
            return {};
        });
        if (st.ok()) {
            ++accepted;
        } else {
            ++rejected;
            EXPECT_NE(st.error().find(path), std::string::npos) << st.error();
        }
    }
    std::printf("fuzzed traces: %d loaded, %d refused with their path\n", accepted, rejected);
    // Both outcomes happen: the mutations neither all break the file nor leave it unchanged.
    EXPECT_GT(accepted, 100);
    EXPECT_GT(rejected, 100);
}

TEST(TraceLoaderFuzz, InputsThatBrokeTheFirstRelease) {
    auto load = [](const std::string& name, const std::string& text, bool gz = false) {
        const std::string path = write(name, text, gz);
        return importKinetoFile(path);
    };
    // A million nested arrays in metadata.run and in an event's args: an error, no crash.
    const std::string deep(1000000, '[');
    auto d1 =
        load("shardscope_deep_meta", "{\"metadata\":{\"run\":" + deep + "}, \"traceEvents\":[]}");
    EXPECT_FALSE(d1.ok());
    auto d2 = load("shardscope_deep_args",
                   "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k\",\"ts\":1,"
                   "\"dur\":1,\"args\":" +
                       deep + "}]}");
    EXPECT_FALSE(d2.ok());
    // A 30,000-character kernel name classifies (std::regex recursed per character).
    EXPECT_EQ(classifyDeviceEvent(std::string(30000, 'a'), "kernel"), EventClass::Computation);
    EXPECT_EQ(classifyDeviceEvent("nccl" + std::string(30000, 'a'), "kernel"),
              EventClass::Communication);
    // A number beyond double, ts of 1e300, a float pid, ph that is not a string: the event is
    // dropped and counted, the rest loads.
    auto n = load(
        "shardscope_numbers",
        "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k\",\"ts\":1e400,\"dur\":1},"
        "{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k\",\"ts\":1e300,\"dur\":1},"
        "{\"ph\":1,\"name\":\"k\"},"
        "{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k\",\"pid\":1.5,\"tid\":\"stream "
        "7\",\"ts\":2,\"dur\":1}]}");
    ASSERT_TRUE(n.ok()) << n.error();
    EXPECT_EQ(n->size(), 1u);
    EXPECT_EQ(n->skippedBadFields, 1);   // ph 1
    EXPECT_EQ(n->skippedOutOfRange, 2);  // ts 1e400 and 1e300: named as out of range
    // Only out-of-range times: refused, saying which field.
    auto o = load("shardscope_out_of_range",
                  "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"kernel\",\"name\":\"k\","
                  "\"ts\":9e18,\"dur\":1}]}");
    ASSERT_FALSE(o.ok());
    EXPECT_NE(o.error().find("no usable event: 1 had \"ts\" or \"dur\" out of range"),
              std::string::npos)
        << o.error();
    // Found by fuzz_kineto_gz in CI: a Gloo op whose shape's element count overflows int64
    // (signed overflow, undefined behaviour). Now such a shape counts 0 elements, 0 bytes.
    auto g = load("shardscope_gloo_overflow",
                  "{\"traceEvents\":[{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":"
                  "\"gloo:all_reduce\",\"pid\":1,\"tid\":1,\"ts\":1,\"dur\":1,\"args\":{"
                  "\"Input Dims\":[[227991539359584000,60,60]],\"Input type\":[\"float\"]}},"
                  "{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":\"gloo:all_reduce\","
                  "\"pid\":1,\"tid\":1,\"ts\":3,\"dur\":1,\"args\":{\"Input Dims\":"
                  "[[[4611686018427387904,4],[4611686018427387904,4]]],\"Input type\":"
                  "[\"TensorList\"]}}]}");
    ASSERT_TRUE(g.ok()) << g.error();
    ASSERT_FALSE(g->collectives.empty());
    for (const auto& c : g->collectives) {
        EXPECT_EQ(c.elements, 0);
        EXPECT_EQ(c.bytes, 0);
    }
    EXPECT_EQ(shapeElements({1 << 20, 1 << 20, 1 << 20, 1 << 20}), 0);  // 2^80
    EXPECT_EQ(shapeElements({3, -1}), 0);
    EXPECT_EQ(shapeElements({}), 1);
    EXPECT_EQ(shapeElements({2, 3, 4}), 24);
    // Silent nonsense is refused.
    EXPECT_FALSE(load("shardscope_events_object", "{\"traceEvents\":{}}").ok());
    EXPECT_FALSE(load("shardscope_array_of_numbers", "[1,2,3]").ok());
    EXPECT_FALSE(load("shardscope_no_events", "{\"a\":1}").ok());
    // An empty object is a file without traceEvents (a folder skips it as not a trace), not
    // "more data after the trace's JSON" at byte 1.
    const auto empty = load("shardscope_empty_object", "{}\n");
    ASSERT_FALSE(empty.ok());
    EXPECT_NE(empty.error().find("no traceEvents array"), std::string::npos) << empty.error();
    EXPECT_FALSE(
        load("shardscope_two_documents", "{\"traceEvents\":[]} {\"traceEvents\":[]}").ok());
    // A gzip without its trailer is a truncated file, not a trace.
    {
        const std::string path = write("shardscope_no_trailer", seed().dump(), true);
        std::string bytes;
        {
            std::ifstream in(path, std::ios::binary);
            bytes.assign(std::istreambuf_iterator<char>(in), {});
        }
        bytes.resize(bytes.size() - 8);
        std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
        auto t = importKinetoFile(path);
        ASSERT_FALSE(t.ok());
        EXPECT_NE(t.error().find("gzip"), std::string::npos) << t.error();
    }
    // A folder is named as one, and one with no traces is an error naming it.
    const auto dir = shardscope::test::testTempDir() / "shardscope_empty_folder";
    std::filesystem::create_directories(dir);
    EXPECT_FALSE(importKinetoFile(dir.string()).ok());
    auto e = expandTraceArgs({dir.string()});
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.error().find("shardscope_empty_folder"), std::string::npos);
}
