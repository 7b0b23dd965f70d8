// SPDX-License-Identifier: Apache-2.0
#include "plans/plan/resolve.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "plans/core/strings.h"
#include "plans/plan/wrap_policy.h"

namespace shardscope {

std::string Problem::toString() const {
    return where + ": " + (severity == Severity::Error ? "error: " : "warning: ") + message;
}

bool ResolvedPlan::hasErrors() const {
    return errorCount() > 0;
}

size_t ResolvedPlan::errorCount() const {
    return static_cast<size_t>(
        std::count_if(problems.begin(), problems.end(),
                      [](const Problem& p) { return p.severity == Problem::Severity::Error; }));
}

std::vector<UnitId> ResolvedPlan::applicationOrder() const {
    // Bottom-up: a unit is sharded before any unit whose modules contain it. Reverse
    // pre-order of the first module achieves that, and sorting keeps it stable.
    std::vector<UnitId> order;
    for (size_t i = units.size(); i-- > 0;)
        order.emplace_back(static_cast<int32_t>(i));
    return order;
}

std::optional<UnitId> ResolvedPlan::findUnit(std::string_view name) const {
    for (size_t i = 0; i < units.size(); ++i)
        if (units[i].name == name || (units[i].isRoot && name == "<root>"))
            return UnitId(static_cast<int32_t>(i));
    return std::nullopt;
}

int64_t ResolvedPlan::totalShardedBytes() const {
    int64_t n = 0;
    for (const auto& u : units)
        n += u.shardedBytes;
    return n;
}

int64_t ResolvedPlan::maxUnshardedBytes() const {
    int64_t n = 0;
    for (const auto& u : units)
        n = std::max(n, u.unshardedBytes);
    return n;
}

namespace {

// The modules in post-order (children before their parent, siblings in order): the order in
// which forward work finishes, and FSDP1's _recursive_wrap wraps.
std::vector<int32_t> modulesPostOrder(const ModelGraph& g) {
    std::vector<int32_t> out;
    out.reserve(g.moduleCount());
    if (g.moduleCount() == 0) return out;
    std::vector<std::pair<int32_t, size_t>> stack{{0, 0}};
    while (!stack.empty()) {
        auto& [m, child] = stack.back();
        const auto& ch = g.modules()[static_cast<size_t>(m)].children;
        if (child < ch.size()) {
            const int32_t c = ch[child++].value;
            stack.push_back({c, 0});
            continue;
        }
        out.push_back(m);
        stack.pop_back();
    }
    return out;
}

// Each module's unit: the unit whose modules are its nearest ancestor-or-self (the root's
// unit for modules outside every other).
std::vector<int32_t> unitOfModules(const ModelGraph& g, const ResolvedPlan& r) {
    const size_t n = g.moduleCount();
    std::vector<int32_t> unitOf(n, 0), unitRoot(n, -1);
    for (size_t u = 0; u < r.units.size(); ++u)
        for (ModuleId m : r.units[u].modules)
            unitRoot[m.index()] = static_cast<int32_t>(u);
    for (size_t m = 1; m < n; ++m)  // pre-order: a parent comes before its children
        unitOf[m] = unitRoot[m] >= 0 ? unitRoot[m] : unitOf[g.modules()[m].parent.index()];
    if (n > 0 && unitRoot[0] >= 0) unitOf[0] = unitRoot[0];
    return unitOf;
}

int64_t ceilDiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

struct Resolver {
    const ModelGraph& g;
    const Plan& p;
    const ClusterSpec* cluster;
    ResolvedPlan r;

    void error(const std::string& where, const std::string& msg) {
        r.problems.push_back({Problem::Severity::Error, where, msg});
    }
    std::map<std::string, int64_t> acEveryCount;  // units seen per "every k" spec
    std::set<int32_t> float8Gathered;  // weights all-gathered in float8, by parameter index
    std::set<std::string> warnedLegacyAc;
    void warning(const std::string& where, const std::string& msg) {
        r.problems.push_back({Problem::Severity::Warning, where, msg});
    }
    std::string at(const std::string& pointer) const { return r.planFile + ":" + pointer; }
    std::vector<int32_t> postOrder;  // by module index: its position in a post-order walk
    int32_t postOrderOf(ModuleId m) {
        if (postOrder.empty()) {
            postOrder.assign(g.moduleCount(), 0);
            int32_t next = 0;
            for (int32_t mm : modulesPostOrder(g))
                postOrder[static_cast<size_t>(mm)] = next++;
        }
        return postOrder[m.index()];
    }

    std::string moduleLabel(ModuleId m) const {
        const auto& fqn = g.module(m).fqn;
        return fqn.empty() ? "<root>" : "\"" + fqn + "\"";
    }

    std::optional<ModuleId> lookupModule(const std::string& name, const std::string& where) {
        if (auto m = g.findModule(name)) return m;
        if (name == "<root>") return g.root();
        error(where, "unknown module \"" + name + "\"" + didYouMean(name, g.moduleNames()));
        return std::nullopt;
    }

    void resolveMesh() {
        const std::string meshPtr = at("/mesh/shape");
        const bool fsdp1 = p.api == PlanApi::Fsdp1;
        const std::string& strat = p.fsdp1.shardingStrategy;
        const bool hybrid = fsdp1 && (strat == "HYBRID_SHARD" || strat == "_HYBRID_SHARD_ZERO2");
        std::vector<int64_t> shape = p.meshShape;
        if (shape.empty() && cluster) {
            if (hybrid)
                shape = {cluster->nodes, cluster->node.devicesPerNode};
            else
                shape = {cluster->worldSize()};
        }
        if (shape.empty()) {
            error(at("/mesh"),
                  "no device mesh: give \"mesh\": {\"shape\": [N]} in the plan or a "
                  "cluster (--cluster) to take the world size from");
            shape = {1};
        }
        if (shape.size() > 2) {
            error(meshPtr, "a mesh must be 1D (FSDP) or 2D (HSDP: [replicate, shard]), got " +
                               std::to_string(shape.size()) + " dimensions");
            shape = {shape[0]};
        }
        // A million ranks is ten times the largest cluster built; past it a mesh is a typo
        // (and products of larger dimensions overflow).
        constexpr int64_t kMaxWorld = int64_t{1} << 20;
        int64_t world = 1;
        for (int64_t& d : shape) {
            if (d > kMaxWorld || world > kMaxWorld / std::max<int64_t>(1, d)) {
                error(meshPtr, "a mesh of more than " + std::to_string(kMaxWorld) +
                                   " ranks (1,048,576; the largest clusters have about "
                                   "100,000 GPUs): a typo?");
                shape = {1};
                world = 1;
                break;
            }
            world *= d;
        }
        r.worldSize = world;
        if (cluster && cluster->worldSize() != world) {
            std::string prod;
            for (int64_t d : shape)
                prod += (prod.empty() ? "" : "x") + std::to_string(d);
            error(meshPtr,
                  "world size " + std::to_string(cluster->worldSize()) + " of cluster \"" +
                      cluster->name + "\" does not equal the mesh " +
                      (shape.size() == 1 ? "size " + prod
                                         : "product " + prod + " = " + std::to_string(world)));
        }
        if (shape.size() == 2) {
            if (p.api == PlanApi::Lightning)
                error(meshPtr, "the Lightning fairscale strategy shards over one 1D group");
            if (fsdp1 && !hybrid)
                error(meshPtr,
                      "a 2D mesh under FSDP1 needs sharding_strategy HYBRID_SHARD or "
                      "_HYBRID_SHARD_ZERO2, not " +
                          strat);
            r.hsdp = true;
            r.replicateSize = shape[0];
            r.shardSize = shape[1];
        } else {
            if (hybrid)
                error(meshPtr, strat +
                                   " needs a 2D mesh [replicate, shard] or a cluster to "
                                   "shard within a node");
            r.shardSize = shape[0];
        }
        // PyTorch's FSDP1 runs NO_SHARD whenever its process group, the shard group, has one
        // rank (_init_core_state: "FSDP is switching to use `NO_SHARD` ... since the world
        // size is 1"), and all-reduces the gradients over that group.
        if (fsdp1 && strat != "NO_SHARD" && r.shardSize == 1) {
            if (r.hsdp && r.replicateSize > 1)
                warning(meshPtr,
                        strat +
                            " over a shard group of one rank: FSDP1 switches to NO_SHARD and "
                            "all-reduces the gradients over that group alone, so the " +
                            std::to_string(r.replicateSize) +
                            " replicas never synchronize them (pytorch/pytorch#154888); shard "
                            "over at least 2 ranks, or give sharding_strategy NO_SHARD over a 1D "
                            "mesh");
            else
                warning(meshPtr,
                        "FSDP1 over one rank runs NO_SHARD (PyTorch switches to it at world size "
                        "1); ShardScope models " +
                            strat +
                            " over one rank, which does the same work there (the parameters' "
                            "cast before each forward and backward, the gradients' cast after "
                            "backward, no collective): on an H200 it read that run's step 4 % "
                            "short and its peak allocated 0.2 % short");
        }
        if (fsdp1 && strat == "NO_SHARD") {
            r.noShard = true;
            r.replicateSize = world;
            r.shardSize = 1;
        }
        r.flatParams = fsdp1 || (p.api == PlanApi::Lightning && p.lightning.flattenParameters);
    }

    std::vector<int32_t> unitOfModule;  // by module index

    // Ignored parameters first: they are excluded from wrapping numel.
    void resolveIgnoredParams() {
        for (size_t i = 0; i < p.ignoredParams.size(); ++i) {
            const auto& n = p.ignoredParams[i];
            if (auto pid = g.findParam(n)) {
                r.ignoredParams.push_back(*pid);
            } else {
                std::vector<std::string> names;
                for (const auto& pi : g.params())
                    names.push_back(pi.name);
                error(at("/ignored_params/" + std::to_string(i)),
                      "unknown parameter \"" + n + "\"" + didYouMean(n, names));
            }
        }
    }

