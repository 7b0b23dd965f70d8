// SPDX-License-Identifier: Apache-2.0
#pragma once
// Exports a resolved plan as configuration users apply directly:
//  - fsdp2: the fully_shard calls in application order (children first, root last) with
//    their kwargs, the mesh, explicit prefetch lists and activation checkpointing;
//  - fsdp1: FullyShardedDataParallel constructor kwargs with the auto-wrap policy;
//  - lightning: Lightning's strategy: ModelParallelStrategy with the fsdp2 export for FSDP2
//    plans, FSDPStrategy kwargs for FSDP1 plans, the fairscale DDPFullyShardedStrategy
//    (pytorch_lightning 1.x) for plans written against it;
//  - lightning-fsdp1: an FSDP2 plan as FSDPStrategy kwargs, naming what FSDP1 drops.
// Formats are documented in plans/README.md ("Exports").
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "plans/core/expected.h"
#include "plans/plan/resolve.h"

namespace shardscope {

enum class ExportFormat { ShardScope, Fsdp2, Fsdp1, Lightning, LightningFsdp1 };

[[nodiscard]] Expected<ExportFormat> parseExportFormat(const std::string& s);
[[nodiscard]] nlohmann::json exportPlan(const ResolvedPlan& r, ExportFormat f);
// Why `r` cannot be exported as `f`, if it cannot: FSDP1's and Lightning's one MixedPrecision
// for every unit would gather a module that computes in fp32 (ModuleNode::keepFp32) below
// fp32, its own fp32 unit dropped, and PyTorch fails in its forward.
[[nodiscard]] std::optional<std::string> exportRefusal(const ResolvedPlan& r, ExportFormat f);

}  // namespace shardscope
