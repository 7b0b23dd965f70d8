// SPDX-License-Identifier: Apache-2.0
// The shardscope command line, run as a user runs it: golden outputs on the samples,
// --help for every subcommand, and clear errors with the documented exit codes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "tests/support/golden.h"

using shardscope::test::matchesGolden;
using shardscope::test::runCommand;

namespace {

std::string ss(const std::string& args) {
    return std::string("cd '") + SHARDSCOPE_SOURCE_DIR + "' && '" + SHARDSCOPE_BINARY + "' " + args;
}

}  // namespace

TEST(Cli, OverviewAndHelpForEverySubcommand) {
    auto r = runCommand(ss("--help"));
    EXPECT_EQ(r.status, 0);
    for (const char* c : {"model show", "plan show", "plan validate", "plan export", "doctor"}) {
        EXPECT_NE(r.out.find(c), std::string::npos) << c;
        auto h = runCommand(ss(std::string(c) + " --help"));
        EXPECT_EQ(h.status, 0) << c;
        EXPECT_EQ(h.out.rfind(std::string("Usage: shardscope ") + c, 0), 0u) << h.out;
        EXPECT_NE(h.out.find("Options:"), std::string::npos);
    }
    EXPECT_EQ(runCommand(ss("")).status, 2);
}

TEST(Cli, ModelShowGolden) {
    auto r = runCommand(ss("model show -m samples/models/llama3-8b/config.json --depth 3"));
    ASSERT_EQ(r.status, 0);
    EXPECT_TRUE(matchesGolden("cli/model_show_llama3_8b.txt", r.out));
    r = runCommand(
        ss("model show -m samples/models/mixtral-8x7b/config.json --depth 4 --batch 2 --seq 4096"));
    ASSERT_EQ(r.status, 0);
    EXPECT_TRUE(matchesGolden("cli/model_show_mixtral.txt", r.out));
}

TEST(Cli, ModelShowJsonHasTotalParams) {
    auto r = runCommand(ss("model show -m samples/models/gpt2/config.json --json --depth 1"));
    ASSERT_EQ(r.status, 0);
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["total_params"], 124439808);
    EXPECT_EQ(j["tied_params"][0]["owners"],
              nlohmann::json({"transformer.wte.weight", "lm_head.weight"}));
    EXPECT_EQ(j["modules"].size(), 3u);  // root, transformer, lm_head
}

TEST(Cli, PlanShowGoldens) {
    const std::string m8 =
        "-m samples/models/llama3-8b/config.json -c samples/clusters/h100-sxm-8x8.json";
    for (const auto& [plan, golden] : std::vector<std::pair<std::string, std::string>>{
             {"llama-per-block", "plan_show_per_block.txt"},
             {"llama-hsdp-prefetch", "plan_show_hsdp.txt"},
             {"llama-fsdp1", "plan_show_fsdp1.txt"}}) {
        auto r = runCommand(ss("plan show " + m8 + " -p samples/plans/" + plan + ".json"));
        ASSERT_EQ(r.status, 0) << plan;
        EXPECT_TRUE(matchesGolden("cli/" + golden, r.out));
    }
    auto r = runCommand(
        ss("plan show -m samples/models/gpt2/config.json -p samples/plans/gpt2-lightning.json "
           "-c samples/clusters/a100-80gb-8x8.json"));
    ASSERT_EQ(r.status, 0);
    EXPECT_TRUE(matchesGolden("cli/plan_show_lightning.txt", r.out));
}

TEST(Cli, ValidateExitCodesAndMessages) {
    const std::string dir = shardscope::test::testTempDir() / "shardscope_cli_test";
    std::filesystem::create_directories(dir);
    const std::string bad = dir + "/bad-plan.json";
    std::ofstream(bad) << R"({"format": "shardscope.plan", "version": 1, "mesh": {"shape": [16]},
        "units": [{"modules": ["model.layers"]}, {"modules": ["model.layer.2"], "reshard_after_forward": 3}]})";
    auto r = runCommand(ss("plan validate -m samples/models/llama3-8b/config.json -p " + bad +
                           " -c samples/clusters/h100-sxm-8x8.json"),
                        true);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find(bad + ":/mesh/shape: error: world size 64 of cluster"), std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find(bad + ":/units/0/modules/0: error: \"model.layers\" is a ModuleList"),
              std::string::npos);
    EXPECT_NE(r.out.find("(did you mean \"model.layers.2\"?)"), std::string::npos);
    r =
        runCommand(ss("plan validate -m samples/models/llama3-8b/config.json -p "
                      "samples/plans/llama-per-block.json "
                      "-c samples/clusters/h100-sxm-8x8.json"));
    EXPECT_EQ(r.status, 0);
    EXPECT_NE(r.out.find("valid (35 units, world size 64)"), std::string::npos) << r.out;
    // Unreadable input and bad usage: exit 2 with the file named.
    r = runCommand(ss("plan show -m samples/models/nope.json -p x.json"), true);
    EXPECT_EQ(r.status, 2);
    EXPECT_EQ(r.out, "error: samples/models/nope.json: cannot open file\n");
    r = runCommand(ss("plan show --modle x"), true);
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.out.find("unknown option --modle (did you mean \"--model\"?)"), std::string::npos)
        << r.out;
    r = runCommand(ss("plna show"), true);
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.out.find("unknown command \"plna show\" (did you mean \"plan\"?)"),
              std::string::npos)
        << r.out;
}