    // A unit's modules as its spec lists them (`base`: its pointer), each found, none a
    // container, listed twice or nested in another.
    std::vector<ModuleId> unitModules(const UnitSpec& s, const std::string& base) {
        std::vector<ModuleId> mods;
        for (size_t k = 0; k < s.modules.size(); ++k) {
            const std::string where = at(base + "/modules/" + std::to_string(k));
            auto m = lookupModule(s.modules[k], where);
            if (!m) continue;
            if (g.isContainer(*m)) {
                error(where, moduleLabel(*m) + " is a " + g.module(*m).cls +
                                 ", which has no forward and cannot be a unit; make its "
                                 "children units, or group some of them in one unit's "
                                 "\"modules\" list");
                continue;
            }
            if (std::find(mods.begin(), mods.end(), *m) != mods.end()) {
                error(where, moduleLabel(*m) + " is listed twice in this unit");
                continue;
            }
            bool nested = false;
            for (ModuleId o : mods)
                if (g.isAncestorOrSelf(o, *m) || g.isAncestorOrSelf(*m, o)) {
                    const bool outer = g.isAncestorOrSelf(*m, o);
                    error(where,
                          moduleLabel(outer ? *m : o) + " contains " + moduleLabel(outer ? o : *m) +
                              ", which this unit also lists; a unit's modules must not nest");
                    nested = true;
                }
            if (!nested) mods.push_back(*m);
        }
        return mods;
    }

    // Forward order: pre-order of each unit's first module; then each module's managing unit,
    // the nearest enclosing unit module (pre-order walk).
    void orderUnits(std::vector<ResolvedUnit>& units, const std::vector<const UnitSpec*>& specOf) {
        std::vector<size_t> order(units.size());
        for (size_t i = 0; i < order.size(); ++i)
            order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            return units[a].modules[0] < units[b].modules[0];
        });
        std::vector<const UnitSpec*> specSorted;
        for (size_t i : order) {
            r.units.push_back(std::move(units[i]));
            specSorted.push_back(specOf[i]);
        }
        specs = std::move(specSorted);

        // Module -> managing unit: the nearest enclosing unit module (pre-order walk).
        unitOfModule.assign(g.moduleCount(), -1);
        std::vector<int32_t> unitRootOf(g.moduleCount(), -1);
        for (size_t u = 0; u < r.units.size(); ++u)
            for (ModuleId m : r.units[u].modules)
                unitRootOf[m.index()] = static_cast<int32_t>(u);
        for (size_t m = 0; m < g.moduleCount(); ++m) {
            if (unitRootOf[m] >= 0)
                unitOfModule[m] = unitRootOf[m];
            else
                unitOfModule[m] = unitOfModule[g.modules()[m].parent.index()];
        }
    }

    void resolveUnits() {
        resolveIgnoredParams();
        ResolvedUnit root;
        root.modules = {g.root()};
        root.isRoot = true;
        root.pointer = at("/");
        std::vector<ResolvedUnit> units{root};
        std::unordered_map<int32_t, size_t> unitByModule{{0, 0}};

        // Policy units.
        WrapOptions wo;
        wo.policy = p.wrap;
        if (p.api == PlanApi::Lightning && wo.policy.kind == WrapPolicySpec::Kind::None) {
            // fairscale auto_wrap with default_auto_wrap_policy(min_num_params)
            wo.policy.kind = WrapPolicySpec::Kind::Size;
            wo.policy.minNumParams = p.lightning.minNumParams;
        }
        const bool mpOn = p.api == PlanApi::Lightning ? p.lightning.computeDtype.has_value()
                                                      : (p.defaults.mixedPrecision &&
                                                         p.defaults.mixedPrecision->paramDtype);
        wo.wrapBatchNormIndividually =
            p.api == PlanApi::Fsdp1 && mpOn && wo.policy.kind != WrapPolicySpec::Kind::None;
        wo.ignoredParams = r.ignoredParams;
        auto wrapped = applyWrapPolicy(g, wo);
        if (!wrapped) {
            error(at("/wrap/patterns"), wrapped.error());
        } else {
            for (ModuleId m : wrapped->wrapped) {
                ResolvedUnit u;
                u.modules = {m};
                u.name = g.module(m).fqn;
                u.fromPolicy = true;
                u.pointer = at("/wrap");
                u.batchNormRule =
                    std::find(wrapped->batchNormUnits.begin(), wrapped->batchNormUnits.end(), m) !=
                    wrapped->batchNormUnits.end();
                unitByModule[m.value] = units.size();
                units.push_back(std::move(u));
            }
        }

        // Explicit units: override a policy unit or the root when they name exactly its
        // module, else add a unit.
        std::vector<const UnitSpec*> specOf(units.size(), nullptr);
        for (size_t i = 0; i < p.units.size(); ++i) {
            const UnitSpec& s = p.units[i];
            const std::string base = "/units/" + std::to_string(i);
            const std::vector<ModuleId> mods = unitModules(s, base);
            if (mods.empty()) continue;
            if (mods.size() > 1 && p.api != PlanApi::Fsdp2)
                error(at(base + "/modules"),
                      "a unit of several modules is an FSDP2 feature (fully_shard([a, b])); "
                      "FSDP1 and fairscale wrap one module per unit");
            if (mods.size() == 1 && unitByModule.count(mods[0].value)) {
                const size_t idx = unitByModule[mods[0].value];
                if (specOf[idx]) {
                    error(at(base + "/modules/0"), moduleLabel(mods[0]) + " is already a unit (" +
                                                       specOf[idx]->pointer + ")");
                    continue;
                }
                specOf[idx] = &s;
                units[idx].pointer = at(base);
                continue;
            }
            bool clash = false;
            for (ModuleId m : mods)
                if (unitByModule.count(m.value)) {
                    const auto& other = units[unitByModule[m.value]];
                    error(at(base + "/modules"),
                          moduleLabel(m) + " is already in unit " + other.displayName() +
                              (other.fromPolicy && !specOf[unitByModule[m.value]]
                                   ? " (chosen by the wrap policy)"
                                   : ""));
                    clash = true;
                }
            if (clash) continue;
            ResolvedUnit u;
            u.modules = mods;
            u.pointer = at(base);
            for (ModuleId m : mods)
                unitByModule[m.value] = units.size();
            units.push_back(std::move(u));
            specOf.push_back(&s);
        }
        for (size_t i = 0; i < units.size(); ++i) {
            auto& u = units[i];
            if (specOf[i] && !specOf[i]->name.empty())
                u.name = specOf[i]->name;
            else if (!u.isRoot)
                u.name = g.module(u.modules[0]).fqn;
        }
        // A module may not be the unit of two... and unit names must be unique.
        {
            std::unordered_map<std::string, size_t> seen;
            for (size_t i = 0; i < units.size(); ++i)
                if (!seen.emplace(units[i].name, i).second)
                    error(units[i].pointer, "unit name \"" + units[i].name + "\" is used twice");
        }

        orderUnits(units, specOf);
    }

    std::vector<const UnitSpec*> specs;  // by resolved unit index

    void assignParams() {
        r.unitOfParam.assign(g.paramCount(), UnitId());
        std::vector<char> ignored(g.paramCount(), 0);
        for (ParamId pid : r.ignoredParams)
            ignored[pid.index()] = 1;
        for (size_t i = 0; i < g.paramCount(); ++i) {
            const ParamId pid(static_cast<int32_t>(i));
            if (ignored[i]) continue;
            const auto& info = g.param(pid);
            int32_t unit = unitOfModule[info.owners[0].module.index()];
            bool shared = false;
            for (const auto& o : info.owners)
                if (unitOfModule[o.module.index()] != unit) shared = true;
            if (shared) {
                if (p.api == PlanApi::Fsdp2) {
                    std::string owners;
                    for (const auto& o : info.owners)
                        owners += (owners.empty() ? "" : ", ") + moduleLabel(o.module) + " (unit " +
                                  r.units[unitOfModule[o.module.index()]].displayName() + ")";
                    error(at("/units"), "parameter \"" + info.name + "\" is shared by " + owners +
                                            "; FSDP2 cannot shard one parameter in two units: "
                                            "group the modules in one unit, e.g. \"modules\": [" +
                                            "\"" + g.module(info.owners[0].module).fqn + "\", \"" +
                                            g.module(info.owners[1].module).fqn + "\"]");
                }
                if (p.api == PlanApi::Lightning) {
                    // Lightning's fairscale strategy: the lowest unit containing every owner
                    // (fairscale is not installed here to check what it does).
                    unit = unitOfModule[g.ownersLca(pid).index()];
                } else if (p.api == PlanApi::Fsdp1) {
                    // FSDP1's _recursive_wrap wraps in post-order (children first, siblings in
                    // order) and a parameter belongs to the first FSDP instance that flattens
                    // it: the owner's unit wrapped first (GPT-2's tied wte/lm_head weight goes
                    // to a wte unit, not to the root).
                    auto wrapPos = [&](int32_t u) { return postOrderOf(r.units[u].modules[0]); };
                    for (const auto& o : info.owners) {
                        const int32_t ou = unitOfModule[o.module.index()];
                        if (wrapPos(ou) < wrapPos(unit)) unit = ou;
                    }
                    // An owner outside that unit's modules runs its forward while the unit is
                    // sharded: it sees the shard (use_orig_params' sharded views) and fails.
                    const ModuleId top = r.units[unit].modules[0];
                    for (const auto& o : info.owners)
                        if (!g.isAncestorOrSelf(top, o.module))
                            error(at("/wrap"),
                                  "parameter \"" + info.name + "\" is shared by " +
                                      moduleLabel(info.owners[0].module) + " and " +
                                      moduleLabel(o.module) + "; FSDP1 manages it in unit " +
                                      r.units[unit].displayName() + " (the first wrapped), and " +
                                      moduleLabel(o.module) + " in unit " +
                                      r.units[unitOfModule[o.module.index()]].displayName() +
                                      " uses it while that unit is sharded: the job fails with a "
                                      "size mismatch. Keep the sharing modules in one unit (do "
                                      "not wrap " +
                                      moduleLabel(top) +
                                      " on its own), or let "
                                      "the unit enclosing both hold them");
                }
            }
            r.unitOfParam[i] = UnitId(unit);
            r.units[unit].params.push_back(pid);
        }
    }

