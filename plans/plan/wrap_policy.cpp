// SPDX-License-Identifier: Apache-2.0
#include "plans/plan/wrap_policy.h"

#include <regex>

namespace shardscope {

bool isBatchNorm(const ModelGraph& g, ModuleId m) {
    for (const char* c :
         {"_BatchNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "SyncBatchNorm"})
        if (g.isInstance(m, c)) return true;
    return false;
}

namespace {

struct Wrapper {
    const ModelGraph& g;
    const WrapOptions& o;
    std::vector<std::regex> patterns;
    std::vector<char> ignored;  // per parameter
    std::vector<int32_t> seen;  // per parameter: last module that counted it
    WrapResult result;

    bool anyInstance(ModuleId m, const std::vector<std::string>& classes) const {
        for (const auto& c : classes)
            if (g.isInstance(m, c)) return true;
        return false;
    }

    // The user policy, as torch's policy functions decide.
    bool userPolicy(ModuleId m, bool recurse, int64_t nonwrapped) const {
        const auto& p = o.policy;
        switch (p.kind) {
            case WrapPolicySpec::Kind::None:
                return false;
            case WrapPolicySpec::Kind::Size: {
                // size_based_auto_wrap_policy
                const bool isLarge = nonwrapped >= p.minNumParams;
                if (recurse) return isLarge && !anyInstance(m, p.forceLeafClasses);
                return isLarge && !anyInstance(m, p.excludeWrapClasses);
            }
            case WrapPolicySpec::Kind::ModuleClass:
                // _module_wrap_policy / transformer_auto_wrap_policy
                return recurse || anyInstance(m, p.classes);
            case WrapPolicySpec::Kind::NamePattern: {
                // lambda_auto_wrap_policy: always recurse, wrap where the lambda holds
                if (recurse) return true;
                for (const auto& re : patterns)
                    if (std::regex_match(g.module(m).fqn, re)) return true;
                return false;
            }
        }
        return false;
    }

    // _or_policy(user, _wrap_module_cls_individually(_BatchNorm)) when MP is on.
    bool policy(ModuleId m, bool recurse, int64_t nonwrapped, bool* byBatchNorm) const {
        const bool user = userPolicy(m, recurse, nonwrapped);
        if (!o.wrapBatchNormIndividually) return user;
        const bool bn = recurse ? true : isBatchNorm(g, m);
        if (byBatchNorm) *byBatchNorm = !user && bn;
        return user || bn;
    }

    // sum(p.numel() for p in module.parameters() if p not in ignored_params). PyTorch
    // 2.11 no longer skips parameters already flattened into a wrapped unit here, so a
    // parameter tied across siblings counts in each (and a parent's remainder can go
    // negative); older releases subtracted them.
    int64_t nonwrappedNumel(ModuleId m) {
        int64_t n = 0;
        const int32_t end = g.module(m).subtreeEnd;
        for (int32_t i = m.value; i < end; ++i)
            for (ParamId p : g.modules()[i].params) {
                if (seen[p.index()] == m.value) continue;  // tied: once per module.parameters()
                seen[p.index()] = m.value;
                if (!ignored[p.index()]) n += g.param(p).numel;
            }
        return n;
    }

    // Returns the numel this call wrapped, as _recursive_wrap does.
    int64_t recursiveWrap(ModuleId m, bool onlyWrapChildren) {
        const int64_t nonwrapped = nonwrappedNumel(m);
        if (!policy(m, true, nonwrapped, nullptr)) return 0;
        int64_t totalWrapped = 0;
        for (ModuleId c : g.module(m).children)
            totalWrapped += recursiveWrap(c, false);
        const int64_t remainder = nonwrapped - totalWrapped;
        bool byBatchNorm = false;
        if (!onlyWrapChildren && policy(m, false, remainder, &byBatchNorm)) {
            result.wrapped.push_back(m);
            if (byBatchNorm) result.batchNormUnits.push_back(m);
            return nonwrapped;
        }
        return totalWrapped;
    }
};

}  // namespace

Expected<WrapResult> applyWrapPolicy(const ModelGraph& g, const WrapOptions& o) {
    Wrapper w{g, o, {}, {}, {}, {}};
    for (const auto& p : o.policy.patterns) {
        try {
            w.patterns.emplace_back(p, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
            return Error{"invalid name pattern \"" + p + "\": " + e.what()};
        }
    }
    w.ignored.assign(g.paramCount(), 0);
    w.seen.assign(g.paramCount(), -1);
    for (ParamId p : o.ignoredParams)
        w.ignored[p.index()] = 1;
    w.recursiveWrap(g.root(), true);
    return std::move(w.result);
}

}  // namespace shardscope
