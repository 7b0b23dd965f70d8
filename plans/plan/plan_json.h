// SPDX-License-Identifier: Apache-2.0
#pragma once
// Plan JSON ("format": "shardscope.plan", "version": 1), documented in plans/README.md.
// planToJson(planFromJson(x)) reproduces every setting of x: absent fields stay absent
// (they inherit), explicit nulls stay explicit.
#include <nlohmann/json.hpp>

#include <string>

#include "plans/core/expected.h"
#include "plans/plan/plan.h"

namespace shardscope {

[[nodiscard]] Expected<Plan> planFromJson(const nlohmann::json& j, const std::string& file);
[[nodiscard]] Expected<Plan> loadPlanFile(const std::string& path);
[[nodiscard]] nlohmann::json planToJson(const Plan& p);

}  // namespace shardscope