    // torch.compile and torchao's float8 per unit, and the bad combinations refused naming
    // the field: float8 on a device without fp8 tensor cores, float8 all-gather outside
    // FSDP2 or with rowwise scaling (torchao's Float8LinearConfig asserts it), precomputed
    // scales without float8 all-gather. The layers float8 converts are torchtitan's: every
    // nn.Linear whose dimensions are multiples of 16 (the fp8 GEMM's requirement), the output
    // head (lm_head, output) excepted.
    void resolveCompileAndFloat8() {
        const bool fsdp2 = p.api == PlanApi::Fsdp2;
        std::set<std::string> reported;
        for (size_t i = 0; i < r.units.size(); ++i) {
            auto& u = r.units[i];
            const UnitSpec* s = specs[i];
            auto own = [&](auto member) { return s && (s->settings.*member).has_value(); };
            auto pick = [&](auto member) {
                return own(member) ? s->settings.*member : p.defaults.*member;
            };
            const std::string base = own(&UnitSettings::float8) ? s->pointer : at("/defaults");
            u.compile = pick(&UnitSettings::compile).value_or(CompileMode::None);
            u.float8 = pick(&UnitSettings::float8).value_or(Float8Spec{});
            if (!u.float8.enabled) continue;
            const std::string where = base + "/float8";
            auto once = [&](const std::string& key, const std::string& msg) {
                if (reported.insert(where + key).second) error(where + key, msg);
            };
            if (cluster && !cluster->device.isHost() &&
                cluster->device.peakFlops.count(DType::Float8E4M3) == 0)
                once("", "float8 training needs fp8 tensor cores, and " + cluster->device.name +
                             " has none (its peak_flops lists no float8_e4m3fn: A100 and "
                             "earlier have none; H100, H200 and B200 do)");
            if (u.float8.fsdpFloat8AllGather && !fsdp2)
                once("/fsdp_float8_all_gather",
                     "float8 all-gather is an FSDP2 feature (torchao's "
                     "WeightWithDynamicFloat8CastTensor hooks fully_shard's all-gather); "
                     "FSDP1 and Lightning gather the weights in their param dtype");
            if (u.float8.fsdpFloat8AllGather && u.float8.recipe != "tensorwise")
                once("/fsdp_float8_all_gather",
                     "float8 all-gather needs the tensorwise recipe: torchao refuses it with " +
                         u.float8.recipe +
                         " scaling (\"enable_fsdp_float8_all_gather only "
                         "supports tensorwise scaling granularity\")");
            if (u.float8.precomputeScales && !u.float8.fsdpFloat8AllGather)
                once("/precompute_scales",
                     "precompute_float8_dynamic_scale_for_fsdp computes the scales of the "
                     "float8 all-gather: set \"fsdp_float8_all_gather\": true, or drop "
                     "\"precompute_scales\"");
        }
        // torch.compile is exported and applied (samples/apply_plan.py). The simulator
        // prices compiled decoder layers from the partitioner's and Inductor's rules where
        // the model's layers have them; what it cannot price compiled is said once.
        for (size_t ui = 0; ui < r.units.size(); ++ui) {
            if (r.units[ui].compile == CompileMode::None) continue;
            bool saved = false, fused = false;
            for (size_t m = 0; m < g.moduleCount(); ++m) {
                const ModuleCost::Compiled& k = g.modules()[m].cost.compiled;
                saved = saved || k.known();
                fused = fused || k.fwdMemKernels > 0;
            }
            if (!saved)
                warning(at("/defaults/compile"),
                        "no compiled rule for this model's layers (the dense layers of Llama, "
                        "Mistral, Qwen2, Qwen3, OLMo-1/2/3, Phi-3, Gemma, GPT-2, Falcon-40B, "
                        "Seed-OSS, Granite, SmolLM3 and EXAONE-4 have one): their saved "
                        "activations and kernels are priced as eager PyTorch's");
            else if (!fused)
                warning(at("/defaults/compile"),
                        "compiled layers save what AOT autograd's partitioner keeps, but "
                        "Inductor's fusion of this family's layers is not modelled: "
                        "their memory-bound kernels are priced as eager PyTorch's");
            break;
        }
        for (size_t m = 0; m < g.moduleCount(); ++m) {
            const ModuleNode& mod = g.modules()[m];
            if (!g.isInstance(ModuleId(static_cast<int32_t>(m)), "Linear")) continue;
            const int32_t unit = unitOfModule.empty() ? 0 : unitOfModule[m];
            if (unit < 0 || !r.units[static_cast<size_t>(unit)].float8.enabled) continue;
            if (mod.name == "lm_head" || mod.name == "output") continue;
            bool fits = false;
            for (ParamId pid : mod.params) {
                const ParamInfo& w = g.param(pid);
                if (w.shape.size() == 2 && w.name.size() >= 6 &&
                    w.name.compare(w.name.size() - 6, 6, "weight") == 0)
                    fits = w.shape[0] % 16 == 0 && w.shape[1] % 16 == 0;
            }
            if (!fits) continue;
            auto& u = r.units[static_cast<size_t>(unit)];
            u.float8Linears.push_back(ModuleId(static_cast<int32_t>(m)));
            for (ParamId pid : mod.params) {
                const ParamInfo& w = g.param(pid);
                if (w.shape.size() != 2) continue;  // the bias stays in its dtype
                u.float8WeightNumel += w.numel;
                if (u.float8.fsdpFloat8AllGather) float8Gathered.insert(pid.index());
            }
        }
    }

    // Effective per-unit settings: unit overrides, else plan defaults, else API defaults.
    void resolveSettings() {
        const bool fsdp1 = p.api == PlanApi::Fsdp1;
        const bool lightning = p.api == PlanApi::Lightning;
        for (size_t i = 0; i < r.units.size(); ++i) {
            auto& u = r.units[i];
            const UnitSpec* s = specs[i];
            const std::string where = s ? s->pointer : u.pointer;
            auto pick = [&](auto member) {
                if (s && (s->settings.*member)) return s->settings.*member;
                return p.defaults.*member;
            };
            u.reshardDeclared = pick(&UnitSettings::reshardAfterForward).value_or(ReshardSetting{});
            u.reshardAfterBackward = pick(&UnitSettings::reshardAfterBackward).value_or(true);
            // Plan defaults checkpoint every unit but the root (torchtitan never checkpoints
            // the whole model around its blocks); the root's own unit entry may ask for it.
            const bool ownAc = s && s->settings.activationCheckpointing;
            const AcSpec ac = ownAc || !u.isRoot
                                  ? pick(&UnitSettings::activationCheckpointing).value_or(AcSpec{})
                                  : AcSpec{};
            u.activationCheckpointing = ac.mode;
            u.acSave = ac.save;
            if (ac.every > 1) {
                // {"mode": "full", "every": k}: the k-th, 2k-th, ... unit given this spec, in
                // forward order (torchtitan's ac_freq counts blocks from 1 the same way).
                const int64_t n = ++acEveryCount[ownAc ? where : std::string("/defaults")];
                if (n % ac.every != 0) u.activationCheckpointing = AcMode::None;
            }
            if (ac.legacySelective && warnedLegacyAc.insert(ownAc ? where : "/defaults").second)
                warning(ownAc ? where + "/activation_checkpointing"
                              : at("/defaults/activation_checkpointing"),
                        "\"selective\" is read as \"attention\" (recompute attention's core "
                        "only, ShardScope's earlier meaning); write \"attention\" to keep it, or "
                        "\"selective_op\" for torchtitan's op-level selective checkpointing "
                        "(keeps matmul and attention outputs, recomputes the rest)");
            u.offload = pick(&UnitSettings::offload).value_or(OffloadSpec{});
            MixedPrecisionSpec mp =
                pick(&UnitSettings::mixedPrecision).value_or(MixedPrecisionSpec{});
            if (lightning) {
                mp.paramDtype = p.lightning.computeDtype;
                mp.reduceDtype = p.lightning.fp32ReduceScatter ? std::optional(DType::Float32)
                                                               : p.lightning.computeDtype;
                u.offload = OffloadSpec{p.lightning.cpuOffload, true};
            }
            if (u.batchNormRule)
                mp = MixedPrecisionSpec{};  // FSDP1 runs BatchNorm in full precision

            // reshard_after_forward
            const ReshardSetting& d = u.reshardDeclared;
            if (fsdp1 || lightning) {
                if (d.kind == ReshardSetting::Kind::Int)
                    error(where,
                          "an int reshard_after_forward is an FSDP2 feature; FSDP1 "
                          "chooses resharding through sharding_strategy");
                bool reshard;
                if (lightning) {
                    reshard = p.lightning.reshardAfterForward;
                } else {
                    const auto& st = p.fsdp1.shardingStrategy;
                    reshard = st == "FULL_SHARD" || st == "HYBRID_SHARD";
                }
                if (d.kind == ReshardSetting::Kind::Bool) reshard = d.value;
                // FSDP1 (FULL_SHARD) and fairscale keep the root unsharded after forward:
                // backward needs it at once.
                if (u.isRoot) reshard = false;
                u.reshard = reshard ? Reshard::True : Reshard::False;
            } else if (d.kind == ReshardSetting::Kind::Default) {
                u.reshard = u.isRoot ? Reshard::False : Reshard::True;
            } else if (d.kind == ReshardSetting::Kind::Bool) {
                u.reshard = d.value ? Reshard::True : Reshard::False;
            } else {
                const int64_t k = d.k, S = r.shardSize;
                if (k < 1 || k > S || S % k != 0) {
                    error(where, "reshard_after_forward=" + std::to_string(k) +
                                     " must divide the shard size " + std::to_string(S) +
                                     " (the post-forward group is mesh.view(-1, k))");
                    u.reshard = Reshard::True;
                } else if (k == 1) {
                    u.reshard = Reshard::False;  // as PyTorch: 1 behaves as False
                } else if (k == S) {
                    u.reshard = Reshard::True;  // the shard size behaves as True
                } else {
                    u.reshard = Reshard::Int;
                    u.reshardK = k;
                }
            }
            if (r.noShard) u.reshard = Reshard::False;

            // Mixed precision as MixedPrecisionPolicy normalises it per parameter; a unit's
            // all-gather dtype is its param_dtype, or the parameters' own dtype: its trainable
            // parameters' (FSDP2's orig_dtype), frozen ones (Ernie's fp32 correction bias)
            // aside when it has trainable ones.
            DType orig = DType::Float32;
            bool first = true, mixedDtypes = false, mixedTrainable = false;
            std::optional<DType> trainable;
            for (ParamId pid : u.params) {
                const ParamInfo& info = g.param(pid);
                if (first)
                    orig = info.dtype;
                else if (info.dtype != orig)
                    mixedDtypes = true;
                first = false;
                if (!info.requiresGrad) continue;
                if (trainable && *trainable != info.dtype) mixedTrainable = true;
                if (!trainable) trainable = info.dtype;
            }
            if (trainable) orig = *trainable;
            if (mp.paramDtype && (*mp.paramDtype == orig || !isFloating(orig)))
                mp.paramDtype.reset();
            if (mp.reduceDtype && mp.paramDtype && *mp.reduceDtype == *mp.paramDtype)
                mp.reduceDtype.reset();
            if (mp.reduceDtype && !mp.paramDtype && *mp.reduceDtype == orig) mp.reduceDtype.reset();
            u.mixedPrecision = mp;
            u.allGatherDtype = mp.paramDtype.value_or(orig);
            u.reduceDtype = mp.reduceDtype.value_or(u.allGatherDtype);
            if (mixedDtypes && r.flatParams)
                error(where, "unit " + u.displayName() +
                                 " mixes parameter dtypes; an FSDP1 "
                                 "FlatParameter needs one dtype");
            else if (mixedTrainable)
                error(where, "unit " + u.displayName() +
                                 " mixes the dtypes of its trainable parameters, which FSDP2 "
                                 "refuses (\"FSDP expects uniform original parameter dtype\"): "
                                 "give the parameters of another dtype units of their own");
        }
    }

