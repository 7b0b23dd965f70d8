// SPDX-License-Identifier: Apache-2.0
// Randomised robustness test of every JSON loader (model, HF config, cluster, plan) and of
// plan resolution: thousands of mutated samples. Each must load or be rejected with a
// message naming the file and a field (JSON pointer) or a line:column; nothing may crash
// or hang (ctest's timeout catches a hang).
#include <gtest/gtest.h>

#include <random>

#include "plans/cluster/cluster.h"
#include "plans/core/json_reader.h"
#include "plans/model/model_json.h"
#include "plans/plan/plan_json.h"
#include "plans/plan/resolve.h"
#include "tests/support/golden.h"

using namespace shardscope;
using shardscope::test::samplePath;

namespace {

using Json = nlohmann::json;

Json randomValue(std::mt19937& rng) {
    switch (rng() % 10) {
        case 0:
            return nullptr;
        case 1:
            return true;
        case 2:
            return -1;
        case 3:
            return 0;
        case 4:
            return int64_t{1} << 62;
        case 5:
            return 1e308;
        case 6:
            return "bfloat16";
        case 7:
            return "";
        case 8:
            return Json::array({1, "x", nullptr});
        default:
            return Json::object({{"k", 1}});
    }
}

// Collect pointers to every node, then mutate one: replace, delete, or duplicate.
void collect(Json& j, std::vector<Json*>& out) {
    out.push_back(&j);
    if (j.is_object())
        for (auto& [k, v] : j.items())
            collect(v, out);
    else if (j.is_array())
        for (auto& v : j)
            collect(v, out);
}

void mutate(Json& root, std::mt19937& rng) {
    std::vector<Json*> nodes;
    collect(root, nodes);
    Json* n = nodes[rng() % nodes.size()];
    switch (rng() % 5) {
        case 0:
            *n = randomValue(rng);
            break;
        case 1:
            if (n->is_object() && !n->empty()) {
                auto it = n->begin();
                std::advance(it, static_cast<long>(rng() % n->size()));
                n->erase(it);
            }
            break;
        case 2:
            if (n->is_array() && !n->empty())
                n->erase(n->begin() + static_cast<long>(rng() % n->size()));
            break;
        case 3:
            if (n->is_array()) n->push_back(randomValue(rng));
            break;
        default:
            if (n->is_object())
                (*n)["unexpected_" + std::to_string(rng() % 3)] = randomValue(rng);
            else if (n->is_number_integer())
                *n = n->get<int64_t>() * 1000003 + 7;
    }
}

// A rejection must say where: "<file>:/pointer: ..." or "<file>:line:col: ...".
void expectNamed(const std::string& error, const std::string& file) {
    ASSERT_FALSE(error.empty());
    EXPECT_EQ(error.rfind(file + ":", 0), 0u) << error;
    const std::string rest = error.substr(file.size() + 1);
    EXPECT_TRUE(rest[0] == '/' || std::isdigit(static_cast<unsigned char>(rest[0]))) << error;
}

Json loadSample(const std::string& rel) {
    auto j = readJsonFile(samplePath(rel));
    EXPECT_TRUE(j.ok());
    return *j;
}

}  // namespace

TEST(Fuzz, MutatedLoadersNeverCrashAndAlwaysNameTheField) {
    std::mt19937 rng(20261121);
    const Json plan = loadSample("plans/llama-hsdp-prefetch.json");
    const Json fsdp1 = loadSample("plans/llama-fsdp1.json");
    const Json lightning = loadSample("plans/gpt2-lightning.json");
    const Json cluster = loadSample("clusters/h100-sxm-8x8.json");
    const Json hf = loadSample("models/tiny-llama/config.json");
    const Json gpt2 = loadSample("models/gpt2/config.json");
    const Json model = modelToJson(std::move(modelFromHfConfig(hf, "hf")).value());
    const ModelGraph tiny = std::move(modelFromHfConfig(hf, "hf")).value();
    auto clusterSpec = clusterFromJson(cluster, "c");
    int accepted = 0, rejected = 0;
    for (int i = 0; i < 3000; ++i) {
        const int kind = i % 6;
        const Json& base = kind == 0   ? plan
                           : kind == 1 ? fsdp1
                           : kind == 2 ? lightning
                           : kind == 3 ? cluster
                           : kind == 4 ? (i % 12 < 6 ? hf : gpt2)
                                       : model;
        Json j = base;
        const int rounds = 1 + static_cast<int>(rng() % 3);
        for (int r = 0; r < rounds; ++r)
            mutate(j, rng);
        const std::string file = "fuzz" + std::to_string(i) + ".json";
        std::string error;
        if (kind <= 2) {
            auto p = planFromJson(j, file);
            if (p.ok()) {
                // A plan that loads must also resolve without crashing against a model.
                const ResolvedPlan r = resolvePlan(tiny, *p, &*clusterSpec, file);
                for (const auto& pr : r.problems)
                    EXPECT_EQ(pr.where.rfind(file + ":", 0), 0u) << pr.where;
            } else {
                error = p.error();
            }
        } else if (kind == 3) {
            auto c = clusterFromJson(j, file);
            if (!c.ok()) error = c.error();
        } else if (kind == 4) {
            HfLoadOptions o;
            auto g = modelFromHfConfig(j, file, o);
            if (!g.ok())
                error = g.error();
            else if (g->totalParams() > (int64_t{1} << 40) && g->moduleCount() > 200000)
                ADD_FAILURE() << "implausible model accepted";
        } else {
            auto g = modelFromJson(j, file);
            if (!g.ok()) error = g.error();
        }
        if (error.empty()) {
            ++accepted;
        } else {
            ++rejected;
            expectNamed(error, file);
        }
    }
    // Both outcomes must occur, or the mutations test nothing.
    EXPECT_GT(accepted, 100);
    EXPECT_GT(rejected, 500);
    std::printf("fuzz: %d accepted, %d rejected with a named field\n", accepted, rejected);
}

TEST(Fuzz, TruncatedAndGarbledTextIsRejectedWithLineAndColumn) {
    std::mt19937 rng(7);
    const std::string text = loadSample("plans/llama-per-block.json").dump(2);
    for (int i = 0; i < 500; ++i) {
        std::string t = text;
        if (i % 2)
            t.resize(rng() % t.size());
        else
            t[rng() % t.size()] = "{}[],:\"x0"[rng() % 9];
        auto j = parseJsonText(t, "g.json");
        if (!j.ok()) {
            expectNamed(j.error(), "g.json");
            continue;
        }
        auto p = planFromJson(*j, "g.json");
        if (!p.ok()) expectNamed(p.error(), "g.json");
    }
}
