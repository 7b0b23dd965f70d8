// SPDX-License-Identifier: Apache-2.0
#pragma once
// The one way traces come in, for every `trace` subcommand, `calibrate`, `plan recover` and
// the desktop app: files (.json, .json.gz) and folders of them (one file per rank, as
// torch.profiler's tensorboard_trace_handler writes), each read by the streaming Kineto
// importer, which also reads ShardScope's own traces. Files of a folder that are not traces
// (a record.json beside them) are skipped and named; a file named on the command line that
// is not a trace is an error naming it.
#include <functional>
#include <string>
#include <vector>

#include "plans/core/expected.h"
#include "profiler/import/kineto_import.h"
#include "profiler/trace/trace.h"

namespace shardscope {

struct TraceArg {
    std::string path;
    bool fromFolder = false;
};

// Files in the order given; a folder's *.json / *.json.gz files sorted by name. Errors name
// a path that does not exist or a folder with no trace files.
[[nodiscard]] Expected<std::vector<TraceArg>> expandTraceArgs(const std::vector<std::string>& args);

// Imports each file and hands it to `use` (one trace in memory at a time). A folder's file
// that is not a trace is skipped (its path and why go to `skipped`); any other error stops.
[[nodiscard]] Status forEachTrace(
    const std::vector<std::string>& args, const KinetoImportOptions& o,
    const std::function<Status(const std::string& path, Trace&& t)>& use,
    std::vector<std::string>* skipped = nullptr);

// Whether a trace is ShardScope's own (`run --trace`, `simulate --trace`): its events carry
// the step program's op ids.
[[nodiscard]] bool isShardScopeTrace(const Trace& t);

}  // namespace shardscope
