// SPDX-License-Identifier: Apache-2.0
#pragma once
// Exports a resolved plan as configuration users apply directly:
//  - fsdp2: the fully_shard calls in application order (children first, root last) with
//    their kwargs, the mesh, explicit prefetch lists and activation checkpointing;
//  - fsdp1: FullyShardedDataParallel constructor kwargs with the auto-wrap policy;
//  - lightning: strategy kwargs (FSDPStrategy, or the fairscale DDPFullyShardedStrategy
//    for plans written against it).
// Formats are documented in plans/README.md ("Exports").
#include <nlohmann/json.hpp>

#include <string>

#include "plans/core/expected.h"
#include "plans/plan/resolve.h"

namespace shardscope {

enum class ExportFormat { ShardScope, Fsdp2, Fsdp1, Lightning };

[[nodiscard]] Expected<ExportFormat> parseExportFormat(const std::string& s);
[[nodiscard]] nlohmann::json exportPlan(const ResolvedPlan& r, ExportFormat f);

}  // namespace shardscope
