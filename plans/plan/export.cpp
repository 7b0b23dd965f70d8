// SPDX-License-Identifier: Apache-2.0
#include "plans/plan/export.h"

#include "plans/plan/plan_json.h"

namespace shardscope {

Expected<ExportFormat> parseExportFormat(const std::string& s) {
    if (s == "shardscope") return ExportFormat::ShardScope;
    if (s == "fsdp2") return ExportFormat::Fsdp2;
    if (s == "fsdp1") return ExportFormat::Fsdp1;
    if (s == "lightning") return ExportFormat::Lightning;
    if (s == "lightning-fsdp1") return ExportFormat::LightningFsdp1;
    return Error{"unknown export format \"" + s +
                 "\" (expected shardscope, fsdp2, fsdp1, lightning or lightning-fsdp1)"};
}

namespace {

nlohmann::json dt(const std::optional<DType>& d) {
    return d ? nlohmann::json("torch." + std::string(dtypeName(*d))) : nlohmann::json(nullptr);
}

nlohmann::json reshardValue(const ResolvedUnit& u) {
    // Export the effective value so the config does not depend on PyTorch's defaults.
    switch (u.reshard) {
        case Reshard::True:
            return true;
        case Reshard::False:
            return false;
        case Reshard::Int:
            return u.reshardK;
    }
    return true;
}

nlohmann::json mesh(const ResolvedPlan& r) {
    nlohmann::json m;
    if (r.hsdp) {
        m["shape"] = {r.replicateSize, r.shardSize};
        m["dim_names"] = {"replicate", "shard"};
    } else {
        m["shape"] = {r.worldSize};
        m["dim_names"] = {"shard"};
    }
    return m;
}

std::vector<std::string> unitModuleNames(const ResolvedPlan& r, const ResolvedUnit& u) {
    std::vector<std::string> out;
    for (ModuleId m : u.modules)
        out.push_back(r.model->module(m).fqn);
    return out;
}

nlohmann::json exportFsdp2(const ResolvedPlan& r) {
    nlohmann::json j;
    j["format"] = "shardscope.export.fsdp2";
    j["version"] = 1;
    j["plan"] = r.plan.name;
    j["mesh"] = mesh(r);
    auto& calls = j["fully_shard"] = nlohmann::json::array();
    for (UnitId id : r.applicationOrder()) {
        const auto& u = r.units[id.index()];
        nlohmann::json kw;
        kw["reshard_after_forward"] = reshardValue(u);
        const auto& mp = u.mixedPrecision;
        if (mp.paramDtype || mp.reduceDtype || mp.outputDtype || !mp.castForwardInputs)
            kw["mp_policy"] = {{"param_dtype", dt(mp.paramDtype)},
                               {"reduce_dtype", dt(mp.reduceDtype)},
                               {"output_dtype", dt(mp.outputDtype)},
                               {"cast_forward_inputs", mp.castForwardInputs}};
        if (u.offload.enabled) kw["offload_policy"] = {{"pin_memory", u.offload.pinMemory}};
        nlohmann::json call{{"unit", u.name}, {"modules", unitModuleNames(r, u)}, {"kwargs", kw}};
        if (!u.reshardAfterBackward) call["reshard_after_backward"] = false;
        calls.push_back(std::move(call));
    }
    nlohmann::json fwd = nlohmann::json::object(), bwd = nlohmann::json::object(),
                   ac = nlohmann::json::object();
    for (const auto& u : r.units) {
        // Keyed by each unit's first module: set_modules_to_*_prefetch takes the module that
        // carries the FSDP state, and a grouped unit's name is not a module path.
        auto first = [&](const ResolvedUnit& x) { return r.model->module(x.modules[0]).fqn; };
        auto names = [&](const std::vector<UnitId>& ids) {
            nlohmann::json a = nlohmann::json::array();
            for (UnitId t : ids)
                a.push_back(first(r.units[t.index()]));
            return a;
        };
        if (u.explicitForwardPrefetch) fwd[first(u)] = names(u.forwardPrefetch);
        if (u.explicitBackwardPrefetch) bwd[first(u)] = names(u.backwardPrefetch);
        // Per module, resolved ("every k" already chosen): "full", "selective_op" (torchtitan's
        // preset), {"mode": "selective_op", "save": [...]} or "attention".
        if (u.activationCheckpointing != AcMode::None)
            for (ModuleId m : u.modules) {
                nlohmann::json mode = acModeName(u.activationCheckpointing);
                if (u.activationCheckpointing == AcMode::SelectiveOp && !u.acSave.empty())
                    mode = nlohmann::json{{"mode", "selective_op"}, {"save", u.acSave}};
                ac[r.model->module(m).fqn] = mode;
            }
    }
    j["forward_prefetch"] = fwd;
    j["backward_prefetch"] = bwd;
    j["activation_checkpointing"] = ac;
    // torch.compile, as torchtitan applies it before fully_shard: each listed module
    // compiled in place (module.compile()), or the whole model.
    nlohmann::json perBlock = nlohmann::json::array();
    bool full = false;
    for (const auto& u : r.units) {
        if (u.compile == CompileMode::Full) full = true;
        if (u.compile == CompileMode::PerBlock && !u.isRoot)
            for (ModuleId m : u.modules)
                perBlock.push_back(r.model->module(m).fqn);
    }
    if (full || !perBlock.empty() || r.plan.compileLoss) {
        j["compile"] = {{"per_block", perBlock}, {"full", full}};
        // training.compile_loss: the loss function compiled too (torchtitan's
        // build_cross_entropy_loss), which the training loop applies (compile_loss()).
        if (r.plan.compileLoss) j["compile"]["loss"] = true;
    }
    // torchao's float8 training: one convert_to_float8_training call per distinct config,
    // with the nn.Linear layers it converts (module_filter_fn).
    nlohmann::json f8 = nlohmann::json::array();
    for (const auto& u : r.units) {
        if (!u.float8.enabled || u.float8Linears.empty()) continue;
        nlohmann::json* group = nullptr;
        for (auto& gj : f8)
            if (gj["recipe"] == u.float8.recipe &&
                gj["enable_fsdp_float8_all_gather"] == u.float8.fsdpFloat8AllGather &&
                gj["precompute_float8_dynamic_scale_for_fsdp"] == u.float8.precomputeScales)
                group = &gj;
        if (!group) {
            f8.push_back({{"recipe", u.float8.recipe},
                          {"enable_fsdp_float8_all_gather", u.float8.fsdpFloat8AllGather},
                          {"precompute_float8_dynamic_scale_for_fsdp", u.float8.precomputeScales},
                          {"modules", nlohmann::json::array()}});
            group = &f8.back();
        }
        for (ModuleId m : u.float8Linears)
            (*group)["modules"].push_back(r.model->module(m).fqn);
    }
    if (!f8.empty()) j["float8"] = f8;
    nlohmann::json ignored = nlohmann::json::array();
    for (ParamId p : r.ignoredParams)
        ignored.push_back(r.model->param(p).name);
    j["ignored_params"] = ignored;
    j["gradient_accumulation"] = {{"micro_batches", r.plan.microBatches},
                                  {"sync_every_micro_batch", r.plan.syncEveryMicroBatch}};
    j["gradient_divide_factor"] = r.plan.gradientDivideFactor
                                      ? nlohmann::json(*r.plan.gradientDivideFactor)
                                      : nlohmann::json(nullptr);
    return j;
}

// The auto-wrap policy that reproduces the resolved units under FSDP1: the plan's own
// policy when no unit was added by hand, else an explicit list of module names.
nlohmann::json autoWrapPolicy(const ResolvedPlan& r) {
    bool handAdded = false;
    for (const auto& u : r.units)
        if (!u.isRoot && !u.fromPolicy) handAdded = true;
    const auto& w = r.plan.wrap;
    if (!handAdded) {
        switch (w.kind) {
            case WrapPolicySpec::Kind::Size:
                return {{"type", "size_based_auto_wrap_policy"},
                        {"min_num_params", w.minNumParams},
                        {"force_leaf_modules", w.forceLeafClasses},
                        {"exclude_wrap_modules", w.excludeWrapClasses}};
            case WrapPolicySpec::Kind::ModuleClass:
                return {{"type", "ModuleWrapPolicy"}, {"module_classes", w.classes}};
            case WrapPolicySpec::Kind::NamePattern:
                return {{"type", "lambda_auto_wrap_policy"}, {"module_name_patterns", w.patterns}};
            case WrapPolicySpec::Kind::None:
                return nullptr;
        }
    }
    nlohmann::json names = nlohmann::json::array();
    for (const auto& u : r.units)
        if (!u.isRoot && !u.batchNormRule) names.push_back(r.model->module(u.modules[0]).fqn);
    return {{"type", "CustomPolicy"}, {"module_names", names}};
}

nlohmann::json mixedPrecisionKw(const ResolvedPlan& r) {
    const auto& d = r.plan.defaults.mixedPrecision;
    if (!d || (!d->paramDtype && !d->reduceDtype)) return nullptr;
    return {{"param_dtype", dt(d->paramDtype)},
            {"reduce_dtype", dt(d->reduceDtype ? d->reduceDtype : d->paramDtype)},
            // FSDP2, whose plan this may be, casts no buffers; FSDP1 leaves them alone with
            // buffer_dtype None too.
            {"buffer_dtype", nullptr},
            {"cast_forward_inputs", d->castForwardInputs}};
}

nlohmann::json activationCheckpointingClasses(const ResolvedPlan& r) {
    nlohmann::json classes = nlohmann::json::array();
    for (const auto& u : r.units)
        if (u.activationCheckpointing != AcMode::None && !u.isRoot) {
            const std::string cls = r.model->module(u.modules[0]).cls;
            if (std::find(classes.begin(), classes.end(), cls) == classes.end())
                classes.push_back(cls);
        }
    return classes;
}

// What an FSDP2 plan says that FullyShardedDataParallel's one set of kwargs cannot: each
// such setting, the unit it belongs to, and what the export does instead. Empty for an
// FSDP1 or Lightning plan.
// torch.compile and float8 in a plan exported to FSDP1 or Lightning: neither export applies
// them (samples/apply_fsdp1.py and apply_lightning.py wrap, they do not convert or compile),
// so each is named with what the user does instead.
void appendDroppedTrainingOptions(const ResolvedPlan& r, nlohmann::json& out) {
    std::vector<std::string> compiled, converted;
    std::string recipe;
    for (const auto& u : r.units) {
        if (u.compile != CompileMode::None) compiled.push_back(u.displayName());
        if (u.float8.enabled) {
            converted.push_back(u.displayName());
            recipe = u.float8.recipe;
        }
    }
    if (r.plan.compileLoss)
        out.push_back({{"units", nlohmann::json::array()},
                       {"setting", "training.compile_loss"},
                       {"exported_as",
                        "nothing: compile the loss function in the training loop "
                        "(torch.compile(loss_fn), as torchtitan does)"}});
    if (!compiled.empty())
        out.push_back({{"units", compiled},
                       {"setting", "compile"},
                       {"exported_as",
                        "nothing: this export does not apply torch.compile (compile the "
                        "model's blocks before wrapping them, as torchtitan does)"}});
    if (!converted.empty())
        out.push_back({{"units", converted},
                       {"setting", "float8 " + recipe},
                       {"exported_as",
                        "nothing: this export does not convert layers to float8 (call "
                        "torchao.float8.convert_to_float8_training before wrapping; float8 "
                        "all-gather needs FSDP2)"}});
}

nlohmann::json droppedForFsdp1(const ResolvedPlan& r, const std::string& strategy) {
    nlohmann::json out = nlohmann::json::array();
    if (r.plan.api != PlanApi::Fsdp2) {
        appendDroppedTrainingOptions(r, out);
        return out;
    }
    // One entry per (setting, what it became), with every unit it concerns, in order.
    std::vector<std::pair<std::pair<std::string, std::string>, std::vector<std::string>>> groups;
    auto drop = [&](const ResolvedUnit& u, const std::string& setting, const std::string& what) {
        for (auto& [k, units] : groups)
            if (k.first == setting && k.second == what) {
                units.push_back(u.displayName());
                return;
            }
        groups.push_back({{setting, what}, {u.displayName()}});
    };
    // FULL_SHARD and HYBRID_SHARD reshard after forward; the ZeRO-2 strategies do not.
    const bool exportedReshard = strategy == "FULL_SHARD" || strategy == "HYBRID_SHARD";
    const auto& dmp = r.plan.defaults.mixedPrecision;
    for (const auto& u : r.units) {
        if (u.reshard == Reshard::Int)
            drop(u, "reshard_after_forward " + std::to_string(u.reshardK),
                 "the sharding strategy " + strategy + " (FSDP1 keeps no partial copy)");
        if (!u.isRoot && u.reshard != Reshard::Int &&
            (u.reshard == Reshard::True) != exportedReshard)
            drop(u,
                 std::string("reshard_after_forward ") +
                     (u.reshard == Reshard::True ? "True" : "False"),
                 "the one sharding strategy " + strategy + " for every unit");
        if (!u.reshardAfterBackward)
            drop(u, "reshard_after_backward False", "resharded after backward (FSDP1 always)");
        if (u.modules.size() > 1)
            drop(u, "a unit of " + std::to_string(u.modules.size()) + " modules",
                 "its first module alone wrapped (" + r.model->module(u.modules[0]).fqn +
                     "); the others join the enclosing unit");
        if (u.explicitForwardPrefetch || u.explicitBackwardPrefetch)
            drop(u, "explicit prefetch lists",
                 "backward_prefetch BACKWARD_PRE, forward_prefetch False for every unit");
        if (u.offload.enabled != r.units[0].offload.enabled)
            drop(u, std::string("offload ") + (u.offload.enabled ? "on" : "off"),
                 std::string("cpu_offload ") + (r.units[0].offload.enabled ? "on" : "off") +
                     " for every unit");
        const auto& ump = u.mixedPrecision;
        const bool sameMp =
            dmp ? (ump.paramDtype == dmp->paramDtype && ump.reduceDtype == dmp->reduceDtype)
                : (!ump.paramDtype && !ump.reduceDtype);
        if (!sameMp)
            drop(u, "its own mixed precision", "the plan's default mixed precision for every unit");
        if (ump.outputDtype)
            drop(u, "output_dtype " + std::string(dtypeName(*ump.outputDtype)),
                 "nothing (FSDP1's MixedPrecision has no output dtype)");
        if (!u.isRoot && u.activationCheckpointing != AcMode::None &&
            u.activationCheckpointing != AcMode::Full)
            drop(u,
                 std::string("activation_checkpointing ") + acModeName(u.activationCheckpointing),
                 "full checkpointing of its class (activation_checkpointing_classes)");
    }
    for (const auto& [k, units] : groups)
        out.push_back({{"units", units}, {"setting", k.first}, {"exported_as", k.second}});
    appendDroppedTrainingOptions(r, out);
    if (r.plan.gradientDivideFactor)
        out.push_back({{"units", {"every unit"}},
                       {"setting", "gradient_divide_factor"},
                       {"exported_as", "FSDP1's default division by the world size"}});
    return out;
}

nlohmann::json exportFsdp1(const ResolvedPlan& r) {
    const auto& f = r.plan.fsdp1;
    std::string strategy = f.shardingStrategy;
    if (r.plan.api == PlanApi::Fsdp2) {
        // An FSDP2 plan expressed as FSDP1: resharding of non-root units picks the strategy.
        bool anyKeep = false;
        for (const auto& u : r.units)
            if (!u.isRoot && u.reshard == Reshard::False) anyKeep = true;
        strategy = r.hsdp ? (anyKeep ? "_HYBRID_SHARD_ZERO2" : "HYBRID_SHARD")
                          : (anyKeep ? "SHARD_GRAD_OP" : "FULL_SHARD");
    }
    nlohmann::json kw;
    kw["sharding_strategy"] = strategy;
    kw["auto_wrap_policy"] = autoWrapPolicy(r);
    kw["backward_prefetch"] = r.plan.api == PlanApi::Fsdp1 ? f.backwardPrefetch : "BACKWARD_PRE";
    if (kw["backward_prefetch"] == "NONE") kw["backward_prefetch"] = nullptr;
    kw["forward_prefetch"] = r.plan.api == PlanApi::Fsdp1 ? f.forwardPrefetch : false;
    kw["limit_all_gathers"] = r.plan.api == PlanApi::Fsdp1 ? f.limitAllGathers : true;
    kw["use_orig_params"] = r.plan.api == PlanApi::Fsdp1 ? f.useOrigParams : true;
    kw["mixed_precision"] = mixedPrecisionKw(r);
    kw["cpu_offload"] = {{"offload_params", r.units[0].offload.enabled}};
    nlohmann::json ignored = nlohmann::json::array();
    for (ParamId p : r.ignoredParams)
        ignored.push_back(r.model->param(p).name);
    kw["ignored_states"] = ignored;
    return {{"format", "shardscope.export.fsdp1"},
            {"version", 1},
            {"plan", r.plan.name},
            {"device_mesh", mesh(r)},
            {"kwargs", kw},
            {"activation_checkpointing_classes", activationCheckpointingClasses(r)},
            // FSDP1 accumulates in the training loop: no_sync() on all but the last
            // micro-batch (samples/apply_fsdp1.py's micro_batch_context).
            {"gradient_accumulation",
             {{"micro_batches", r.plan.microBatches},
              {"sync_every_micro_batch", r.plan.syncEveryMicroBatch}}},
            {"dropped", droppedForFsdp1(r, strategy)}};
}

// Lightning's trainer arguments: accumulation, and precision for FSDPStrategy (FSDP2's
// mp_policy casts under ModelParallelStrategy, so its trainer runs "32-true").
nlohmann::json lightningTrainer(const ResolvedPlan& r, bool autocast) {
    const auto& d = r.plan.defaults.mixedPrecision;
    const char* precision = !autocast                                                 ? "32-true"
                            : d && d->paramDtype && *d->paramDtype == DType::BFloat16 ? "bf16-mixed"
                            : d && d->paramDtype && *d->paramDtype == DType::Float16  ? "16-mixed"
                                                                                      : "32-true";
    return {{"precision", precision}, {"accumulate_grad_batches", r.plan.microBatches}};
}

nlohmann::json exportLightning(const ResolvedPlan& r, bool fsdp1Strategy) {
    nlohmann::json j{
        {"format", "shardscope.export.lightning"}, {"version", 1}, {"plan", r.plan.name}};
    if (r.plan.api == PlanApi::Fsdp2 && !fsdp1Strategy) {
        // Lightning's FSDP2 strategy: ModelParallelStrategy over every rank as data parallel;
        // the LightningModule's configure_model applies the FSDP2 export as it is
        // (samples/apply_lightning.py), so nothing is dropped, and a callback sets gradient
        // sync and resharding per micro-batch as the plan says (Lightning itself reduces on
        // every micro-batch under this strategy).
        j["strategy"] = "ModelParallelStrategy";
        j["kwargs"] = {{"data_parallel_size", r.worldSize}, {"tensor_parallel_size", 1}};
        j["fsdp2"] = exportFsdp2(r);
        j["trainer"] = lightningTrainer(r, false);
        j["dropped"] = nlohmann::json::array();
        return j;
    }
    if (r.plan.api == PlanApi::Lightning) {
        const auto& o = r.plan.lightning;
        j["strategy"] = "DDPFullyShardedStrategy";
        // Removed from Lightning in 2.0 with its fairscale integration.
        j["requires"] =
            "pytorch_lightning 1.x with fairscale (Lightning 2.0 removed "
            "DDPFullyShardedStrategy; plan against FSDP1 or FSDP2 for Lightning 2)";
        j["kwargs"] = {{"cpu_offload", o.cpuOffload},
                       {"flatten_parameters", o.flattenParameters},
                       {"reshard_after_forward", o.reshardAfterForward},
                       {"fp32_reduce_scatter", o.fp32ReduceScatter},
                       {"compute_dtype", dt(o.computeDtype)},
                       {"bucket_cap_mb", o.bucketCapMb},
                       {"min_num_params", o.minNumParams},
                       {"move_grads_to_cpu", o.moveGradsToCpu.value_or(o.cpuOffload)},
                       {"state_dict_to_cpu", o.stateDictToCpu}};
        return j;
    }
    const nlohmann::json f1full = exportFsdp1(r);
    const nlohmann::json& f1 = f1full["kwargs"];
    nlohmann::json kw = f1;
    j["dropped"] = f1full["dropped"];
    kw["activation_checkpointing_policy"] = activationCheckpointingClasses(r);
    kw["cpu_offload"] = r.units[0].offload.enabled;
    if (r.hsdp) kw["device_mesh"] = {r.replicateSize, r.shardSize};
    j["strategy"] = "FSDPStrategy";
    j["kwargs"] = kw;
    j["trainer"] = lightningTrainer(r, true);
    return j;
}

}  // namespace

std::optional<std::string> exportRefusal(const ResolvedPlan& r, ExportFormat f) {
    if (f == ExportFormat::ShardScope || f == ExportFormat::Fsdp2) return std::nullopt;
    const auto& mp = r.plan.defaults.mixedPrecision;
    if (!mp || !mp->paramDtype || dtypeSize(*mp->paramDtype) >= 4) return std::nullopt;
    const std::vector<ModuleId> fp32 = r.model->keepFp32Modules();
    if (fp32.empty()) return std::nullopt;
    return "module \"" + r.model->module(fp32[0]).fqn +
           "\" computes in fp32 whatever the model's dtype, and FSDP1's and Lightning's "
           "one MixedPrecision would gather it in " +
           std::string(dtypeName(*mp->paramDtype)) +
           " (its own fp32 unit dropped): PyTorch fails in its forward. Export as "
           "fsdp2, or use the plans `recommend --fix api=fsdp1` makes, which keep fp32 "
           "parameters";
}

nlohmann::json exportPlan(const ResolvedPlan& r, ExportFormat f) {
    switch (f) {
        case ExportFormat::ShardScope:
            return planToJson(r.plan);
        case ExportFormat::Fsdp2:
            return exportFsdp2(r);
        case ExportFormat::Fsdp1:
            return exportFsdp1(r);
        case ExportFormat::Lightning:
            return exportLightning(r, false);
        case ExportFormat::LightningFsdp1:
            return exportLightning(r, true);
    }
    return nullptr;
}

}  // namespace shardscope
