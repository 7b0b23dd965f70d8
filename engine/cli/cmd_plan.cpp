// SPDX-License-Identifier: Apache-2.0
// `shardscope plan show|validate|export`: resolve a plan against a model (and cluster),
// print its units with per-rank sizes and every problem, or export it for PyTorch.
#include <iostream>
#include <memory>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "plans/core/strings.h"
#include "plans/plan/export.h"
#include "plans/plan/resolve.h"

namespace shardscope::cli {

namespace {

struct Loaded {
    ModelGraph model;
    Plan plan;
    std::optional<ClusterSpec> cluster;
};

Expected<Loaded> loadAll(const Args& a) {
    auto g = loadModelArg(a);
    if (!g) return Error{g.error()};
    auto p = loadPlanFile(a.get("--plan"));
    if (!p) return Error{p.error()};
    auto c = loadClusterArg(a);
    if (!c) return Error{c.error()};
    return Loaded{std::move(*g), std::move(*p), std::move(*c)};
}

// Inputs and the plan resolved against them. Held on the heap: the resolved plan points
// at the model, which must not move.
struct Session {
    Loaded inputs;
    ResolvedPlan resolved;
};

std::unique_ptr<Session> loadAndResolve(const Args& a) {
    auto l = loadAll(a);
    if (!l) {
        std::cerr << "error: " << l.error() << "\n";
        return nullptr;
    }
    auto s = std::make_unique<Session>(Session{std::move(*l), {}});
    const auto& in = s->inputs;
    s->resolved =
        resolvePlan(in.model, in.plan, in.cluster ? &*in.cluster : nullptr, a.get("--plan"));
    return s;
}

std::string reshardText(const ResolvedUnit& u) {
    switch (u.reshard) {
        case Reshard::True:
            return "True";
        case Reshard::False:
            return "False";
        case Reshard::Int:
            return std::to_string(u.reshardK);
    }
    return "?";
}

std::string mpText(const ResolvedUnit& u) {
    const auto& mp = u.mixedPrecision;
    if (!mp.paramDtype && !mp.reduceDtype) return "-";
    return std::string(dtypeName(u.allGatherDtype)) + "/" + std::string(dtypeName(u.reduceDtype));
}

std::string prefetchText(const ResolvedPlan& r, const ResolvedUnit& u) {
    auto list = [&](const std::vector<UnitId>& ids) {
        std::string s;
        for (UnitId t : ids)
            s += (s.empty() ? "" : ",") + r.units[t.index()].displayName();
        return s.empty() ? std::string("[]") : s;
    };
    std::string s;
    if (u.explicitForwardPrefetch) s += "fwd:" + list(u.forwardPrefetch);
    if (u.explicitBackwardPrefetch)
        s += std::string(s.empty() ? "" : " ") + "bwd:" + list(u.backwardPrefetch);
    return s.empty() ? "implicit" : s;
}

nlohmann::json unitJson(const ResolvedPlan& r, const ResolvedUnit& u) {
    nlohmann::json mods = nlohmann::json::array();
    for (ModuleId m : u.modules)
        mods.push_back(r.model->module(m).fqn);
    auto ids = [&](const std::vector<UnitId>& v) {
        nlohmann::json a = nlohmann::json::array();
        for (UnitId t : v)
            a.push_back(r.units[t.index()].name);
        return a;
    };
    nlohmann::json params = nlohmann::json::array();
    for (ParamId p : u.params)
        params.push_back(r.model->param(p).name);
    nlohmann::json j{{"name", u.name},
                     {"is_root", u.isRoot},
                     {"modules", mods},
                     {"from_policy", u.fromPolicy},
                     {"params", params},
                     {"numel", u.numel},
                     {"param_bytes", u.paramBytes},
                     {"sharded_numel_per_rank", u.shardedNumel},
                     {"sharded_bytes_per_rank", u.shardedBytes},
                     {"unsharded_bytes_per_rank", u.unshardedBytes},
                     {"reshard_after_forward", u.reshard == Reshard::Int
                                                   ? nlohmann::json(u.reshardK)
                                                   : nlohmann::json(u.reshard == Reshard::True)},
                     {"post_forward_bytes", u.postForwardBytes},
                     {"reshard_after_backward", u.reshardAfterBackward},
                     {"activation_checkpointing", acModeName(u.activationCheckpointing)},
                     {"all_gather_dtype", std::string(dtypeName(u.allGatherDtype))},
                     {"reduce_dtype", std::string(dtypeName(u.reduceDtype))},
                     {"offload", u.offload.enabled}};
    if (u.explicitForwardPrefetch) j["forward_prefetch"] = ids(u.forwardPrefetch);
    if (u.explicitBackwardPrefetch) j["backward_prefetch"] = ids(u.backwardPrefetch);
    return j;
}

nlohmann::json resolvedJson(const ResolvedPlan& r) {
    nlohmann::json units = nlohmann::json::array();
    for (const auto& u : r.units)
        units.push_back(unitJson(r, u));
    nlohmann::json problems = nlohmann::json::array();
    for (const auto& p : r.problems)
        problems.push_back(
            {{"severity", p.severity == Problem::Severity::Error ? "error" : "warning"},
             {"where", p.where},
             {"message", p.message}});
    return {{"plan", r.plan.name},
            {"api", planApiName(r.plan.api)},
            {"world_size", r.worldSize},
            {"replicate_size", r.replicateSize},
            {"shard_size", r.shardSize},
            {"hsdp", r.hsdp},
            {"flat_params", r.flatParams},
            {"total_params", r.model->totalParams()},
            {"total_sharded_bytes_per_rank", r.totalShardedBytes()},
            {"max_unsharded_bytes", r.maxUnshardedBytes()},
            {"units", units},
            {"problems", problems},
            {"errors", r.errorCount()}};
}

void printProblems(const ResolvedPlan& r, std::ostream& out) {
    if (r.problems.empty()) {
        out << "No problems found.\n";
        return;
    }
    out << r.errorCount() << " error(s), " << r.problems.size() - r.errorCount()
        << " warning(s):\n";
    for (const auto& p : r.problems)
        out << "  " << p.toString() << "\n";
}

bool sameRow(const ResolvedPlan& r, const ResolvedUnit& a, const ResolvedUnit& b) {
    return !a.isRoot && !b.isRoot && a.modules.size() == b.modules.size() &&
           r.model->module(a.modules[0]).cls == r.model->module(b.modules[0]).cls &&
           a.numel == b.numel && a.shardedBytes == b.shardedBytes && a.reshard == b.reshard &&
           a.reshardK == b.reshardK && a.activationCheckpointing == b.activationCheckpointing &&
           mpText(a) == mpText(b) && !a.explicitForwardPrefetch && !b.explicitForwardPrefetch &&
           !a.explicitBackwardPrefetch && !b.explicitBackwardPrefetch && a.offload == b.offload;
}

void printPlan(const ResolvedPlan& r, const Loaded& l, bool fold, std::ostream& out) {
    out << "Plan " << (r.plan.name.empty() ? "(unnamed)" : r.plan.name) << " ["
        << planApiName(r.plan.api) << "] on model "
        << (l.model.name.empty() ? "(unnamed)" : l.model.name) << " ("
        << formatCount(l.model.totalParams()) << " parameters)\n";
    out << "  mesh        ";
    if (r.hsdp)
        out << "[" << r.replicateSize << ", " << r.shardSize << "] HSDP: shard over " << r.shardSize
            << " ranks, replicate " << r.replicateSize << " times";
    else if (r.noShard)
        out << "[" << r.worldSize << "] NO_SHARD: replicated, gradients all-reduced";
    else
        out << "[" << r.worldSize << "] FSDP: shard over " << r.shardSize << " ranks";
    out << "\n";
    if (l.cluster) out << "  cluster     " << l.cluster->name << "\n";
    out << "  parameters  "
        << (r.flatParams                       ? "one FlatParameter per unit"
            : r.plan.api == PlanApi::Lightning ? "each flattened and padded to a multiple of the "
                                                 "shard size (fairscale without flatten_parameters)"
                                               : "sharded on dim 0 per parameter")
        << "\n  units       " << r.units.size() << " (wrap policy "
        << wrapPolicyName(r.plan.wrap.kind) << ")\n";
    out << "  per rank    sharded parameters " << formatBytes(r.totalShardedBytes())
        << ", largest unsharded unit " << formatBytes(r.maxUnshardedBytes()) << "\n\n";
    Table t({"UNIT", "PARAMS", "SHARDED/RANK", "UNSHARDED", "RESHARD", "AC", "MP", "PREFETCH"},
            {false, true, true, true, false, false, false, false});
    for (size_t i = 0; i < r.units.size();) {
        size_t j = i + 1;
        if (fold)
            while (j < r.units.size() && sameRow(r, r.units[i], r.units[j]))
                ++j;
        auto addRow = [&](const ResolvedUnit& u, const std::string& label) {
            t.row({label, formatCount(u.numel), formatBytes(u.shardedBytes),
                   formatBytes(u.unshardedBytes), reshardText(u),
                   acModeName(u.activationCheckpointing), mpText(u), prefetchText(r, u)});
        };
        addRow(r.units[i], r.units[i].displayName());
        if (j - i > 1)
            addRow(r.units[i + 1], r.units[i + 1].displayName() +
                                       (j - i > 2 ? " .. " + r.units[j - 1].displayName() : "") +
                                       " (" + std::to_string(j - i - 1) + " alike)");
        i = j;
    }
    t.print(out);
    out << "\n";
    printProblems(r, out);
}

int runPlan(const Args& a, bool validateOnly) {
    const auto session = loadAndResolve(a);
    if (!session) return kExitUsage;
    const ResolvedPlan& r = session->resolved;
    if (a.flag("--json")) {
        if (Status s = emitJson(resolvedJson(r), ""); !s) {
            std::cerr << "error: " << s.error() << "\n";
            return kExitUsage;
        }
    } else if (validateOnly) {
        printProblems(r, r.hasErrors() ? std::cerr : std::cout);
        if (!r.hasErrors())
            std::cout << a.get("--plan") << ": valid (" << r.units.size() << " units, world size "
                      << r.worldSize << ")\n";
    } else {
        printPlan(r, session->inputs, !a.flag("--no-fold"), std::cout);
    }
    return validateOnly && r.hasErrors() ? kExitFailed : kExitOk;
}

int runPlanShow(const Args& a) {
    return runPlan(a, false);
}
int runPlanValidate(const Args& a) {
    return runPlan(a, true);
}

int runPlanExport(const Args& a) {
    auto fmt = parseExportFormat(a.get("--format"));
    if (failed(fmt, "--format: ")) return kExitUsage;
    const auto session = loadAndResolve(a);
    if (!session) return kExitUsage;
    const ResolvedPlan& r = session->resolved;
    if (r.hasErrors()) {
        printProblems(r, std::cerr);
        std::cerr << "error: not exporting a plan with errors\n";
        return kExitFailed;
    }
    if (const auto why = exportRefusal(r, *fmt)) {
        std::cerr << "error: not exporting as " << a.get("--format") << ": " << *why << "\n";
        return kExitFailed;
    }
    const nlohmann::json exported = exportPlan(r, *fmt);
    if (Status s = emitJson(exported, a.get("--output")); !s) {
        std::cerr << "error: " << s.error() << "\n";
        return kExitUsage;
    }
    if (!a.get("--output").empty() && a.get("--output") != "-")
        std::cerr << "wrote " << a.get("--output") << " (" << a.get("--format") << ")\n";
    if (exported.contains("requires"))
        std::cerr << "warning: this export needs " << exported["requires"].get<std::string>()
                  << "\n";
    // What the target cannot express is named, never silently changed (also in the
    // export's "dropped" list).
    if (exported.contains("dropped"))
        for (const auto& d : exported["dropped"]) {
            // No units: a setting of the training loop (training.compile_loss).
            const auto& units = d["units"];
            std::string which = units.empty()       ? "the training loop"
                                : units.size() == 1 ? units[0].get<std::string>()
                                                    : std::to_string(units.size()) + " units (" +
                                                          units.front().get<std::string>() +
                                                          (units.size() > 2 ? " .. " : ", ") +
                                                          units.back().get<std::string>() + ")";
            std::cerr << "warning: " << a.get("--format") << " cannot express "
                      << d.value("setting", "") << " of " << which << ": exported as "
                      << d.value("exported_as", "") << "\n";
        }
    return kExitOk;
}

std::vector<OptionSpec> planOptions() {
    auto o = modelOptions(true);
    o.push_back({"--plan", "FILE", "plan JSON (format shardscope.plan)", "", true, "-p"});
    o.push_back({"--cluster", "FILE", "cluster JSON; its world size must equal the plan's mesh", "",
                 false, "-c"});
    return o;
}

}  // namespace

std::vector<Command> planCommands() {
    const std::string semantics =
        "Units come from the plan's wrap policy (FSDP1's _recursive_wrap semantics) plus the\n"
        "units it lists; the root is always a unit. Sizes are per rank: FSDP2 pads each\n"
        "parameter's dim 0 to a multiple of the shard size (torch.chunk); FSDP1 pads one\n"
        "FlatParameter per unit (16-byte aligned with use_orig_params).";
    CommandSpec show;
    show.name = "plan show";
    show.summary = "Show a plan's units with parameter counts, per-rank sizes and settings.";
    show.description = semantics + "\nProblems are listed after the table; see `plan validate`.";
    show.options = planOptions();
    show.options.push_back({"--no-fold", "", "list every unit instead of folding alike ones"});
    show.options.push_back({"--json", "", "print the resolved plan as JSON"});
    show.examples = {
        "shardscope plan show -m samples/models/llama3-8b/config.json -p "
        "samples/plans/llama-per-block.json "
        "-c samples/clusters/h100-sxm-8x8.json"};

    CommandSpec validate = show;
    validate.name = "plan validate";
    validate.summary = "Check a plan against PyTorch's rules; exit 1 if it has any error.";
    validate.description =
        semantics +
        "\nChecks: module names exist (nearest name suggested), containers without\n"
        "forward are not units, units do not overlap, the mesh is 1D or 2D and its\n"
        "product equals the cluster's world size, int reshard_after_forward divides\n"
        "the shard size, prefetch targets are units, shared parameters stay in one\n"
        "FSDP2 unit, dtypes are known.";
    validate.options = planOptions();
    validate.options.push_back({"--json", "", "print the resolved plan and problems as JSON"});
    validate.examples = {
        "shardscope plan validate -m model.json -p plan.json -c cluster.json && echo ok"};

    CommandSpec exp;
    exp.name = "plan export";
    exp.summary = "Export a plan as FSDP2, FSDP1 or Lightning configuration JSON.";
    exp.description =
        "fsdp2: fully_shard calls in application order (children first, root last) with\n"
        "kwargs, the mesh, prefetch lists and activation checkpointing. fsdp1:\n"
        "FullyShardedDataParallel kwargs with the auto-wrap policy. lightning: Lightning's\n"
        "strategy: ModelParallelStrategy with the fsdp2 export for an FSDP2 plan (apply it in\n"
        "configure_model with samples/apply_lightning.py), FSDPStrategy kwargs for an FSDP1\n"
        "plan. lightning-fsdp1: an FSDP2 plan as FSDPStrategy kwargs. shardscope: the plan\n"
        "itself, normalised. What a format cannot express is listed under \"dropped\" and\n"
        "warned about. Written atomically.";
    exp.options = planOptions();
    exp.options.push_back({"--format", "FMT",
                           "shardscope, fsdp2, fsdp1, lightning or lightning-fsdp1", "fsdp2", false,
                           "-f"});
    exp.options.push_back({"--output", "FILE", "write here instead of stdout", "", false, "-o"});
    exp.examples = {
        "shardscope plan export -m config.json -p plan.json -c cluster.json -f fsdp1 -o "
        "fsdp1.json"};
    return {{show, runPlanShow}, {validate, runPlanValidate}, {exp, runPlanExport}};
}

}  // namespace shardscope::cli
