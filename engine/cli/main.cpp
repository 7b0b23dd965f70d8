// SPDX-License-Identifier: Apache-2.0
// shardscope: the command-line front end. Each subcommand lives in cmd_*.cpp and declares
// its options once (args.h); this file only dispatches.
#include <iostream>
#include <string>
#include <vector>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "plans/core/strings.h"

using namespace shardscope;
using namespace shardscope::cli;

namespace {

std::vector<Command> allCommands() {
    std::vector<Command> all;
    for (auto* group : {&modelCommands, &planCommands, &fsdpTraceCommands, &simulateCommands,
                        &recommendCommands, &runCommands, &calibrateCommands, &traceCommands,
                        &traceDiffCommands, &traceOverlapCommands, &benchCommands, &doctorCommands})
        for (auto& c : group())
            all.push_back(std::move(c));
    return all;
}

void printOverview(std::ostream& out, const std::vector<Command>& cmds) {
    out << "shardscope " << SHARDSCOPE_VERSION
        << " - plan, simulate and profile FSDP sharding (FSDP2 fully_shard, FSDP1, Lightning)\n\n"
           "Usage: shardscope COMMAND [SUBCOMMAND] [options]\n\nCommands:\n";
    size_t w = 0;
    for (const auto& c : cmds)
        w = std::max(w, c.spec.name.size());
    for (const auto& c : cmds)
        out << "  " << c.spec.name << std::string(w - c.spec.name.size() + 3, ' ') << c.spec.summary
            << "\n";
    out << "\nRun `shardscope COMMAND --help` for a command's options and examples.\n"
           "Start with: shardscope model show --model samples/models/llama3-8b/config.json\n";
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    const auto cmds = allCommands();
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
        if (args.size() > 1 && args[0] == "help") {
            args.erase(args.begin());
            args.push_back("--help");
        } else {
            printOverview(std::cout, cmds);
            return args.empty() ? kExitUsage : kExitOk;
        }
    }
    if (args[0] == "--version") {
        std::cout << "shardscope " << SHARDSCOPE_VERSION << "\n";
        return 0;
    }
    // Longest match of command words: "plan show" before "plan".
    const Command* match = nullptr;
    size_t used = 0;
    for (const auto& c : cmds) {
        const auto words = split(c.spec.name, ' ');
        if (words.size() > args.size()) continue;
        bool ok = true;
        for (size_t i = 0; i < words.size(); ++i)
            ok = ok && words[i] == args[i];
        if (ok && words.size() > used) {
            match = &c;
            used = words.size();
        }
    }
    if (!match) {
        std::vector<std::string> names, firstWords;
        for (const auto& c : cmds) {
            names.push_back(c.spec.name);
            firstWords.push_back(split(c.spec.name, ' ')[0]);
        }
        const std::string given =
            args.size() > 1 && args[1][0] != '-' ? args[0] + " " + args[1] : args[0];
        bool groupKnown = false;
        for (const auto& f : firstWords)
            groupKnown = groupKnown || f == args[0];
        if (groupKnown) {
            // `shardscope trace --help` is a request for the group's subcommands: answered on
            // stdout with success; a bare or mistyped group is a usage error.
            const bool help = wantsHelp({args.begin() + 1, args.end()});
            std::ostream& out = help ? std::cout : std::cerr;
            out << "shardscope " << args[0] << ": "
                << (help ? "subcommands" : "choose a subcommand") << ":\n";
            for (const auto& c : cmds)
                if (split(c.spec.name, ' ')[0] == args[0])
                    out << "  shardscope " << c.spec.name << "   " << c.spec.summary << "\n";
            if (help) {
                out << "\nRun `shardscope " << args[0]
                    << " SUBCOMMAND --help` for its options and examples.\n";
                return kExitOk;
            }
        } else {
            std::cerr << "shardscope: unknown command \"" << given << "\""
                      << didYouMean(args[0], firstWords)
                      << "\n(run `shardscope --help` for the list)\n";
        }
        return kExitUsage;
    }
    std::vector<std::string> rest(args.begin() + static_cast<long>(used), args.end());
    if (wantsHelp(rest)) {
        std::cout << helpText(match->spec);
        return kExitOk;
    }
    auto parsed = parseArgs(match->spec, rest);
    if (!parsed) {
        std::cerr << "error: " << parsed.error() << "\n";
        return kExitUsage;
    }
    try {
        return match->run(*parsed);
    } catch (const std::exception& e) {
        // Loaders return errors as values; reaching here is a bug, reported as one.
        std::cerr << "internal error in `shardscope " << match->spec.name << "`: " << e.what()
                  << "\nplease report it with the command line and input files\n";
        return 3;
    }
}
