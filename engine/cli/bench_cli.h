// SPDX-License-Identifier: Apache-2.0
#pragma once
// The `bench` subcommands implemented beside cmd_bench.cpp.
#include "engine/cli/args.h"

namespace shardscope::cli {

int runBenchImport(const Args& a);  // cmd_bench_io.cpp
int runBenchMemory(const Args& a);  // cmd_bench_io.cpp

}  // namespace shardscope::cli