    // The per-rank trainable tensors the device optimizer steps, in unit order
    // (ForeachShape).
    std::vector<int64_t> foreachNumels;

    void computeSizes() {
        const int64_t N = std::max<int64_t>(1, r.shardSize);
        const bool fsdp1 = p.api == PlanApi::Fsdp1;
        for (auto& u : r.units) {
            int64_t flatTotal = 0;
            const auto stepped = [&](const ParamInfo& info, int64_t perRank) {
                if (info.requiresGrad && !u.offload.enabled && perRank > 0)
                    foreachNumels.push_back(perRank);
            };
            for (ParamId pid : u.params) {
                const auto& info = g.param(pid);
                u.numel += info.numel;
                if (!info.requiresGrad) u.frozenNumel += info.numel;
                u.paramBytes += info.bytes();
                const int64_t osz = dtypeSize(info.dtype);
                // torchao's float8 all-gather sends a converted weight in float8 (FSDP2
                // gathers the unit in one uint8 buffer when its dtypes differ).
                const DType ag = float8Gathered.count(pid.index()) ? DType::Float8E4M3
                                 : u.mixedPrecision.paramDtype && isFloating(info.dtype)
                                     ? *u.mixedPrecision.paramDtype
                                     : info.dtype;
                if (r.flatParams && fsdp1) {
                    if (p.fsdp1.useOrigParams) {
                        const int64_t align = std::max<int64_t>(1, 16 / osz);
                        flatTotal += (align - flatTotal % align) % align;
                    }
                    flatTotal += info.numel;
                } else if (r.flatParams) {
                    flatTotal += info.numel;  // fairscale: flatten without alignment
                } else if (p.api == PlanApi::Lightning) {
                    // fairscale without flattening pads each parameter to a multiple of N.
                    const int64_t c = ceilDiv(info.numel, N);
                    stepped(info, c);
                    u.shardedNumel += c;
                    u.shardedBytes += c * osz;
                    if (info.requiresGrad) {
                        u.trainableShardedBytes += c * osz;
                        u.largestShardBytes = std::max(u.largestShardBytes, c * osz);
                    }
                    u.unshardedBytes += N * c * dtypeSize(ag);
                } else {
                    if (info.shape.empty()) {
                        error(specPointer(u), "parameter \"" + info.name +
                                                  "\" is a scalar; fully_shard cannot shard 0-dim "
                                                  "parameters: list it in \"ignored_params\"");
                        continue;
                    }
                    const int64_t d0 = info.shape[0];
                    const int64_t rest = d0 == 0 ? 0 : info.numel / d0;
                    const int64_t c = ceilDiv(d0, N);
                    stepped(info, c * rest);
                    u.shardedNumel += c * rest;
                    u.shardedBytes += c * rest * osz;
                    if (info.requiresGrad) {
                        u.trainableShardedBytes += c * rest * osz;
                        u.largestShardBytes = std::max(u.largestShardBytes, c * rest * osz);
                    }
                    u.unshardedBytes += N * c * rest * dtypeSize(ag);
                    // int reshard: the kept copy is the original dim 0 chunked over the
                    // k-rank post-forward group (FSDPParam.sharded_post_forward_size in
                    // PyTorch 2.11), not 1/k of the padded all-gather output.
                    if (u.reshard == Reshard::Int)
                        u.postForwardBytes += ceilDiv(d0, u.reshardK) * rest * dtypeSize(ag);
                }
            }
            if (r.flatParams) {
                if (fsdp1 && p.fsdp1.useOrigParams && flatTotal % N != 0)
                    flatTotal += N - flatTotal % N;
                const int64_t shard = ceilDiv(flatTotal, N);
                const DType orig = u.params.empty() ? DType::Float32 : g.param(u.params[0]).dtype;
                u.shardedNumel = shard;
                u.shardedBytes = shard * dtypeSize(orig);
                u.unshardedBytes = N * shard * dtypeSize(u.allGatherDtype);
                // One FlatParameter: trainable when any of its parameters is.
                if (u.frozenNumel < u.numel) {
                    u.trainableShardedBytes = u.largestShardBytes = u.shardedBytes;
                    if (!u.offload.enabled && shard > 0) foreachNumels.push_back(shard);
                }
            }
        }
        ForeachShape& f = r.optimizerForeach;
        f = {};
        for (const auto& u : r.units)
            if (!u.offload.enabled) f.bytes += u.trainableShardedBytes;
        f.tensors = static_cast<int64_t>(foreachNumels.size());
        for (int i = 0; i < 4; ++i)
            f.kernels[i] = foreachKernels(foreachNumels, kForeachTensorLimits[i]);
    }

    std::string specPointer(const ResolvedUnit& u) const { return u.pointer; }

    void resolvePrefetch() {
        for (size_t i = 0; i < r.units.size(); ++i) {
            const UnitSpec* s = specs[i];
            if (!s) continue;
            auto resolveList = [&](const std::vector<std::string>& names, const char* field,
                                   std::vector<UnitId>& out) {
                if (p.api != PlanApi::Fsdp2) {
                    error(s->pointer + "/" + field,
                          "explicit prefetch lists are an FSDP2 feature; under FSDP1 use "
                          "fsdp1.forward_prefetch and fsdp1.backward_prefetch");
                    return;
                }
                for (size_t k = 0; k < names.size(); ++k) {
                    const std::string where = s->pointer + "/" + field + "/" + std::to_string(k);
                    auto id = r.findUnit(names[k]);
                    if (!id) {
                        std::vector<std::string> unitNames;  // only on error: suggestions
                        for (const auto& un : r.units)
                            unitNames.push_back(un.name);
                        std::string hint = didYouMean(names[k], unitNames);
                        if (auto m = g.findModule(names[k]))
                            hint = " (it is a module inside unit " +
                                   r.units[unitOfModule[m->index()]].displayName() +
                                   "; make it a unit to prefetch it)";
                        error(where, "prefetch target \"" + names[k] + "\" is not a unit" + hint);
                        continue;
                    }
                    if (id->index() == i) error(where, "a unit cannot prefetch itself");
                    out.push_back(*id);
                }
            };
            if (s->forwardPrefetch) {
                r.units[i].explicitForwardPrefetch = true;
                resolveList(*s->forwardPrefetch, "forward_prefetch", r.units[i].forwardPrefetch);
            }
            if (s->backwardPrefetch) {
                r.units[i].explicitBackwardPrefetch = true;
                resolveList(*s->backwardPrefetch, "backward_prefetch", r.units[i].backwardPrefetch);
            }
        }
    }

