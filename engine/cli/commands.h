// SPDX-License-Identifier: Apache-2.0
#pragma once
// Every subcommand: its spec (for --help and the overview) and its entry point.
#include <string>
#include <vector>

#include "engine/cli/args.h"

namespace shardscope::cli {

struct Command {
    CommandSpec spec;
    int (*run)(const Args&);
};

std::vector<Command> modelCommands();
std::vector<Command> planCommands();
std::vector<Command> doctorCommands();
std::vector<Command> simulateCommands();
std::vector<Command> benchCommands();
std::vector<Command> recommendCommands();
std::vector<Command> traceCommands();
std::vector<Command> runCommands();
std::vector<Command> calibrateCommands();
std::vector<Command> traceDiffCommands();
std::vector<Command> traceOverlapCommands();
std::vector<Command> fsdpTraceCommands();
std::vector<Command> collectiveCommands();
std::vector<Command> benchPublishedCommands();

}  // namespace shardscope::cli