TEST(Cli, ValidateReportsEveryMistakeOfTheBrokenSample) {
    auto r = runCommand(
        ss("plan validate -m samples/models/llama3-8b/config.json -p "
           "samples/plans/broken/llama-mistakes.json -c samples/clusters/h100-sxm-8x8.json"),
        true);
    EXPECT_EQ(r.status, 1);
    EXPECT_TRUE(matchesGolden("cli/plan_validate_broken.txt", r.out));
}

TEST(Cli, SimulateGoldensForThreeFixedPlans) {
    const std::vector<std::tuple<std::string, std::string, std::string, std::string>> cases = {
        {"tiny-llama", "tiny-llama-2rank", "cpu-2core", "tiny_2rank"},
        {"llama3-8b", "llama-per-block", "h100-sxm-8x8", "llama8b_per_block"},
        {"llama3-8b", "llama-hsdp-prefetch", "h100-sxm-8x8", "llama8b_hsdp"},
    };
    for (const auto& [model, plan, cluster, name] : cases) {
        const std::string args = "simulate -m samples/models/" + model +
                                 "/config.json -p samples/plans/" + plan +
                                 ".json -c samples/clusters/" + cluster + ".json";
        auto prog = runCommand(ss(args + " --program"));
        ASSERT_EQ(prog.status, 0) << name;
        EXPECT_TRUE(matchesGolden("sim/" + name + ".program.txt", prog.out));
        auto sum = runCommand(ss(args + " --json"));
        ASSERT_EQ(sum.status, 0) << name;
        EXPECT_TRUE(matchesGolden("sim/" + name + ".summary.json", sum.out));
    }
}

TEST(Cli, SimulateTraceIsChromeJsonWithStreamsOpIdsAndCounters) {
    const std::string out = shardscope::test::testTempDir() / "shardscope_sim_trace.json";
    auto r = runCommand(ss(
        "simulate -m samples/models/tiny-llama/config.json -p samples/plans/tiny-llama-2rank.json "
        "-c samples/clusters/cpu-2core.json --trace " +
        out));
    ASSERT_EQ(r.status, 0);
    std::ifstream in(out);
    const auto j = nlohmann::json::parse(in);
    std::set<std::string> threads;
    int slices = 0, counters = 0;
    for (const auto& e : j["traceEvents"]) {
        if (e["ph"] == "M" && e["name"] == "thread_name")
            threads.insert(e["args"]["name"].get<std::string>());
        if (e["ph"] == "X") {
            ++slices;
            EXPECT_TRUE(e["args"].contains("op_id"));
            EXPECT_GE(e["dur"].get<double>(), 0.0);
        }
        if (e["ph"] == "C") ++counters;
    }
    EXPECT_TRUE(threads.count("compute") && threads.count("all_gather") &&
                threads.count("reduce_scatter"));
    auto prog = runCommand(ss(
        "simulate -m samples/models/tiny-llama/config.json -p samples/plans/tiny-llama-2rank.json "
        "-c samples/clusters/cpu-2core.json --program --json"));
    EXPECT_EQ(static_cast<size_t>(slices), nlohmann::json::parse(prog.out)["ops"].size());
    EXPECT_GT(counters, 0);
}