    // The training shape against the model and the simulator's bounds.
    void checkTraining() {
        const int64_t b = p.microBatchSize, s = p.seqLen, mb = p.microBatches;
        if (g.maxPositions > 0 && s > g.maxPositions) {
            const std::string what = "seq_len " + std::to_string(s) + " exceeds the model's " +
                                     std::to_string(g.maxPositions) + " positions";
            if (g.learnedPositions && p.seqLenDefaulted)
                warning(at("/training"), "the plan gives no seq_len, and the default " + what +
                                             " (a learned position table): give training.seq_len");
            else if (g.learnedPositions)
                error(at("/training/seq_len"), what + " (" + g.positionLimit + ")");
            else
                warning(at("/training/seq_len"),
                        what +
                            " (max_position_embeddings): the model was not trained that "
                            "long; set rope_scaling in the config if the run extends it");
        }
        if (b > 0 && s > 0 && b > (int64_t{1} << 40) / s)
            error(at("/training"), "micro_batch_size x seq_len = " + std::to_string(b) + " x " +
                                       std::to_string(s) + " tokens per micro-batch: more than " +
                                       "2^40, not a training step");
        // The step program holds about 16 ops per unit and micro-batch.
        constexpr int64_t kMaxOps = int64_t{8} << 20;
        const int64_t units = std::max<int64_t>(1, static_cast<int64_t>(r.units.size()));
        if (mb > kMaxOps / (16 * units))
            error(at("/training/micro_batches"),
                  std::to_string(mb) + " micro-batches of " + std::to_string(units) +
                      " units make a step program of about " +
                      formatCount(mb > INT64_MAX / (16 * units) ? INT64_MAX : mb * 16 * units) +
                      " ops, more than the simulator's " + formatCount(kMaxOps) +
                      "; each micro-batch past the first few costs the same, so simulate "
                      "fewer and scale (recommend does this)");
    }

    // Modules that compute in fp32 whatever the model's dtype (ModuleNode::keepFp32) need
    // their parameters gathered in fp32: under FSDP2 a unit of their own with param_dtype
    // float32; FSDP1 and fairscale give every unit one MixedPrecision.
    void checkKeepFp32() {
        std::string first, unit, dtype;
        int32_t count = 0;
        // FSDP1 and fairscale: any unit below fp32 means every unit's MixedPrecision is.
        const bool oneLower = p.api != PlanApi::Fsdp2 &&
                              std::any_of(r.units.begin(), r.units.end(), [](const auto& x) {
                                  return dtypeSize(x.allGatherDtype) < 4;
                              });
        for (const ModuleId m : g.keepFp32Modules()) {
            const ModuleNode& mod = g.module(m);
            for (ParamId pid : mod.params) {
                const UnitId owner = r.unitOfParam[pid.index()];
                if (!owner.valid() || !isFloating(g.param(pid).dtype)) continue;
                const ResolvedUnit& u = r.units[owner.index()];
                if (dtypeSize(u.allGatherDtype) >= 4 && !oneLower) continue;
                if (count++ == 0) {
                    first = mod.fqn;
                    unit = u.displayName();
                    dtype = dtypeName(u.allGatherDtype);
                }
                break;
            }
        }
        if (count == 0) return;
        const std::string more =
            count > 1 ? " (and " + std::to_string(count - 1) + " more such modules)" : "";
        const std::string why =
            "module \"" + first + "\"" + more +
            " computes in fp32 whatever the model's dtype (transformers keeps it fp32 and runs "
            "it on an fp32 input with autocast off), so its weight must reach it in fp32; ";
        if (p.api != PlanApi::Fsdp2) {
            error(at("/api"), why +
                                  "FSDP1 and fairscale give every unit the plan's one "
                                  "MixedPrecision (FSDP1's _module_classes_to_ignore matches "
                                  "whole classes, and this is an nn.Linear). Use api fsdp2 with "
                                  "each such module a unit of its own in fp32, or no param_dtype "
                                  "below float32");
            return;
        }
        error(at("/units"),
              why + "unit " + unit + " gathers it in " + dtype +
                  ", and real FSDP2 fails in its forward (\"expected m1 and m2 to have the same "
                  "dtype\"). Make each such module a unit of its own in fp32, e.g. {\"modules\": "
                  "[\"" +
                  first +
                  "\"], \"mixed_precision\": {\"param_dtype\": \"float32\", "
                  "\"reduce_dtype\": \"float32\"}}, listed with the other units (the "
                  "plans `shardscope recommend` writes have them)");
    }

    void checkRest() {
        for (auto& u : r.units)
            u.keepsFp32 = !u.isRoot && !u.modules.empty() &&
                          std::all_of(u.modules.begin(), u.modules.end(),
                                      [&](ModuleId m) { return g.module(m).keepFp32; });
        for (const auto& u : r.units) {
            if (u.params.empty() && !u.isRoot) {
                // Say where the unit's parameters went when it has some: nested units
                // take theirs; tied ones go to the unit assignParams chose.
                std::string why;
                for (ModuleId m : u.modules)
                    for (ParamId pid : g.subtreeParams(m)) {
                        const UnitId owner = r.unitOfParam[pid.index()];
                        if (!owner.valid() || !why.empty()) continue;
                        why = g.param(pid).tied()
                                  ? "; its parameter \"" + g.param(pid).name +
                                        "\" is shared and belongs to unit " +
                                        r.units[owner.index()].displayName() +
                                        (p.api == PlanApi::Fsdp1
                                             ? std::string(", the first of its owners' units "
                                                           "FSDP1 wraps")
                                             : std::string(", the lowest unit containing every "
                                                           "owner"))
                                  : "; nested units hold all of its parameters";
                    }
                warning(u.pointer, "unit " + u.displayName() + " manages no parameters" + why);
            }
            if (u.frozenNumel > 0 && u.frozenNumel < u.numel && r.flatParams &&
                p.api == PlanApi::Fsdp1) {
                if (p.fsdp1.useOrigParams)
                    warning(u.pointer, "unit " + u.displayName() +
                                           " mixes frozen and trainable parameters; FSDP1 "
                                           "keeps gradients for the whole FlatParameter");
                else
                    error(u.pointer, "unit " + u.displayName() +
                                         " mixes frozen and trainable parameters, which FSDP1 "
                                         "rejects with use_orig_params=False");
            }
        }
        checkKeepFp32();
        if (p.microBatches > 1 && p.api != PlanApi::Fsdp2 && !p.syncEveryMicroBatch &&
            p.api == PlanApi::Lightning)
            warning(at("/gradient_accumulation"),
                    "fairscale accumulates without sync through no_sync(); gradients stay "
                    "unsharded until the last micro-batch");
    }
};

}  // namespace

namespace {

// A unit's output reaching a module with parameters of another dtype, where nothing casts
// it: FSDP2 casts a unit's inputs at its own forward (cast_forward_inputs, when it has a
// param_dtype), but not the activations that flow back into an enclosing unit already
// running (the root's final norm after bf16 blocks) or into a unit without a param_dtype.
// Real FSDP2 then fails in forward ("expected both ... to be the same dtype").
void checkDtypeFlow(const ModelGraph& g, ResolvedPlan& r) {
    if (r.plan.api != PlanApi::Fsdp2 || r.units.empty()) return;
    const std::vector<int32_t> unitOf = unitOfModules(g, r);
    // Unit a encloses unit b: a's first module is an ancestor of b's.
    auto encloses = [&](int32_t a, int32_t b) {
        return !r.units[a].modules.empty() && !r.units[b].modules.empty() &&
               g.isAncestorOrSelf(r.units[a].modules[0], r.units[b].modules[0]);
    };
    auto computeDtype = [&](int32_t u) { return r.units[u].allGatherDtype; };
    auto outputDtype = [&](int32_t u) {
        const auto& mp = r.units[u].mixedPrecision;
        return mp.outputDtype ? *mp.outputDtype : computeDtype(u);
    };
    std::set<std::pair<int32_t, int32_t>> reported;
    int32_t prevUnit = -1;
    for (const int32_t m : modulesPostOrder(g)) {  // the forward order of leaf work
        const ModuleNode& mod = g.modules()[static_cast<size_t>(m)];
        // A module computing in fp32 casts its own input, and the model's code casts what it
        // returns (Ernie's router weights): nothing flows on in fp32.
        if (mod.params.empty() || mod.keepFp32) continue;
        const int32_t u = unitOf[static_cast<size_t>(m)];
        if (prevUnit >= 0 && u != prevUnit && outputDtype(prevUnit) != computeDtype(u)) {
            const bool castOnEntry = !encloses(u, prevUnit) &&
                                     r.units[u].mixedPrecision.paramDtype.has_value() &&
                                     r.units[u].mixedPrecision.castForwardInputs;
            if (!castOnEntry && reported.insert({prevUnit, u}).second)
                r.problems.push_back(
                    {Problem::Severity::Warning, r.units[u].pointer,
                     "unit " + r.units[prevUnit].displayName() + " outputs " +
                         std::string(dtypeName(outputDtype(prevUnit))) + " into \"" + mod.fqn +
                         "\" of unit " + r.units[u].displayName() + ", whose parameters are " +
                         std::string(dtypeName(computeDtype(u))) +
                         ", and nothing casts it (FSDP2 casts a unit's inputs only at its own "
                         "forward, with a param_dtype): real FSDP2 fails there with a dtype "
                         "mismatch. Give the units one mixed-precision policy, or set "
                         "output_dtype " +
                         std::string(dtypeName(computeDtype(u))) + " on " +
                         r.units[prevUnit].displayName()});
        }
        prevUnit = u;
    }
}

}  // namespace

ResolvedPlan resolvePlan(const ModelGraph& model, const Plan& plan, const ClusterSpec* cluster,
                         const std::string& planFile) {
    Resolver rs{model, plan, cluster, {}, {}, {}, {}, {}, {}, {}, {}};
    rs.r.plan = plan;
    rs.r.model = &model;
    rs.r.planFile = planFile;
    rs.resolveMesh();
    rs.resolveUnits();
    rs.assignParams();
    rs.resolveSettings();
    rs.resolveCompileAndFloat8();
    rs.computeSizes();
    rs.resolvePrefetch();
    rs.checkRest();
    rs.checkTraining();
    rs.r.moduleRuns = moduleRunsOf(model, rs.r);
    checkDtypeFlow(model, rs.r);
    return std::move(rs.r);
}

