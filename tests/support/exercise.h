// SPDX-License-Identifier: Apache-2.0
#pragma once
// Everything that reads a loaded trace, run once: what the fuzzers (tests/fuzz and the
// randomised test_trace_fuzz) call on every trace the loader accepts, so that a trace which
// loads cannot crash any `trace` subcommand, `plan recover`, `calibrate --from-trace` or the
// allocator replay. No GoogleTest here: the libFuzzer harnesses link it too.
#include "plans/cluster/cluster.h"
#include "profiler/trace/trace.h"

namespace shardscope::fuzzing {

// `cluster`, when given, is the base `calibrate --from-trace` fits from.
void exerciseTrace(const Trace& t, const ClusterSpec* cluster = nullptr);

}  // namespace shardscope::fuzzing
