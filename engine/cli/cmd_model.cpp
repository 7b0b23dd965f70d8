// SPDX-License-Identifier: Apache-2.0
// `shardscope model show`: the module tree with parameter counts, sizes and per-module
// compute and activation costs. `shardscope model families`: the natively loaded
// Hugging Face families and the bundled configs of each, with their parameter counts.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "plans/core/json_reader.h"
#include "plans/core/strings.h"
#include "plans/model/hf_config.h"

namespace shardscope::cli {

namespace {

// Consecutive siblings with the same class and parameter count are folded into one row
// ("1..31  LlamaDecoderLayer ×31"), so an 80-block model reads in one screen.
// What a subtree's code keeps only when the model's activations are below fp32
// (ModuleCost::belowFp32SavedBytes).
double belowFp32Bytes(const ModelGraph& g, const ModuleCost& cost, int64_t batch, int64_t seq) {
    return dtypeSize(g.activationDtype) < 4 ? cost.belowFp32SavedBytes.at(batch, seq) : 0.0;
}

bool sameShape(const ModelGraph& g, ModuleId a, ModuleId b) {
    const auto& ma = g.module(a);
    const auto& mb = g.module(b);
    return ma.cls == mb.cls && g.subtreeNumel(a) == g.subtreeNumel(b) &&
           ma.subtreeEnd - a.value == mb.subtreeEnd - b.value;
}

struct ShowContext {
    const ModelGraph& g;
    int maxDepth;
    bool fold;
    int64_t batch, seq;
    Table table;
    nlohmann::json jsonModules = nlohmann::json::array();
};

void showModule(ShowContext& c, ModuleId m, int depth, const std::string& label, int64_t repeat) {
    const auto& node = c.g.module(m);
    const ModuleCost cost = c.g.subtreeCost(m);
    const std::string indent(static_cast<size_t>(depth) * 2, ' ');
    const std::string count = repeat > 1 ? " x" + std::to_string(repeat) : "";
    c.table.row(
        {indent + label, node.cls + count, formatCount(c.g.subtreeNumel(m)),
         formatBytes(c.g.subtreeParamBytes(m)), formatFlops(cost.fwdFlops.at(c.batch, c.seq)),
         formatBytes(static_cast<int64_t>(cost.savedAt(c.batch, c.seq, c.g.slidingWindow)))});
    nlohmann::json params = nlohmann::json::array();
    for (ParamId pid : node.params) {
        const auto& p = c.g.param(pid);
        std::string local;
        for (const auto& o : p.owners)
            if (o.module == m) local = o.localName;
        nlohmann::json pj{{"name", local},
                          {"shape", p.shape},
                          {"dtype", std::string(dtypeName(p.dtype))},
                          {"requires_grad", p.requiresGrad},
                          {"numel", p.numel}};
        if (p.tied()) pj["tied_to"] = p.name;
        params.push_back(pj);
    }
    c.jsonModules.push_back(
        {{"name", node.fqn},
         {"class", node.cls},
         {"depth", depth},
         {"params", c.g.subtreeNumel(m)},
         {"param_bytes", c.g.subtreeParamBytes(m)},
         {"direct_params", params},
         {"fwd_flops", cost.fwdFlops.at(c.batch, c.seq)},
         {"bwd_flops", cost.bwdFlops.at(c.batch, c.seq)},
         {"saved_activation_bytes", cost.savedAt(c.batch, c.seq, c.g.slidingWindow) +
                                        belowFp32Bytes(c.g, cost, c.batch, c.seq)},
         {"output_bytes", cost.outputBytes.at(c.batch, c.seq)},
         {"repeat", repeat}});
    // Computes in fp32 whatever the model's dtype (its own fp32 unit under a lower param_dtype).
    if (node.keepFp32) c.jsonModules.back()["keep_fp32"] = true;
    // Saved besides, from seq_len == sliding window on (in saved_activation_bytes then).
    if (!cost.windowSavedBytes.isZero())
        c.jsonModules.back()["window_saved_bytes"] = cost.windowSavedBytes.at(c.batch, c.seq);
    // What the subtree saves compiled as one region (torch.compile per block), where known.
    if (cost.compiled.known()) {
        auto& m = c.jsonModules.back();
        m["compiled_saved_activation_bytes"] = cost.compiled.savedBytes.at(c.batch, c.seq);
        m["compiled_fwd_mem_bytes"] = cost.compiled.fwdMemBytes.at(c.batch, c.seq);
        m["compiled_bwd_mem_bytes"] = cost.compiled.bwdMemBytes.at(c.batch, c.seq);
        m["compiled_fwd_mem_kernels"] = cost.compiled.fwdMemKernels;
        m["compiled_bwd_mem_kernels"] = cost.compiled.bwdMemKernels;
    }
    if (depth >= c.maxDepth || repeat > 1) return;  // folded rows repeat the first's children
    const auto& ch = node.children;
    for (size_t i = 0; i < ch.size();) {
        size_t j = i + 1;
        if (c.fold)
            while (j < ch.size() && sameShape(c.g, ch[i], ch[j]))
                ++j;
        // Show the first of a run in full, then fold the rest into one row.
        showModule(c, ch[i], depth + 1, c.g.module(ch[i]).name, 1);
        if (j - i > 1) {
            const std::string first = c.g.module(ch[i + 1]).name;
            const std::string last = c.g.module(ch[j - 1]).name;
            showModule(c, ch[i + 1], depth + 1, first + (j - i > 2 ? ".." + last : ""),
                       static_cast<int64_t>(j - i - 1));
            c.jsonModules.back()["folded"] = true;
        }
        i = j;
    }
}

int runModelShow(const Args& a) {
    auto g = loadModelArg(a);
    if (failed(g)) return kExitUsage;
    auto depth = a.getInt("--depth", 0);
    auto batch = a.getInt("--batch", 1);
    auto seq = a.getInt("--seq", 1);
    for (const auto* e : {&depth, &batch, &seq})
        if (!*e) {
            std::cerr << "error: " << e->error() << "\n";
            return kExitUsage;
        }
    ShowContext c{*g,
                  static_cast<int>(*depth),
                  !a.flag("--no-fold"),
                  *batch,
                  *seq,
                  Table({"MODULE", "CLASS", "PARAMS", "SIZE", "FWD FLOPS", "SAVED ACT"},
                        {false, false, true, true, true, true})};
    showModule(c, g->root(), 0, "<root>", 1);
    nlohmann::json tied = nlohmann::json::array();
    for (const auto& p : g->params())
        if (p.tied()) {
            nlohmann::json owners = nlohmann::json::array();
            for (const auto& o : p.owners) {
                const auto& f = g->module(o.module).fqn;
                owners.push_back(f.empty() ? o.localName : f + "." + o.localName);
            }
            tied.push_back({{"name", p.name}, {"owners", owners}, {"numel", p.numel}});
        }
    if (a.flag("--json")) {
        nlohmann::json j{{"name", g->name},
                         {"source", g->source},
                         {"total_params", g->totalParams()},
                         {"trainable_params", g->trainableParams()},
                         {"param_bytes", g->totalParamBytes()},
                         {"module_count", g->moduleCount()},
                         {"batch", *batch},
                         {"seq", *seq},
                         {"activation_dtype", std::string(dtypeName(g->activationDtype))},
                         {"sliding_window", g->slidingWindow},
                         {"tied_params", tied},
                         {"modules", c.jsonModules}};
        if (Status s = emitJson(j, ""); !s) {
            std::cerr << "error: " << s.error() << "\n";
            return kExitUsage;
        }
        return kExitOk;
    }
    const ModuleCost total = g->subtreeCost(g->root());
    std::cout << "Model " << (g->name.empty() ? a.get("--model") : g->name) << " (" << g->source
              << ")\n"
              << "  parameters  " << withThousands(g->totalParams()) << " ("
              << formatCount(g->totalParams()) << "), " << formatBytes(g->totalParamBytes())
              << "; trainable " << withThousands(g->trainableParams()) << "\n"
              << "  modules     " << g->moduleCount() << "\n"
              << "  per micro-batch of " << *batch << " x " << *seq << " tokens: forward "
              << formatFlops(total.fwdFlops.at(*batch, *seq)) << ", backward "
              << formatFlops(total.bwdFlops.at(*batch, *seq)) << ", saved activations "
              << formatBytes(static_cast<int64_t>(total.savedAt(*batch, *seq, g->slidingWindow)))
              << " (" << dtypeName(g->activationDtype) << ")\n";
    for (const auto& t : tied) {
        std::cout << "  tied        ";
        for (size_t i = 0; i < t["owners"].size(); ++i)
            std::cout << (i ? " = " : "") << t["owners"][i].get<std::string>();
        std::cout << " (" << formatCount(t["numel"].get<int64_t>()) << ", counted once)\n";
    }
    std::cout << "\n";
    c.table.print(std::cout);
    return kExitOk;
}

// The bundled Hugging Face configs (samples/models/*/config.json) by model_type, each with
// its folder name and total parameter count as loaded here.
struct Sample {
    std::string name;
    int64_t params = 0;
};
std::map<std::string, std::vector<Sample>> samplesByType() {
    std::map<std::string, std::vector<Sample>> out;
    const std::filesystem::path dir = dataPath("samples/models");
    std::error_code ec;
    std::vector<std::filesystem::path> folders;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (e.is_directory()) folders.push_back(e.path());
    std::sort(folders.begin(), folders.end());
    for (const auto& f : folders) {
        const std::string file = (f / "config.json").string();
        Expected<nlohmann::json> j = readJsonFile(file);
        if (!j.ok() || !looksLikeHfConfig(*j) || !(*j)["model_type"].is_string()) continue;
        Expected<ModelGraph> g = modelFromHfConfig(*j, file);
        if (!g.ok()) continue;
        out[(*j)["model_type"].get<std::string>()].push_back(
            {f.filename().string(), g->totalParams()});
    }
    return out;
}

int runModelFamilies(const Args& a) {
    const auto samples = samplesByType();
    nlohmann::json rows = nlohmann::json::array();
    Table t({"model_type", "transformers class", "covers", "bundled configs (parameters)"});
    for (const HfFamily& f : hfFamilies()) {
        nlohmann::json js = nlohmann::json::array();
        std::string cell;
        if (auto it = samples.find(f.modelType); it != samples.end())
            for (const Sample& s : it->second) {
                js.push_back({{"name", s.name},
                              {"config", "samples/models/" + s.name + "/config.json"},
                              {"total_params", s.params}});
                cell += (cell.empty() ? "" : ", ") + s.name + " " + withThousands(s.params);
            }
        rows.push_back({{"model_type", f.modelType},
                        {"class", f.causalLm},
                        {"covers", f.models},
                        {"samples", js}});
        t.row({f.modelType, f.causalLm, f.models, cell.empty() ? "-" : cell});
    }
    if (a.flag("--json")) {
        std::cout << nlohmann::json{{"families", rows}}.dump(2) << "\n";
        return kExitOk;
    }
    std::cout << hfFamilies().size()
              << " model families load natively from a config.json (totals as transformers "
                 "builds them, tests/python/test_hf_modules.py):\n\n";
    t.print(std::cout);
    std::cout << "\nAny other model_type is exported with transformers the first time "
                 "(scripts/export_model.py; --no-export refuses).\n";
    return kExitOk;
}

}  // namespace

std::vector<Command> modelCommands() {
    CommandSpec show;
    show.name = "model show";
    show.summary =
        "Show a model's module tree with parameter counts, sizes, FLOPs and activations.";
    show.description =
        "Reads a Hugging Face config.json of a natively loaded family (`shardscope model\n"
        "families` lists them) or a ShardScope model JSON (scripts/export_model.py writes one for "
        "any\n"
        "torch.nn.Module, mixture-of-experts models included). A config.json of any other\n"
        "model_type is exported with transformers the first time (every command that takes\n"
        "--model does this; cached under ~/.cache/shardscope/models, --no-export refuses).\n"
        "Module names "
        "are the ones FSDP sees (named_modules()). Repeated siblings of the same shape are\n"
        "folded into one row; tied parameters are counted once, as model.parameters() does.\n"
        "FLOPs and saved activations are per micro-batch of --batch x --seq tokens, counted\n"
        "as documented in plans/README.md.";
    show.options = modelOptions(true);
    show.options.push_back({"--depth", "N", "show modules down to this depth", "3"});
    show.options.push_back({"--batch", "B", "micro-batch size for FLOPs and activations", "1"});
    show.options.push_back({"--seq", "S", "sequence length for FLOPs and activations", "2048"});
    show.options.push_back({"--no-fold", "", "list every module instead of folding repeats"});
    show.options.push_back({"--json", "", "print JSON (with total_params) instead of a table"});
    show.examples = {"shardscope model show --model samples/models/llama3-8b/config.json",
                     "shardscope model show -m samples/models/gpt2/config.json --depth 5 --json"};
    CommandSpec families;
    families.name = "model families";
    families.summary = "List the Hugging Face model families loaded natively, with sample totals.";
    families.description =
        "Each family's config.json model_type, the transformers class it builds, the published\n"
        "models it covers, and the configs bundled under samples/models with their exact\n"
        "parameter counts (equal to transformers' on the meta device, checked by the test\n"
        "suite).";
    families.options = {{"--json", "", "print JSON instead of a table"}};
    families.examples = {"shardscope model families", "shardscope model families --json"};
    return {{show, runModelShow}, {families, runModelFamilies}};
}

}  // namespace shardscope::cli