int32_t foreachKernels(const std::vector<int64_t>& numels, int32_t maxTensors) {
    // multi_tensor_apply: a tensor adds its chunks one block each; a kernel is launched when
    // the blocks reach 320, when the tensor list is full at a tensor's last chunk, and at
    // the end. A tensor cut by a full block list goes on as the next kernel's first tensor.
    constexpr int64_t kChunk = 65536, kBlocks = 320;
    int64_t kernels = 0, blocks = 0, tensors = 0;
    for (const int64_t n : numels) {
        if (n <= 0) continue;
        ++tensors;
        int64_t chunks = (n + kChunk - 1) / kChunk;
        while (chunks > 0) {
            const int64_t take = std::min(chunks, kBlocks - blocks);
            blocks += take;
            chunks -= take;
            if (blocks == kBlocks || (chunks == 0 && tensors == maxTensors)) {
                ++kernels;
                blocks = 0;
                tensors = chunks > 0 ? 1 : 0;
            }
        }
    }
    if (blocks > 0) ++kernels;
    return static_cast<int32_t>(std::min<int64_t>(kernels, std::numeric_limits<int32_t>::max()));
}

namespace {
// A module's children in the order its forward runs them, when that is not their
// registration order (else empty): a rotary embedding runs before the decoder layers'
// ModuleList it is registered after (transformers' LlamaModel.forward and its kind compute
// the position embeddings once, after embed_tokens, before the first layer).
std::vector<ModuleId> childrenInRunOrder(const ModelGraph& g, int32_t m) {
    const std::vector<ModuleId>& ch = g.modules()[static_cast<size_t>(m)].children;
    if (ch.size() < 2) return {};
    const auto list = std::find_if(ch.begin(), ch.end(),
                                   [&](ModuleId c) { return g.module(c).cls == "ModuleList"; });
    if (list == ch.end()) return {};
    const auto rotary = std::find_if(std::next(list), ch.end(), [&](ModuleId c) {
        return g.module(c).cls.find("RotaryEmbedding") != std::string::npos;
    });
    if (rotary == ch.end()) return {};
    std::vector<ModuleId> out = ch;
    std::rotate(out.begin() + (list - ch.begin()), out.begin() + (rotary - ch.begin()),
                out.begin() + (rotary - ch.begin()) + 1);
    return out;
}
}  // namespace

namespace {
// The module whose GEMM ends region `m`'s saving ops (recomputeStopGemm), or -1.
int32_t recomputeStopModule(const ModelGraph& g, ModuleId m) {
    const ModuleNode& mod = g.module(m);
    auto isLinear = [&](const ModuleNode& x) {
        return (x.cls == "Linear" || x.cls == "Conv1D") && x.children.empty() &&
               x.cost.gemms.size() == 1 && x.cost.gemms[0].calls == 1 && x.cost.attentionCalls == 0;
    };
    if (isLinear(mod)) return m.value;
    // A dense decoder layer: attention, its two norms and the MLP, then the residual adds
    // (which save nothing); the MLP's last registered Linear, its down projection, runs last.
    if (!endsWith(mod.cls, "DecoderLayer") || !mod.cost.savedBytes.isZero()) return -1;
    int32_t mlp = -1;
    for (ModuleId c : mod.children) {
        const ModuleNode& x = g.module(c);
        const bool idle = x.cost.fwdFlops.isZero() && x.cost.savedBytes.isZero() &&
                          x.cost.fwdMemBytes.isZero() && x.children.empty();
        if (x.name == "mlp" && endsWith(x.cls, "MLP"))
            mlp = c.value;
        else if (x.name != "self_attn" && x.name != "input_layernorm" &&
                 x.name != "post_attention_layernorm" && !idle)
            return -1;  // a post-feed-forward norm, a dropout that keeps its mask, ...
    }
    if (mlp < 0) return -1;
    int32_t down = -1;
    for (ModuleId c : g.modules()[static_cast<size_t>(mlp)].children) {
        const ModuleNode& x = g.module(c);
        if (isLinear(x))
            down = c.value;
        else if (x.cls.find("Dropout") != std::string::npos && !x.cost.savedBytes.isZero())
            return -1;
    }
    if (down < 0) return -1;
    const std::string& name = g.modules()[static_cast<size_t>(down)].name;
    return name == "down_proj" || name == "c_proj" || name == "fc2" ? down : -1;
}
}  // namespace

std::optional<ModuleCost::Gemm> recomputeStopGemm(const ModelGraph& g, ModuleId m) {
    const int32_t s = recomputeStopModule(g, m);
    if (s < 0) return std::nullopt;
    return g.modules()[static_cast<size_t>(s)].cost.gemms[0];
}

namespace {
// torchtitan's preset keeps the even (0-based) ones of a checkpointed call's mm calls: of
// calls idx .. idx + n - 1, how many.
int64_t keptMmCalls(int64_t idx, int64_t n) {
    return (idx + n + 1) / 2 - (idx + 1) / 2;
}

// Adds `gm` to a list of GEMMs merged by shape.
void addMerged(std::vector<ModuleCost::Gemm>& list, const ModuleCost::Gemm& gm) {
    auto it = std::find_if(list.begin(), list.end(), [&](const ModuleCost::Gemm& x) {
        return x.mPerToken == gm.mPerToken && x.n == gm.n && x.k == gm.k &&
               x.backward == gm.backward;
    });
    if (it != list.end())
        it->calls += gm.calls;
    else
        list.push_back(gm);
}
}  // namespace

namespace {
// The model as a compiled plan runs it. In each compiled unit, a module whose whole subtree
// the unit holds and whose compiled saved bytes are known (a decoder layer) saves what AOT
// autograd's partitioner keeps: its modules' eager saved bytes are scaled to that total,
// part by part (the dtype-following and the fixed bytes), so that each module still frees
// its share when its backward runs. Empty when no unit is compiled or none of its modules
// has compiled figures (the eager figures stand).
// The loss compiled (training.compile_loss): backward keeps the logits in the compute dtype
// (their bytes at the model's activation dtype, as saved bytes are) and each row's fp32 max
// and log-sum-exp, where eager keeps the fp32 log-probabilities; the loss outputs a scalar,
// so its gradient is the logits' own (lm_head's output). Inductor's generated code for the
// loss, tests/python/test_compiled_loss_peer.py.
void compileLoss(ModelGraph& g) {
    const double e = static_cast<double>(dtypeSize(g.activationDtype));
    for (size_t m = 0; m < g.moduleCount(); ++m) {
        ModuleCost& c = g.cost(ModuleId(static_cast<int32_t>(m)));
        if (c.lossVocab <= 0 || c.lossCompiled) continue;
        c.lossCompiled = true;
        c.savedBytes.fixedPerToken += 8 - 4 * c.lossVocab;
        c.savedBytes.perToken += e * c.lossVocab;
        c.outputBytes.fixedPerToken -= 4 * c.lossVocab;
    }
}

std::optional<ModelGraph> compiledModel(const ModelGraph& g, const ResolvedPlan& r,
                                        const std::vector<int32_t>& unitOf) {
    std::optional<ModelGraph> out;
    for (size_t m = 0; m < g.moduleCount(); ++m) {
        const ModuleNode& mod = g.modules()[m];
        const ModuleCost::Compiled& k = mod.cost.compiled;
        const ScaledCost& want = k.savedBytes;
        const int32_t u = unitOf[m];
        if (!k.known() || u < 0 || r.units[static_cast<size_t>(u)].compile == CompileMode::None)
            continue;
        const auto end = static_cast<size_t>(mod.subtreeEnd);
        ScaledCost eager;
        bool whole = true;
        for (size_t x = m; x < end; ++x) {
            whole = whole && unitOf[x] == u;
            eager += g.modules()[x].cost.savedBytes;
        }
        if (!whole) continue;  // its parts are units of their own: compiled apart
        if (!out) out = g;
        auto rescale = [&](double ScaledCost::*part) {
            const double from = eager.*part, to = want.*part;
            if (from <= 0) {
                out->cost(ModuleId(static_cast<int32_t>(m))).savedBytes.*part += to;
                return;
            }
            for (size_t x = m; x < end; ++x)
                out->cost(ModuleId(static_cast<int32_t>(x))).savedBytes.*part *= to / from;
        };
        rescale(&ScaledCost::perToken);
        rescale(&ScaledCost::fixedPerToken);
        rescale(&ScaledCost::perPosition);
        rescale(&ScaledCost::fixedPerTokenSeq);
        // Inductor's fused kernels replace the subtree's memory-bound ones (its fp32 casts
        // included): counted at the module itself, in the same run as its children.
        if (k.fwdMemKernels > 0) {
            for (size_t x = m; x < end; ++x) {
                ModuleCost& c = out->cost(ModuleId(static_cast<int32_t>(x)));
                c.fwdMemBytes = c.bwdMemBytes = {};
                c.fwdMemKernels = c.bwdMemKernels = 0;
                c.upcastElems = 0;
            }
            ModuleCost& c = out->cost(ModuleId(static_cast<int32_t>(m)));
            c.fwdMemBytes = k.fwdMemBytes;
            c.bwdMemBytes = k.bwdMemBytes;
            c.fwdMemKernels = k.fwdMemKernels;
            c.bwdMemKernels = k.bwdMemKernels;
        }
    }
    return out;
}
}  // namespace

