// SPDX-License-Identifier: Apache-2.0
// Plan variants that keep a resolved plan's units: resharding, activation checkpointing,
// explicit prefetch depth and mixed precision applied in place, recomputing only what
// depends on them, so a search can evaluate thousands of settings per second without
// resolving the plan again (resolution costs as much as a simulation).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "plans/plan/resolve.h"

namespace shardscope {

struct PlanVariant {
    ReshardSetting reshard;  // for every non-root unit; Default keeps the plan's
    // A second unit class (embeddings and head): these units take endsReshard when set.
    std::vector<int32_t> endUnits;
    std::optional<ReshardSetting> endsReshard;
    std::optional<AcMode> ac;      // for every non-root unit
    int forwardPrefetchDepth = 0;  // explicit forward prefetch of the next N units (0: implicit)
    int backwardPrefetchDepth =
        0;  // explicit backward prefetch of the previous N units (0: implicit)
    std::optional<DType> paramDtype;  // mixed precision param_dtype for every unit
    std::optional<DType> reduceDtype;
    std::optional<CompileMode> compile;  // torch.compile for every non-root unit and the loss
    friend bool operator==(const PlanVariant&, const PlanVariant&) = default;
};

// Applies `v` to `plan` (resolved with the same model). Units that keep fp32
// (ResolvedUnit::keepsFp32) keep their precision and no checkpointing, and are left out of
// the prefetch chains, which link the other units. Returns false, leaving a message,
// when the variant is invalid for this plan (an int reshard that does not divide the
// shard size).
bool applyVariant(ResolvedPlan& plan, const PlanVariant& v, std::string* why = nullptr);

}  // namespace shardscope
