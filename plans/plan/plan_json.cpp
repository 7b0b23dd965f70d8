// SPDX-License-Identifier: Apache-2.0
#include "plans/plan/plan_json.h"

#include <algorithm>

#include "plans/core/json_reader.h"
#include "plans/core/strings.h"

namespace shardscope {

const char* planApiName(PlanApi a) {
    switch (a) {
        case PlanApi::Fsdp2:
            return "fsdp2";
        case PlanApi::Fsdp1:
            return "fsdp1";
        case PlanApi::Lightning:
            return "lightning";
    }
    return "?";
}

const char* compileModeName(CompileMode m) {
    switch (m) {
        case CompileMode::None:
            return "false";
        case CompileMode::PerBlock:
            return "per_block";
        case CompileMode::Full:
            return "full";
    }
    return "?";
}

const char* acModeName(AcMode m) {
    switch (m) {
        case AcMode::None:
            return "none";
        case AcMode::Attention:
            return "attention";
        case AcMode::Full:
            return "full";
        case AcMode::SelectiveOp:
            return "selective_op";
    }
    return "?";
}

std::string AcSpec::toString() const {
    std::string s = acModeName(mode);
    if (mode == AcMode::Full && every > 1) s += " every " + std::to_string(every);
    if (mode == AcMode::SelectiveOp && !save.empty()) {
        s += " [";
        for (size_t i = 0; i < save.size(); ++i)
            s += (i ? "," : "") + save[i];
        s += "]";
    }
    return s;
}

const char* wrapPolicyName(WrapPolicySpec::Kind k) {
    switch (k) {
        case WrapPolicySpec::Kind::None:
            return "none";
        case WrapPolicySpec::Kind::Size:
            return "size";
        case WrapPolicySpec::Kind::ModuleClass:
            return "module_class";
        case WrapPolicySpec::Kind::NamePattern:
            return "name_pattern";
    }
    return "?";
}

std::string ReshardSetting::toString() const {
    switch (kind) {
        case Kind::Default:
            return "None";
        case Kind::Bool:
            return value ? "True" : "False";
        case Kind::Int:
            return std::to_string(k);
    }
    return "?";
}

namespace {

std::string pick(const JsonReader& r, std::initializer_list<const char*> choices) {
    const std::string s = r.asString();
    std::vector<std::string> names(choices.begin(), choices.end());
    for (const auto& c : names)
        if (s == c) return s;
    std::string list;
    for (const auto& c : names)
        list += (list.empty() ? "" : ", ") + std::string("\"") + c + "\"";
    r.fail("expected one of " + list + ", got \"" + s + "\"" + didYouMean(s, names));
}

std::optional<DType> optDType(const JsonReader& r, const char* key) {
    if (!r.hasNonNull(key)) return std::nullopt;
    const JsonReader v = r.at(key);
    const std::string s = v.asString();
    auto d = parseDType(s);
    if (!d) v.fail("unknown dtype \"" + s + "\"" + didYouMean(s, dtypeNames()));
    return d;
}

ReshardSetting readReshard(const JsonReader& r) {
    const auto& j = r.json();
    if (j.is_null()) return {};
    if (j.is_boolean()) return ReshardSetting::ofBool(j.get<bool>());
    if (j.is_number_integer() || j.is_number_unsigned()) {
        const int64_t k = r.asInt();
        if (k < 1) r.fail("an int reshard_after_forward must be >= 1, got " + std::to_string(k));
        return ReshardSetting::ofInt(k);
    }
    r.failExpected("bool or int");
}

nlohmann::json reshardJson(const ReshardSetting& s) {
    switch (s.kind) {
        case ReshardSetting::Kind::Default:
            return nullptr;
        case ReshardSetting::Kind::Bool:
            return s.value;
        case ReshardSetting::Kind::Int:
            return s.k;
    }
    return nullptr;
}

MixedPrecisionSpec readMp(const JsonReader& r) {
    if (r.isNull()) return {};
    r.allowOnly({"param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs"});
    MixedPrecisionSpec m;
    m.paramDtype = optDType(r, "param_dtype");
    m.reduceDtype = optDType(r, "reduce_dtype");
    m.outputDtype = optDType(r, "output_dtype");
    m.castForwardInputs = r.optBool("cast_forward_inputs").value_or(true);
    return m;
}

nlohmann::json dtypeJson(const std::optional<DType>& d) {
    return d ? nlohmann::json(std::string(dtypeName(*d))) : nlohmann::json(nullptr);
}

nlohmann::json mpJson(const MixedPrecisionSpec& m) {
    if (!m.paramDtype && !m.reduceDtype && !m.outputDtype && m.castForwardInputs) return nullptr;
    return {{"param_dtype", dtypeJson(m.paramDtype)},
            {"reduce_dtype", dtypeJson(m.reduceDtype)},
            {"output_dtype", dtypeJson(m.outputDtype)},
            {"cast_forward_inputs", m.castForwardInputs}};
}

OffloadSpec readOffload(const JsonReader& r) {
    if (r.isNull()) return {};
    r.allowOnly({"pin_memory"});
    return {true, r.optBool("pin_memory").value_or(true)};
}

nlohmann::json offloadJson(const OffloadSpec& o) {
    return o.enabled ? nlohmann::json{{"pin_memory", o.pinMemory}} : nlohmann::json(nullptr);
}

// "none" | "full" | "selective_op" | "attention" | {"mode": "full", "every": k} |
// {"mode": "selective_op", "save": [op, ...]}; "selective" (ShardScope's earlier word for
// "attention") is read as "attention" and the resolver warns.
AcSpec readAc(const JsonReader& r) {
    auto modeOf = [](const std::string& s) {
        return s == "full"           ? AcMode::Full
               : s == "selective_op" ? AcMode::SelectiveOp
               : s == "none"         ? AcMode::None
                                     : AcMode::Attention;
    };
    if (!r.json().is_object()) {
        const std::string s = pick(r, {"none", "full", "selective_op", "attention", "selective"});
        AcSpec a(modeOf(s));
        a.legacySelective = s == "selective";
        return a;
    }
    r.allowOnly({"mode", "every", "save"});
    AcSpec a(modeOf(pick(r.at("mode"), {"none", "full", "selective_op", "attention"})));
    if (r.has("every")) {
        if (a.mode != AcMode::Full)
            r.at("every").fail("\"every\" applies to mode \"full\" (checkpoint every k-th unit)");
        a.every = r.at("every").asIntAtLeast(1);
    }
    if (r.has("save")) {
        if (a.mode != AcMode::SelectiveOp)
            r.at("save").fail("\"save\" applies to mode \"selective_op\"");
        const JsonReader list = r.at("save");
        a.save = list.asStringList();
        if (a.save.empty())
            list.fail("a save list needs at least one op (omit it for torchtitan's preset)");
        for (size_t i = 0; i < a.save.size(); ++i)  // the ops apply_plan.py knows
            pick(list[i], {"mm", "addmm", "bmm", "sdpa", "reduce_scatter", "max"});
    }
    return a;
}

nlohmann::json acJson(const AcSpec& a) {
    if (a.legacySelective) return "selective";
    if (a.every == 1 && a.save.empty()) return acModeName(a.mode);
    nlohmann::json j{{"mode", acModeName(a.mode)}};
    if (a.every != 1) j["every"] = a.every;
    if (!a.save.empty()) j["save"] = a.save;
    return j;
}

// false | "per_block" | "full"
CompileMode readCompile(const JsonReader& r) {
    if (r.json().is_boolean()) {
        if (!r.asBool()) return CompileMode::None;
        r.fail(
            "expected false, \"per_block\" (torch.compile on each unit's module, as torchtitan "
            "does) or \"full\" (the whole model), got true");
    }
    const std::string s = pick(r, {"per_block", "full"});
    return s == "full" ? CompileMode::Full : CompileMode::PerBlock;
}

nlohmann::json compileJson(CompileMode m) {
    return m == CompileMode::None ? nlohmann::json(false) : nlohmann::json(compileModeName(m));
}

// false | {"recipe": "tensorwise" | "rowwise", "fsdp_float8_all_gather": bool,
// "precompute_scales": bool}: torchao's defaults where a field is absent.
Float8Spec readFloat8(const JsonReader& r) {
    Float8Spec f;
    if (r.json().is_boolean()) {
        if (r.asBool())
            r.fail(
                "expected false or an object such as {\"recipe\": \"tensorwise\", "
                "\"fsdp_float8_all_gather\": true, \"precompute_scales\": true}, got true");
        return f;
    }
    if (!r.json().is_object()) r.failExpected("false or an object");
    r.allowOnly({"recipe", "fsdp_float8_all_gather", "precompute_scales"});
    f.enabled = true;
    if (r.has("recipe")) f.recipe = pick(r.at("recipe"), {"tensorwise", "rowwise"});
    if (r.has("fsdp_float8_all_gather"))
        f.fsdpFloat8AllGather = r.getBool("fsdp_float8_all_gather");
    if (r.has("precompute_scales")) f.precomputeScales = r.getBool("precompute_scales");
    return f;
}

nlohmann::json float8Json(const Float8Spec& f) {
    if (!f.enabled) return false;
    return {{"recipe", f.recipe},
            {"fsdp_float8_all_gather", f.fsdpFloat8AllGather},
            {"precompute_scales", f.precomputeScales}};
}

void readSettings(const JsonReader& r, UnitSettings& s) {
    if (r.has("reshard_after_forward"))
        s.reshardAfterForward = readReshard(r.at("reshard_after_forward"));
    if (r.has("reshard_after_backward"))
        s.reshardAfterBackward = r.getBool("reshard_after_backward");
    if (r.has("activation_checkpointing"))
        s.activationCheckpointing = readAc(r.at("activation_checkpointing"));
    if (r.has("mixed_precision")) s.mixedPrecision = readMp(r.at("mixed_precision"));
    if (r.has("offload")) s.offload = readOffload(r.at("offload"));
    if (r.has("compile")) s.compile = readCompile(r.at("compile"));
    if (r.has("float8")) s.float8 = readFloat8(r.at("float8"));
}

void writeSettings(const UnitSettings& s, nlohmann::json& j) {
    if (s.reshardAfterForward) j["reshard_after_forward"] = reshardJson(*s.reshardAfterForward);
    if (s.reshardAfterBackward) j["reshard_after_backward"] = *s.reshardAfterBackward;
    if (s.activationCheckpointing)
        j["activation_checkpointing"] = acJson(*s.activationCheckpointing);
    if (s.mixedPrecision) j["mixed_precision"] = mpJson(*s.mixedPrecision);
    if (s.offload) j["offload"] = offloadJson(*s.offload);
    if (s.compile) j["compile"] = compileJson(*s.compile);
    if (s.float8) j["float8"] = float8Json(*s.float8);
}

WrapPolicySpec readWrap(const JsonReader& r) {
    WrapPolicySpec w;
    const std::string policy =
        pick(r.at("policy"), {"none", "size", "module_class", "name_pattern"});
    if (policy == "size") {
        r.allowOnly({"policy", "min_num_params", "force_leaf_classes", "exclude_wrap_classes"});
        w.kind = WrapPolicySpec::Kind::Size;
        if (r.has("min_num_params")) w.minNumParams = r.at("min_num_params").asIntAtLeast(0);
        if (r.has("force_leaf_classes"))
            w.forceLeafClasses = r.at("force_leaf_classes").asStringList();
        if (r.has("exclude_wrap_classes"))
            w.excludeWrapClasses = r.at("exclude_wrap_classes").asStringList();
    } else if (policy == "module_class") {
        r.allowOnly({"policy", "classes"});
        w.kind = WrapPolicySpec::Kind::ModuleClass;
        w.classes = r.at("classes").asStringList();
        if (w.classes.empty()) r.at("classes").fail("list at least one module class");
    } else if (policy == "name_pattern") {
        r.allowOnly({"policy", "patterns"});
        w.kind = WrapPolicySpec::Kind::NamePattern;
        w.patterns = r.at("patterns").asStringList();
        if (w.patterns.empty()) r.at("patterns").fail("list at least one pattern");
    } else {
        r.allowOnly({"policy"});
    }
    return w;
}

nlohmann::json wrapJson(const WrapPolicySpec& w) {
    nlohmann::json j{{"policy", wrapPolicyName(w.kind)}};
    switch (w.kind) {
        case WrapPolicySpec::Kind::Size:
            j["min_num_params"] = w.minNumParams;
            j["force_leaf_classes"] = w.forceLeafClasses;
            j["exclude_wrap_classes"] = w.excludeWrapClasses;
            break;
        case WrapPolicySpec::Kind::ModuleClass:
            j["classes"] = w.classes;
            break;
        case WrapPolicySpec::Kind::NamePattern:
            j["patterns"] = w.patterns;
            break;
        case WrapPolicySpec::Kind::None:
            break;
    }
    return j;
}

Plan parsePlan(const JsonReader& r) {
    r.checkFormat(kPlanFormat, kPlanVersion);
    r.allowOnly({"format", "version", "name", "api", "mesh", "wrap", "defaults", "units",
                 "gradient_accumulation", "gradient_divide_factor", "ignored_params", "training",
                 "fsdp1", "lightning", "notes"});
    Plan p;
    p.name = r.optString("name").value_or("");
    if (r.has("api")) {
        const std::string api = pick(r.at("api"), {"fsdp2", "fsdp1", "lightning"});
        p.api = api == "fsdp1"       ? PlanApi::Fsdp1
                : api == "lightning" ? PlanApi::Lightning
                                     : PlanApi::Fsdp2;
    }
    if (auto m = r.find("mesh")) {
        m->allowOnly({"shape", "dim_names"});
        const JsonReader shape = m->at("shape");
        for (size_t i = 0; i < shape.size(); ++i)
            p.meshShape.push_back(shape[i].asIntAtLeast(1));
        if (m->has("dim_names")) {
            p.meshDimNames = m->at("dim_names").asStringList();
            if (p.meshDimNames.size() != p.meshShape.size())
                m->at("dim_names")
                    .fail("expected " + std::to_string(p.meshShape.size()) +
                          " names, one per mesh dimension");
        }
        int64_t prod = 1;
        for (int64_t d : p.meshShape) {
            if (prod > (int64_t{1} << 40) / d) shape.fail("mesh has too many devices");
            prod *= d;
        }
    }
    if (auto w = r.find("wrap")) p.wrap = readWrap(*w);
    if (auto d = r.find("defaults")) {
        d->allowOnly({"reshard_after_forward", "reshard_after_backward", "activation_checkpointing",
                      "mixed_precision", "offload", "compile", "float8"});
        readSettings(*d, p.defaults);
    }
    if (auto us = r.find("units")) {
        for (size_t i = 0; i < us->size(); ++i) {
            const JsonReader u = (*us)[i];
            u.allowOnly({"name", "modules", "reshard_after_forward", "reshard_after_backward",
                         "activation_checkpointing", "mixed_precision", "offload", "compile",
                         "float8", "forward_prefetch", "backward_prefetch"});
            UnitSpec s;
            s.pointer = u.where();
            const JsonReader mods = u.at("modules");
            if (mods.json().is_string())
                s.modules.push_back(mods.asString());
            else
                s.modules = mods.asStringList();
            if (s.modules.empty()) mods.fail("a unit needs at least one module");
            s.name = u.optString("name").value_or("");
            readSettings(u, s.settings);
            if (u.has("forward_prefetch"))
                s.forwardPrefetch = u.at("forward_prefetch").asStringList();
            if (u.has("backward_prefetch"))
                s.backwardPrefetch = u.at("backward_prefetch").asStringList();
            p.units.push_back(std::move(s));
        }
    }
    if (auto g = r.find("gradient_accumulation")) {
        g->allowOnly({"micro_batches", "sync_every_micro_batch"});
        p.microBatches = g->at("micro_batches").asIntAtLeast(1);
        p.syncEveryMicroBatch = g->optBool("sync_every_micro_batch").value_or(false);
    }
    if (r.hasNonNull("gradient_divide_factor"))
        p.gradientDivideFactor = r.at("gradient_divide_factor").asPositiveNumber();
    if (r.has("ignored_params")) p.ignoredParams = r.at("ignored_params").asStringList();
    if (auto t = r.find("training")) {
        t->allowOnly({"micro_batch_size", "seq_len", "compile_loss"});
        if (t->has("micro_batch_size"))
            p.microBatchSize = t->at("micro_batch_size").asIntAtLeast(1);
        if (t->has("seq_len")) {
            p.seqLen = t->at("seq_len").asIntAtLeast(1);
            p.seqLenDefaulted = false;
        }
        if (t->has("compile_loss")) p.compileLoss = t->at("compile_loss").asBool();
    }
    if (auto f = r.find("fsdp1")) {
        if (p.api != PlanApi::Fsdp1)
            f->fail("FSDP1 options need \"api\": \"fsdp1\" (this plan's api is \"" +
                    std::string(planApiName(p.api)) + "\")");
        f->allowOnly({"sharding_strategy", "backward_prefetch", "forward_prefetch",
                      "limit_all_gathers", "use_orig_params"});
        if (f->has("sharding_strategy"))
            p.fsdp1.shardingStrategy = pick(
                f->at("sharding_strategy"),
                {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"});
        if (f->has("backward_prefetch"))
            p.fsdp1.backwardPrefetch =
                f->at("backward_prefetch").isNull()
                    ? "NONE"
                    : pick(f->at("backward_prefetch"), {"BACKWARD_PRE", "BACKWARD_POST", "NONE"});
        if (f->has("forward_prefetch")) p.fsdp1.forwardPrefetch = f->getBool("forward_prefetch");
        if (f->has("limit_all_gathers")) p.fsdp1.limitAllGathers = f->getBool("limit_all_gathers");
        if (f->has("use_orig_params")) p.fsdp1.useOrigParams = f->getBool("use_orig_params");
    }
    if (auto l = r.find("lightning")) {
        if (p.api != PlanApi::Lightning)
            l->fail("Lightning options need \"api\": \"lightning\" (this plan's api is \"" +
                    std::string(planApiName(p.api)) + "\")");
        l->allowOnly({"cpu_offload", "flatten_parameters", "reshard_after_forward",
                      "fp32_reduce_scatter", "compute_dtype", "bucket_cap_mb", "min_num_params",
                      "move_grads_to_cpu", "state_dict_to_cpu"});
        auto& o = p.lightning;
        if (l->has("cpu_offload")) o.cpuOffload = l->getBool("cpu_offload");
        if (l->has("flatten_parameters")) o.flattenParameters = l->getBool("flatten_parameters");
        if (l->has("reshard_after_forward"))
            o.reshardAfterForward = l->getBool("reshard_after_forward");
        if (l->has("fp32_reduce_scatter")) o.fp32ReduceScatter = l->getBool("fp32_reduce_scatter");
        o.computeDtype = optDType(*l, "compute_dtype");
        if (l->has("bucket_cap_mb")) {
            o.bucketCapMb = l->at("bucket_cap_mb").asNumber();
            if (o.bucketCapMb < 0) l->at("bucket_cap_mb").fail("must be >= 0");
        }
        if (l->has("min_num_params")) o.minNumParams = l->at("min_num_params").asIntAtLeast(0);
        o.moveGradsToCpu = l->optBool("move_grads_to_cpu");
        if (l->has("state_dict_to_cpu")) o.stateDictToCpu = l->getBool("state_dict_to_cpu");
        if (o.fp32ReduceScatter && !o.computeDtype)
            l->at("fp32_reduce_scatter")
                .fail(
                    "fp32_reduce_scatter requires mixed precision: set compute_dtype "
                    "(fairscale asserts mixed_precision)");
    }
    return p;
}

}  // namespace

Expected<Plan> planFromJson(const nlohmann::json& j, const std::string& file) {
    return catchJsonErrors<Plan>([&] { return parsePlan(JsonReader(j, file)); });
}

Expected<Plan> loadPlanFile(const std::string& path) {
    auto j = readJsonFile(path);
    if (!j) return Error{j.error()};
    return planFromJson(*j, path);
}

nlohmann::json planToJson(const Plan& p) {
    nlohmann::json j;
    j["format"] = kPlanFormat;
    j["version"] = kPlanVersion;
    j["name"] = p.name;
    j["api"] = planApiName(p.api);
    if (!p.meshShape.empty()) {
        j["mesh"]["shape"] = p.meshShape;
        if (!p.meshDimNames.empty()) j["mesh"]["dim_names"] = p.meshDimNames;
    }
    j["wrap"] = wrapJson(p.wrap);
    nlohmann::json d = nlohmann::json::object();
    writeSettings(p.defaults, d);
    j["defaults"] = d;
    nlohmann::json units = nlohmann::json::array();
    for (const auto& u : p.units) {
        nlohmann::json uj;
        if (!u.name.empty()) uj["name"] = u.name;
        uj["modules"] = u.modules;
        writeSettings(u.settings, uj);
        if (u.forwardPrefetch) uj["forward_prefetch"] = *u.forwardPrefetch;
        if (u.backwardPrefetch) uj["backward_prefetch"] = *u.backwardPrefetch;
        units.push_back(std::move(uj));
    }
    j["units"] = units;
    j["gradient_accumulation"] = {{"micro_batches", p.microBatches},
                                  {"sync_every_micro_batch", p.syncEveryMicroBatch}};
    j["gradient_divide_factor"] =
        p.gradientDivideFactor ? nlohmann::json(*p.gradientDivideFactor) : nlohmann::json(nullptr);
    j["ignored_params"] = p.ignoredParams;
    j["training"] = {{"micro_batch_size", p.microBatchSize}};
    if (!p.seqLenDefaulted) j["training"]["seq_len"] = p.seqLen;  // a default stays one
    if (p.compileLoss) j["training"]["compile_loss"] = true;
    if (p.api == PlanApi::Fsdp1)
        j["fsdp1"] = {{"sharding_strategy", p.fsdp1.shardingStrategy},
                      {"backward_prefetch", p.fsdp1.backwardPrefetch},
                      {"forward_prefetch", p.fsdp1.forwardPrefetch},
                      {"limit_all_gathers", p.fsdp1.limitAllGathers},
                      {"use_orig_params", p.fsdp1.useOrigParams}};
    if (p.api == PlanApi::Lightning) {
        const auto& o = p.lightning;
        j["lightning"] = {{"cpu_offload", o.cpuOffload},
                          {"flatten_parameters", o.flattenParameters},
                          {"reshard_after_forward", o.reshardAfterForward},
                          {"fp32_reduce_scatter", o.fp32ReduceScatter},
                          {"compute_dtype", dtypeJson(o.computeDtype)},
                          {"bucket_cap_mb", o.bucketCapMb},
                          {"min_num_params", o.minNumParams},
                          {"move_grads_to_cpu", o.moveGradsToCpu ? nlohmann::json(*o.moveGradsToCpu)
                                                                 : nlohmann::json(nullptr)},
                          {"state_dict_to_cpu", o.stateDictToCpu}};
    }
    return j;
}

}  // namespace shardscope