namespace {
// torchtitan counts mm calls per checkpointed forward and recomputes the even ones; a
// module's mm calls are split evenly between kept and recomputed after its first. `mmSeen`:
// the mm calls of the module's unit so far.
void addMmCalls(const ModuleCost& c, int64_t& mmSeen, ModuleRun& run) {
    {
        int64_t calls = 0;
        for (const ModuleCost::Gemm& gm : c.gemms)
            calls += gm.calls;
        if (c.mmCount > 0 && c.mmCount == calls) {  // every GEMM call an mm
            int64_t idx = mmSeen;
            for (const ModuleCost::Gemm& gm : c.gemms) {
                addMerged(run.mmGemms, gm);
                ModuleCost::Gemm kept = gm;
                kept.calls = static_cast<int32_t>(keptMmCalls(idx, gm.calls));
                if (kept.calls > 0) addMerged(run.sacKeptGemms, kept);
                idx += gm.calls;
            }
        } else if (c.mmCount == 0 && !c.addmmOutputBytes.isZero()) {
            for (const ModuleCost::Gemm& gm : c.gemms)
                addMerged(run.addmmGemms, gm);
        }
    }
    if (c.mmCount > 0) {
        int64_t& n = mmSeen;
        const int64_t keep = keptMmCalls(n, c.mmCount);
        ScaledCost kept = c.mmOutputBytes;
        const double share = static_cast<double>(keep) / static_cast<double>(c.mmCount);
        kept.perToken *= share;
        kept.perTokenSeq *= share;
        kept.fixedPerToken *= share;
        kept.fixedPerTokenSeq *= share;
        run.sacPresetSaved += kept;
        n += c.mmCount;
    }
}

// An attention module ends the run's part before attention (ModuleRun::attnFwdFlops and
// the rest): its subtree, whose descendants ran before it in this run (`runMods`).
void addAttention(const ModelGraph& g, int32_t m, const ModuleCost& c,
                  const std::vector<int32_t>& runMods, ModuleRun& run,
                  std::vector<char>& afterAttn) {
    // Its subtree (ModuleRun::attnFwdFlops): its descendants ran before it in this run.
    ModuleCost sub = c;
    int32_t first = -1, lastGemm = -1;
    for (int32_t x : runMods)
        if (g.isAncestorOrSelf(ModuleId(m), ModuleId(x))) {
            const ModuleCost& xc = g.modules()[static_cast<size_t>(x)].cost;
            sub += xc;
            if (first < 0) first = x;
            if (!xc.gemms.empty()) lastGemm = x;
        }
    run.attnFwdFlops += sub.fwdFlops;
    ScaledCost freed = sub.savedBytes;
    if (first >= 0) {  // the checkpoint keeps the module's input, which its first saved
        const ScaledCost& in = g.modules()[static_cast<size_t>(first)].cost.savedBytes;
        freed.perToken -= in.perToken;
        freed.perTokenSeq -= in.perTokenSeq;
        freed.fixedPerToken -= in.fixedPerToken;
        freed.perPosition -= in.perPosition;
        freed.fixedPerTokenSeq -= in.fixedPerTokenSeq;
    }
    run.attnSavedBytes += freed;
    for (const ModuleCost::Gemm& gm : sub.gemms)
        addMerged(run.attnGemms, gm);
    if (lastGemm >= 0)
        for (const ModuleCost::Gemm& gm : g.modules()[static_cast<size_t>(lastGemm)].cost.gemms)
            addMerged(run.attnStopGemms, gm);
    run.attnMemBytes += sub.fwdMemBytes;
    run.attnMemKernels += sub.fwdMemKernels;
    run.attnUpcastElems += sub.upcastElems;
    // Everything so far (its projections included) comes before this attention.
    run.hasAttn = true;
    run.savedAfterAttn = {};
    for (int32_t x : runMods)
        afterAttn[static_cast<size_t>(x)] = 0;
}

// Each trainable parameter's gradient appears at the backward of its last forward use:
// the runs' gradient sizes; returns each module's own.
std::vector<int64_t> assignGradients(const ModelGraph& g, const ResolvedPlan& r,
                                     std::vector<ModuleRun>& runs,
                                     const std::vector<std::vector<int32_t>>& runMods,
                                     const std::vector<char>& afterAttn) {
    const size_t n = g.moduleCount();
    // Within a run, the last use is the module latest in post-order.
    std::vector<int32_t> lastRun(g.paramCount(), -1), lastMod(g.paramCount(), -1);
    for (size_t ri = 0; ri < runMods.size(); ++ri)
        for (int32_t m : runMods[ri])
            for (ParamId p : g.modules()[static_cast<size_t>(m)].params)
                if (r.unitOfParam[p.index()].valid() &&
                    r.unitOfParam[p.index()].value == runs[ri].unit) {
                    lastRun[p.index()] = static_cast<int32_t>(ri);
                    lastMod[p.index()] = m;
                }
    for (size_t ri = 0; ri < runMods.size(); ++ri)
        for (int32_t m : runMods[ri])
            for (ParamId p : g.modules()[static_cast<size_t>(m)].params)
                if (g.params()[p.index()].requiresGrad && lastMod[p.index()] >= 0 &&
                    lastMod[p.index()] != m && r.unitOfParam[p.index()].valid() &&
                    r.unitOfParam[p.index()].value == runs[ri].unit)
                    runs[ri].tiedGradNumel += g.params()[p.index()].numel;
    std::vector<int64_t> gradOfMod(n, 0);
    for (size_t p = 0; p < lastRun.size(); ++p)
        if (lastRun[p] >= 0 && g.params()[p].requiresGrad) {
            ModuleRun& run = runs[static_cast<size_t>(lastRun[p])];
            run.gradNumel += g.params()[p].numel;
            gradOfMod[static_cast<size_t>(lastMod[p])] += g.params()[p].numel;
            if (afterAttn[static_cast<size_t>(lastMod[p])])
                run.gradNumelAfterAttn += g.params()[p].numel;
        }
    return gradOfMod;
}

// Loops after the last attention (ModuleRun::loopSaved): a module belongs to the member of
// a ModuleList of alike siblings (experts.3 for experts.3.w1) that holds no attention.
void findLoops(const ModelGraph& g, std::vector<ModuleRun>& runs,
               const std::vector<std::vector<int32_t>>& runMods, const std::vector<char>& afterAttn,
               const std::vector<int64_t>& gradOfMod) {
    const size_t n = g.moduleCount();
    std::vector<char> hasAttention(n, 0);
    for (size_t m = n; m-- > 0;) {
        const ModuleNode& mod = g.modules()[m];
        if (mod.cls.find("Attention") != std::string::npos) hasAttention[m] = 1;
        if (hasAttention[m] && mod.parent.valid()) hasAttention[mod.parent.index()] = 1;
    }
    // Children of a container with a sibling of their class (counted once per container:
    // a list of thousands of experts stays linear).
    std::vector<char> alike(n, 0);
    std::unordered_map<std::string_view, int> classCount;
    for (size_t m = 0; m < n; ++m) {
        if (!g.isContainer(ModuleId(static_cast<int32_t>(m)))) continue;
        classCount.clear();
        for (ModuleId c : g.modules()[m].children)
            ++classCount[g.module(c).cls];
        for (ModuleId c : g.modules()[m].children)
            alike[c.index()] = classCount[g.module(c).cls] >= 2;
    }
    std::vector<int32_t> member(n, -1);
    for (size_t m = 1; m < n; ++m) {
        const ModuleNode& mod = g.modules()[m];
        if (hasAttention[m] || !mod.parent.valid()) continue;
        const size_t parent = mod.parent.index();
        if (member[parent] >= 0)
            member[m] = member[parent];
        else if (alike[m])
            member[m] = static_cast<int32_t>(m);
    }
    for (size_t ri = 0; ri < runMods.size(); ++ri) {
        struct Loop {
            ScaledCost saved;
            int64_t grads = 0;
            std::unordered_set<int32_t> members;
        };
        std::unordered_map<size_t, Loop> loops;  // by the list holding the members
        for (int32_t x : runMods[ri]) {
            const auto xi = static_cast<size_t>(x);
            if (!afterAttn[xi] || member[xi] < 0) continue;
            Loop& l = loops[g.modules()[static_cast<size_t>(member[xi])].parent.index()];
            l.saved += g.modules()[xi].cost.savedBytes;
            l.grads += gradOfMod[xi];
            l.members.insert(member[xi]);
        }
        ModuleRun& run = runs[ri];
        // The largest; between equal ones the first list in module order (deterministic
        // whatever the hash map's order).
        size_t chosen = n;
        for (const auto& [list, l] : loops)
            if (l.members.size() >= 2 &&
                (l.grads > run.loopGradNumel || (l.grads == run.loopGradNumel && list < chosen))) {
                chosen = list;
                run.loopSaved = l.saved;
                run.loopGradNumel = l.grads;
                run.loopMembers = static_cast<int32_t>(l.members.size());
            }
    }
}

// The gradient moments (ModuleRun::firstGradOutput, largestGradOutput): backward walks the
// run last module first, its gradients accumulating.
// Eager attention (ModuleCost::eagerAttentionCalls) counts as its output the gradients of
// its probabilities: backward holds two of them at once (the second matmul's and the sink
// slice's zero-filled copy, then that and softmax's) beside the probabilities it saved,
// and its own weight gradient (the sinks') comes after, with every later module's made.
void gradientMoments(const ModelGraph& g, std::vector<ModuleRun>& runs,
                     const std::vector<std::vector<int32_t>>& runMods,
                     const std::vector<int64_t>& gradOfMod, int64_t seqLen) {
    for (size_t ri = 0; ri < runMods.size(); ++ri) {
        ModuleRun& run = runs[ri];
        int64_t acc = 0;
        double largest = -1;
        ScaledCost freed;  // saved by the modules backward has passed
        for (auto it = runMods[ri].rbegin(); it != runMods[ri].rend(); ++it) {
            const ModuleCost& mc = g.modules()[static_cast<size_t>(*it)].cost;
            const int64_t own = gradOfMod[static_cast<size_t>(*it)];
            if (own != 0) {
                acc += own;
                ScaledCost o = mc.outputBytes;
                if (mc.eagerAttentionCalls > 0) {
                    o.perTokenSeq += 2 * mc.savedBytes.perTokenSeq;
                    o.fixedPerTokenSeq += 2 * mc.savedBytes.fixedPerTokenSeq;
                }
                run.firstGradOutput = o;
                run.firstGradSavedAfter = freed;
                if (const double size =
                        o.perToken + o.fixedPerToken +
                        (o.perTokenSeq + o.fixedPerTokenSeq) * static_cast<double>(seqLen);
                    size > largest) {
                    largest = size;
                    run.largestGradOutput = o;
                    run.largestOutGradNumel = acc;
                    run.largestGradSavedAfter = freed;
                }
            }
            freed += mc.savedBytes;  // its own inputs live until its weight gradient is made
        }
    }
}

// Runs alike in what their kernels depend on share a signature (decoder layers do), so a
// step program prices one and reuses it.
void shareKernelSignatures(std::vector<ModuleRun>& runs) {
    auto sameKernels = [](const ModuleRun& a, const ModuleRun& b) {
        const ModuleCost &x = a.cost, &y = b.cost;
        return a.kernels == b.kernels && x.gemms == y.gemms &&
               a.recomputeSkips == b.recomputeSkips && a.sacKeptGemms == b.sacKeptGemms &&
               a.mmGemms == b.mmGemms && a.addmmGemms == b.addmmGemms &&
               a.attnGemms == b.attnGemms && a.attnStopGemms == b.attnStopGemms &&
               a.attnMemKernels == b.attnMemKernels && a.attnMemBytes == b.attnMemBytes &&
               x.attentionCalls == y.attentionCalls &&
               x.windowAttentionCalls == y.windowAttentionCalls &&
               x.eagerAttentionCalls == y.eagerAttentionCalls &&
               x.fwdMemKernels == y.fwdMemKernels && x.bwdMemKernels == y.bwdMemKernels &&
               x.fwdFlops == y.fwdFlops && x.bwdFlops == y.bwdFlops &&
               x.fwdMemBytes == y.fwdMemBytes && x.bwdMemBytes == y.bwdMemBytes &&
               x.upcastElems == y.upcastElems && x.lossVocab == y.lossVocab &&
               x.lossCompiled == y.lossCompiled && a.attnUpcastElems == b.attnUpcastElems;
    };
    std::vector<int32_t> distinct;
    for (size_t i = 0; i < runs.size(); ++i) {
        runs[i].kernelSignature = static_cast<int32_t>(i);
        for (int32_t d : distinct)
            if (sameKernels(runs[static_cast<size_t>(d)], runs[i])) {
                runs[i].kernelSignature = d;
                break;
            }
        if (runs[i].kernelSignature == static_cast<int32_t>(i))
            distinct.push_back(static_cast<int32_t>(i));
    }
}
}  // namespace

