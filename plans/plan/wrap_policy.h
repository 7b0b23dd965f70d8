// SPDX-License-Identifier: Apache-2.0
#pragma once
// Auto-wrap policies with FSDP1's exact semantics (torch/distributed/fsdp/wrap.py):
// `_recursive_wrap` is a post-order recursion that asks the policy, at each module,
// whether to recurse into its children (recurse=True, with the numel of
// module.parameters() less ignored ones) and, after the children, whether to wrap the
// module itself (recurse=False, with the remainder: that numel minus what the children
// wrapped). Checked against PyTorch 2.11's own _recursive_wrap in
// tests/python/test_wrap_peer.py. The root is
// wrapped by the caller (only_wrap_children=True), so it is always a unit.
#include <string>
#include <vector>

#include "plans/core/expected.h"
#include "plans/model/model_graph.h"
#include "plans/plan/plan.h"

namespace shardscope {

struct WrapOptions {
    WrapPolicySpec policy;
    // FSDP1 with mixed precision wraps _BatchNorm modules individually
    // (MixedPrecision._module_classes_to_ignore, _wrap_utils._auto_wrap), which also makes
    // the recursion descend everywhere (_wrap_module_cls_individually returns True for
    // recurse).
    bool wrapBatchNormIndividually = false;
    std::vector<ParamId> ignoredParams;
};

struct WrapResult {
    // Modules to wrap, in the order _recursive_wrap wraps them (post-order); the root is
    // not included.
    std::vector<ModuleId> wrapped;
    std::vector<ModuleId> batchNormUnits;  // subset of `wrapped` wrapped for the BatchNorm rule
};

// Fails only for an invalid regex in a name_pattern policy.
[[nodiscard]] Expected<WrapResult> applyWrapPolicy(const ModelGraph& g, const WrapOptions& options);

[[nodiscard]] bool isBatchNorm(const ModelGraph& g, ModuleId m);

}  // namespace shardscope
