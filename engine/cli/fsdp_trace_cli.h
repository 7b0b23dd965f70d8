// SPDX-License-Identifier: Apache-2.0
#pragma once
#include "engine/cli/args.h"

namespace shardscope::cli {

// `trace overlap` on PyTorch profiler traces (cmd_fsdp_trace.cpp): per FSDP unit and phase.
int runPyTorchTraceOverlap(const Args& a);

}  // namespace shardscope::cli
