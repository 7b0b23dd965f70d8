// SPDX-License-Identifier: Apache-2.0
#include "engine/search/variant.h"

#include <algorithm>

namespace shardscope {

namespace {
int64_t ceilDiv(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}
}  // namespace

bool applyVariant(ResolvedPlan& r, const PlanVariant& v, std::string* why) {
    const ModelGraph& g = *r.model;
    const int64_t S = r.shardSize;
    bool compileChanged = false;
    bool dtypeChanged = false;  // a unit's compute dtype: below-fp32 saved bytes follow it
    // Compiling the blocks compiles the loss too, as torchtitan's compile does.
    if (v.compile && r.plan.compileLoss != (*v.compile != CompileMode::None)) {
        r.plan.compileLoss = *v.compile != CompileMode::None;
        compileChanged = true;
    }
    for (size_t i = 0; i < r.units.size(); ++i) {
        ResolvedUnit& u = r.units[i];
        if ((v.paramDtype || v.reduceDtype) && !u.keepsFp32) {
            // As MixedPrecisionPolicy normalises: equal to the original dtype means None.
            const DType orig = u.params.empty() ? DType::Float32 : g.param(u.params[0]).dtype;
            MixedPrecisionSpec mp = u.mixedPrecision;
            if (v.paramDtype) mp.paramDtype = *v.paramDtype == orig ? std::nullopt : v.paramDtype;
            if (v.reduceDtype) mp.reduceDtype = v.reduceDtype;
            const DType ag = mp.paramDtype.value_or(orig);
            if (mp.reduceDtype && *mp.reduceDtype == ag) mp.reduceDtype.reset();
            if (ag != u.allGatherDtype) {
                dtypeChanged = true;
                u.unshardedBytes = u.unshardedBytes / dtypeSize(u.allGatherDtype) * dtypeSize(ag);
                u.allGatherDtype = ag;
            }
            u.mixedPrecision = mp;
            u.reduceDtype = mp.reduceDtype.value_or(ag);
        }
        if (u.isRoot) continue;  // the root keeps its own (None: False) setting
        if (v.compile && u.compile != *v.compile) {
            u.compile = *v.compile;
            compileChanged = true;
        }
        if (v.ac && !u.keepsFp32) {
            u.activationCheckpointing = *v.ac;
            u.acSave.clear();  // selective_op: torchtitan's preset
        }
        const bool isEnd = v.endsReshard && std::find(v.endUnits.begin(), v.endUnits.end(),
                                                      static_cast<int32_t>(i)) != v.endUnits.end();
        const ReshardSetting& rs = isEnd ? *v.endsReshard : v.reshard;
        if (rs.kind != ReshardSetting::Kind::Default) {
            u.reshardDeclared = rs;
            u.postForwardBytes = 0;
            u.reshardK = 0;
            if (rs.kind == ReshardSetting::Kind::Bool) {
                u.reshard = rs.value ? Reshard::True : Reshard::False;
            } else {
                const int64_t k = rs.k;
                if (k < 1 || S % k != 0) {
                    if (why)
                        *why = "reshard_after_forward=" + std::to_string(k) +
                               " does not divide the shard size " + std::to_string(S);
                    return false;
                }
                u.reshard = k == 1 ? Reshard::False : k == S ? Reshard::True : Reshard::Int;
                if (u.reshard == Reshard::Int) {
                    u.reshardK = k;
                    for (ParamId pid : u.params) {
                        const auto& p = g.param(pid);
                        if (p.shape.empty() || p.shape[0] == 0) continue;
                        u.postForwardBytes += ceilDiv(p.shape[0], k) * (p.numel / p.shape[0]) *
                                              dtypeSize(u.allGatherDtype);
                    }
                }
            }
            if (r.noShard) u.reshard = Reshard::False;
        }
    }
    // Explicit prefetch of the next / previous N units in forward order (units[1..]), the
    // units that keep fp32 left out.
    std::vector<int32_t> chain;
    for (size_t i = 1; i < r.units.size(); ++i) {
        ResolvedUnit& u = r.units[i];
        u.forwardPrefetch.clear();
        u.backwardPrefetch.clear();
        u.explicitForwardPrefetch = u.explicitBackwardPrefetch = false;
        if (!u.keepsFp32) chain.push_back(static_cast<int32_t>(i));
    }
    const size_t n = chain.size();
    for (size_t i = 0; i < n; ++i) {
        ResolvedUnit& u = r.units[static_cast<size_t>(chain[i])];
        u.explicitForwardPrefetch = v.forwardPrefetchDepth > 0;
        for (int d = 1; d <= v.forwardPrefetchDepth && i + static_cast<size_t>(d) < n; ++d)
            u.forwardPrefetch.emplace_back(chain[i + static_cast<size_t>(d)]);
        u.explicitBackwardPrefetch = v.backwardPrefetchDepth > 0;
        for (int d = 1; d <= v.backwardPrefetchDepth && i >= static_cast<size_t>(d); ++d)
            u.backwardPrefetch.emplace_back(chain[i - static_cast<size_t>(d)]);
    }
    // A compiled layer saves and runs other kernels, and what a module keeps only below fp32
    // (ModuleCost::belowFp32SavedBytes) follows its unit's compute dtype: the module runs
    // follow the settings.
    const bool belowFp32Terms =
        dtypeChanged && std::any_of(g.modules().begin(), g.modules().end(), [](const auto& m) {
            return !m.cost.belowFp32SavedBytes.isZero();
        });
    if (compileChanged || belowFp32Terms) r.moduleRuns = moduleRunsOf(g, r);
    return true;
}

}  // namespace shardscope