std::vector<ModuleRun> moduleRunsOf(const ModelGraph& model, const ResolvedPlan& r,
                                    int64_t seqLen) {
    // The patched copy has the same modules: one unit map serves both.
    const std::vector<int32_t> unitOf = unitOfModules(model, r);
    const bool anyCompiled = std::any_of(r.units.begin(), r.units.end(), [](const auto& u) {
        return u.compile != CompileMode::None;
    });
    std::optional<ModelGraph> compiled =
        anyCompiled ? compiledModel(model, r, unitOf) : std::nullopt;
    if (r.plan.compileLoss) compileLoss(compiled ? *compiled : compiled.emplace(model));
    const ModelGraph& g = compiled ? *compiled : model;
    std::vector<char> float8Module;
    for (const auto& u : r.units)
        for (ModuleId m : u.float8Linears) {
            if (float8Module.empty()) float8Module.assign(g.moduleCount(), 0);
            float8Module[m.index()] = 1;
        }
    if (seqLen < 1) seqLen = r.plan.seqLen;
    const size_t n = g.moduleCount();
    std::vector<ModuleRun> runs;
    std::vector<int32_t> runOf(n, -1);
    // mm calls so far in each unit's checkpointed module (torchtitan counts per checkpointed
    // call, and each of a unit's modules is checkpointed on its own)
    std::vector<int64_t> mmSeen(r.units.size(), 0);
    std::vector<char> afterAttn(n, 0);                // after its run's last attention module
    std::vector<std::vector<int32_t>> runMods;        // each run's modules, in post-order
    std::vector<std::vector<ModuleId>> reordered(n);  // where the run order differs
    std::vector<char> regionRoot(n, 0);  // a unit's own module: what checkpointing wraps
    for (size_t u = 1; u < r.units.size(); ++u)
        for (ModuleId m : r.units[u].modules)
            if (m.index() < n) regionRoot[m.index()] = 1;
    for (size_t m = 0; m < n; ++m)
        reordered[m] = childrenInRunOrder(g, static_cast<int32_t>(m));
    // Each of a unit's own modules is a checkpoint region of its own: it starts a run, so
    // that a unit of two decoder layers is two runs (each recomputed, stopped early and
    // freed on its own under checkpointing). The step program merges them into one segment.
    bool regionStarts = false;
    std::vector<std::pair<int32_t, size_t>> stack{{0, 0}};
    while (n > 0 && !stack.empty()) {
        auto& [m, child] = stack.back();
        const auto& ch = reordered[static_cast<size_t>(m)].empty()
                             ? g.modules()[static_cast<size_t>(m)].children
                             : reordered[static_cast<size_t>(m)];
        if (child < ch.size()) {
            const int32_t c = ch[child++].value;
            if (regionRoot[static_cast<size_t>(c)] && unitOf[c] >= 0) {
                mmSeen[static_cast<size_t>(unitOf[c])] = 0;
                regionStarts = true;
            }
            stack.push_back({c, 0});
            continue;
        }
        const ModuleNode& mod = g.modules()[m];
        const int32_t u = unitOf[m];
        stack.pop_back();
        // A sliding-window layer's SDPA keeps its mask once the sequence reaches the window.
        ModuleCost masked;
        const bool windowed =
            g.slidingWindow > 0 && seqLen >= g.slidingWindow && !mod.cost.windowSavedBytes.isZero();
        // What its code keeps below fp32 only (ModuleCost::belowFp32SavedBytes).
        const bool belowFp32 = !mod.cost.belowFp32SavedBytes.isZero() && u >= 0 &&
                               dtypeSize(r.units[static_cast<size_t>(u)].allGatherDtype) < 4;
        if (windowed || belowFp32) {
            masked = mod.cost;
            if (windowed) masked.savedBytes += masked.windowSavedBytes;
            if (belowFp32) masked.savedBytes += masked.belowFp32SavedBytes;
        }
        const ModuleCost* cost = windowed || belowFp32 ? &masked : &mod.cost;
        // A layer the plan's float8 option converts runs its GEMMs in float8.
        ModuleCost converted;
        if (!float8Module.empty() && float8Module[m]) {
            converted = *cost;
            for (ModuleCost::Gemm& gm : converted.gemms)
                gm.float8 = true;
            cost = &converted;
        }
        const ModuleCost& c = *cost;
        if (c.fwdFlops.isZero() && c.savedBytes.isZero() && c.fwdMemBytes.isZero()) continue;
        if (runs.empty() || runs.back().unit != u || regionStarts) {
            runs.emplace_back().unit = u;
            runMods.emplace_back();
        }
        regionStarts = false;
        ModuleRun& run = runs.back();
        runOf[static_cast<size_t>(m)] = static_cast<int32_t>(runs.size() - 1);
        run.cost += c;
        // The largest per-token output is one module's, its dtype-following and fixed bytes
        // together (lm_head's logits and the loss's fp32 log-probabilities are two outputs,
        // not one); on a tie, the one with more fixed bytes is larger under mixed precision.
        {
            ScaledCost& pk = run.peakOutputBytes;
            const ScaledCost& o = c.outputBytes;
            const double a = o.perToken + o.fixedPerToken, b = pk.perToken + pk.fixedPerToken;
            if (a > b || (a == b && o.fixedPerToken > pk.fixedPerToken)) {
                pk.perToken = o.perToken;
                pk.fixedPerToken = o.fixedPerToken;
            }
            pk.perTokenSeq = std::max(pk.perTokenSeq, o.perTokenSeq);
            pk.fixedPerTokenSeq = std::max(pk.fixedPerTokenSeq, o.fixedPerTokenSeq);
            // Attention written out in operators makes its s x s gradients in backward
            // (the probabilities', then the scores'), whether or not the module has
            // parameters of its own: two of them beside each other, as an output's, the
            // size of the probabilities softmax keeps (MPT's fp32 ones, not their cast).
            if (c.eagerAttentionCalls > 0) {
                const ScaledCost& probs = mod.cost.savedBytes;
                pk.perTokenSeq = std::max(pk.perTokenSeq, probs.perTokenSeq);
                pk.fixedPerTokenSeq = std::max(pk.fixedPerTokenSeq, probs.fixedPerTokenSeq);
            }
        }
        if (!c.fwdFlops.isZero()) ++run.kernels;
        run.mmSaved += c.mmOutputBytes;
        run.addmmSaved += c.addmmOutputBytes;
        run.sdpaSaved += c.sdpaOutputBytes;
        run.sacPresetSaved += c.sdpaOutputBytes;
        addMmCalls(c, mmSeen[static_cast<size_t>(u)], run);
        if (mod.cls.find("Attention") != std::string::npos) {
            addAttention(g, m, c, runMods.back(), run, afterAttn);
        } else if (run.hasAttn) {
            run.savedAfterAttn += c.savedBytes;
            afterAttn[static_cast<size_t>(m)] = 1;
        }
        // A checkpoint region (one of its unit's modules) whose recompute stops before its
        // last GEMM, which ran in this run (the region is the unit's and ends here).
        if (u > 0 && regionRoot[static_cast<size_t>(m)]) {
            const int32_t stop = recomputeStopModule(g, ModuleId(m));
            if (stop >= 0 &&
                runOf[static_cast<size_t>(stop)] == static_cast<int32_t>(runs.size() - 1)) {
                const ModuleCost::Gemm& gm = g.modules()[static_cast<size_t>(stop)].cost.gemms[0];
                addMerged(run.recomputeSkips, gm);
            }
        }
        runMods.back().push_back(m);
    }
    const std::vector<int64_t> gradOfMod = assignGradients(g, r, runs, runMods, afterAttn);
    findLoops(g, runs, runMods, afterAttn, gradOfMod);
    gradientMoments(g, runs, runMods, gradOfMod, seqLen);
    shareKernelSignatures(runs);
    return runs;
}

}  // namespace shardscope