TEST(Cli, ExportWritesAtomicallyAndRefusesInvalidPlans) {
    const std::string dir = shardscope::test::testTempDir() / "shardscope_cli_export";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    for (const char* f : {"fsdp2", "fsdp1", "lightning", "lightning-fsdp1", "shardscope"}) {
        const std::string out = dir + "/plan." + f + ".json";
        auto r = runCommand(ss(
            std::string("plan export -m samples/models/llama3-8b/config.json -p "
                        "samples/plans/llama-per-block.json -c samples/clusters/h100-sxm-8x8.json "
                        "-f ") +
            f + " -o " + out));
        ASSERT_EQ(r.status, 0) << f;
        std::ifstream in(out);
        const auto j = nlohmann::json::parse(in);
        EXPECT_TRUE(j.contains("format")) << f;
    }
    // Only the outputs: no temporary files left behind.
    int files = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos);
        ++files;
    }
    EXPECT_EQ(files, 5);
    // A fairscale plan targets DDPFullyShardedStrategy, which only pytorch_lightning 1.x has:
    // the export says so, and so does a warning.
    {
        auto fs = runCommand(ss("plan export -m samples/models/gpt2/config.json -p "
                                "samples/plans/gpt2-lightning.json -c "
                                "samples/clusters/a100-80gb-8x8.json -f lightning"),
                             true);
        ASSERT_EQ(fs.status, 0) << fs.out;
        EXPECT_NE(fs.out.find("warning: this export needs pytorch_lightning 1.x with fairscale"),
                  std::string::npos)
            << fs.out;
    }
    // A 2-rank mesh on a 64-GPU cluster is an error; nothing may be written.
    auto r = runCommand(ss("plan export -m samples/models/tiny-llama/config.json -p "
                           "samples/plans/tiny-llama-2rank.json "
                           "-c samples/clusters/h100-sxm-8x8.json -o " +
                           dir + "/x.json"),
                        true);
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.out.find("not exporting a plan with errors"), std::string::npos);
    EXPECT_FALSE(std::filesystem::exists(dir + "/x.json"));
    r = runCommand(ss("plan export -m samples/models/llama3-8b/config.json -p "
                      "samples/plans/llama-per-block.json "
                      "-c samples/clusters/h100-sxm-8x8.json -o /nonexistent/dir/x.json"),
                   true);
    EXPECT_EQ(r.status, 2);
    EXPECT_NE(r.out.find("directory /nonexistent/dir does not exist"), std::string::npos) << r.out;
}

// Issue 19's plausibility cases: each ends in a one-line message naming the field and a
// non-zero exit (or a warning where the input is legal but unusual).
TEST(Cli, ImplausibleTrainingShapesAndMachinesAreRefused) {
    const std::string tiny =
        "-m samples/models/tiny-llama/config.json -p "
        "samples/plans/tiny-llama-2rank.json -c samples/clusters/cpu-2core.json";
    // A million micro-batches made an 80M-op program and an internal error (bad_alloc).
    auto r = runCommand(ss("simulate " + tiny + " --micro-batches 1000000"), true);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("/training/micro_batches: error: 1000000 micro-batches of 5 units"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("internal error"), std::string::npos) << r.out;
    // A rotary model past max_position_embeddings: simulated, with a warning.
    r = runCommand(ss("simulate " + tiny + " --seq 1000"), true);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("/training/seq_len: warning: seq_len 1000 exceeds the model's 512 "
                         "positions"),
              std::string::npos)
        << r.out;
    // Phi-3-mini's sliding window (2047): from it on transformers gives SDPA a mask per
    // layer, which the memory model counts (ModuleRuns.SlidingWindowMasks...): no warning.
    auto phi3At = [&](int seq) {
        return runCommand(ss("simulate -m samples/models/phi3-mini-4k/config.json -p "
                             "samples/plans/tiny-llama-2rank.json -c "
                             "samples/clusters/cpu-2core.json --seq " +
                             std::to_string(seq)),
                          true);
    };
    for (int seq : {2046, 2047, 4096}) {
        r = phi3At(seq);
        EXPECT_EQ(r.status, 0) << r.out;
        EXPECT_EQ(r.out.find("sliding window"), std::string::npos) << r.out;
    }
    // GPT-2's learned position table cannot go past n_positions: PyTorch fails.
    r = runCommand(ss("simulate -m samples/models/gpt2/config.json -p "
                      "samples/plans/tiny-llama-2rank.json -c samples/clusters/cpu-2core.json "
                      "--seq 5000"),
                   true);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("/training/seq_len: error: seq_len 5000 exceeds the model's 1024 "
                         "positions (a learned position table"),
              std::string::npos)
        << r.out;
    // MPT's ALiBi is built max_seq_len wide: the plan's error says so, and `recommend`
    // refuses a longer --seq naming it (without --seq it searches at max_seq_len).
    r = runCommand(ss("simulate -m samples/models/mpt-7b/config.json -p "
                      "samples/plans/tiny-llama-2rank.json -c samples/clusters/cpu-2core.json "
                      "--seq 4096"),
                   true);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find("seq_len 4096 exceeds the model's 2048 positions (MPT's ALiBi bias is "
                         "built max_seq_len wide"),
              std::string::npos)
        << r.out;
    r = runCommand(ss("recommend -m samples/models/mpt-7b/config.json -c "
                      "samples/clusters/h100-sxm-8x8.json --seq 4096"),
                   true);
    EXPECT_EQ(r.status, 2) << r.out;  // a bad option
    EXPECT_NE(r.out.find("error: --seq 4096 exceeds the model's 2048 positions"), std::string::npos)
        << r.out;
    // A 1-D mesh of 2^40 ranks validated.
    const std::string dir = shardscope::test::testTempDir() / "shardscope_cli_plaus";
    std::filesystem::create_directories(dir);
    const std::string huge = dir + "/huge-mesh.json";
    std::ofstream(huge) << R"({"format": "shardscope.plan", "version": 1,
        "mesh": {"shape": [1099511627776]}, "wrap": {"policy": "module_class",
        "classes": ["LlamaDecoderLayer"]}})";
    r = runCommand(ss("plan validate -m samples/models/tiny-llama/config.json -p " + huge), true);
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_NE(r.out.find(huge + ":/mesh/shape: error: a mesh of more than 1048576 ranks"),
              std::string::npos)
        << r.out;
    // run --threads 100000 printed nothing for a minute.
    r = runCommand(ss("run -m samples/models/tiny-llama/config.json -p "
                      "samples/plans/tiny-llama-2rank.json --threads 100000"),
                   true);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("error: --threads 100000: this machine has"), std::string::npos) << r.out;
    std::filesystem::remove_all(dir);
}

