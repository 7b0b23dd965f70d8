// SPDX-License-Identifier: Apache-2.0
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/cli/args.h"
#include "engine/measure/fsdp_join.h"
#include "engine/measure/trace_diff.h"
#include "engine/schedule/step_program.h"
#include "plans/cluster/cluster.h"
#include "plans/model/model_graph.h"
#include "plans/plan/resolve.h"

namespace shardscope::cli {

// `trace overlap` on PyTorch profiler traces (cmd_fsdp_trace.cpp): per FSDP unit and phase.
int runPyTorchTraceOverlap(const Args& a);

// A user's PyTorch FSDP job from its traces (a file per rank, or their folder), in the step
// program's terms: the model (--model), the plan that ran (--plan, else recovered from the
// traces), the cluster (--cluster), the program and the traces joined to it.
struct PyTorchRun {
    std::vector<std::string> paths;
    std::vector<Trace> traces;
    std::optional<ModelGraph> model;
    Plan plan;
    std::string planSource;  // the --plan file, or "recovered from <trace>"
    std::optional<ClusterSpec> cluster;
    std::optional<ResolvedPlan> resolved;
    std::optional<StepProgram> program;
    std::optional<FsdpJoin> join;
};
[[nodiscard]] Expected<PyTorchRun> loadPyTorchRun(const Args& a,
                                                  const std::vector<std::string>& traceArgs);
// Whether these arguments name PyTorch traces (a folder, several files, or one file that is
// not a ShardScope trace).
[[nodiscard]] Expected<bool> namesPyTorchTraces(const std::vector<std::string>& traceArgs);
int runPyTorchTraceDiff(const Args& a);

// Prints (or, with --json, emits) the join of two sides (cmd_trace_diff.cpp).
int printTraceDiff(const Args& a, const DiffSide& sideA, const DiffSide& sideB);

}  // namespace shardscope::cli