// Shell completion, exercised in bash as a shell would: the script from `completion bash`
// is sourced and asked for the words after each prefix.
TEST(Cli, BashCompletionCompletesCommandsOptionsAndChoices) {
    auto r = runCommand(ss("completion bash"));
    ASSERT_EQ(r.status, 0);
    const std::string dir = shardscope::test::testTempDir() / "shardscope_cli_completion";
    std::filesystem::create_directories(dir);
    const std::string script = dir + "/shardscope.bash";
    std::ofstream(script) << r.out;
    auto complete = [&](const std::string& words, int cword) {
        auto c = runCommand("bash -c 'source \"" + script + "\"; COMP_WORDS=(" + words +
                            "); COMP_CWORD=" + std::to_string(cword) +
                            "; _shardscope; echo \"${COMPREPLY[*]}\"'");
        EXPECT_EQ(c.status, 0) << c.out;
        return c.out.substr(0, c.out.find('\n'));
    };
    EXPECT_EQ(complete("shardscope pl", 1), "plan");
    EXPECT_EQ(complete("shardscope plan s", 2), "show");
    EXPECT_EQ(complete("shardscope simulate --mi", 2), "--micro-batches");
    EXPECT_EQ(complete("shardscope trace summary --js", 3), "--json");
    EXPECT_EQ(complete("shardscope run --device c", 3), "cpu cuda");
    EXPECT_EQ(complete("shardscope completion z", 2), "zsh");
    EXPECT_EQ(runCommand(ss("completion fish"), true).status, 2);
    std::filesystem::remove_all(dir);
}

// Progress on long imports: lines on stderr per quarter of the file, shown on a terminal
// after a second (forced here with SHARDSCOPE_PROGRESS=1), never on a pipe by default.
TEST(Cli, TraceImportsReportProgress) {
    const std::string dir = shardscope::test::testTempDir() / "shardscope_cli_progress";
    std::filesystem::create_directories(dir);
    const std::string trace = dir + "/big.json";
    {
        std::ofstream out(trace);
        out << "{\"traceEvents\":[";
        for (int i = 0; i < 40000; ++i)
            out << (i ? "," : "")
                << "{\"ph\":\"X\",\"cat\":\"cpu_op\",\"name\":\"aten::mm\",\"ts\":" << i * 10
                << ",\"dur\":5,\"pid\":1,\"tid\":1}";
        out << "]}";
    }
    // stderr into the pipe, stdout away (runCommand drops the group's own stderr).
    auto r =
        runCommand("( cd '" + std::string(SHARDSCOPE_SOURCE_DIR) + "' && SHARDSCOPE_PROGRESS=1 '" +
                   SHARDSCOPE_BINARY + "' trace summary " + trace + " 2>&1 >/dev/null )");
    EXPECT_EQ(r.status, 0) << r.out;
    for (const char* q :
         {"reading the trace: 25%", "reading the trace: 50%", "reading the trace: 75%"})
        EXPECT_NE(r.out.find(q), std::string::npos) << q << "\n" << r.out;
    r = runCommand("( " + ss("trace summary " + trace + " 2>&1 >/dev/null") + " )");
    EXPECT_EQ(r.out.find("reading the trace"), std::string::npos) << r.out;
    std::filesystem::remove_all(dir);
}
