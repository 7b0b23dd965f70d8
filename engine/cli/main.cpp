// SPDX-License-Identifier: Apache-2.0
// shardscope: the command-line front end. Each subcommand lives in cmd_*.cpp and declares
// its options once (args.h); this file only dispatches.
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
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

// Writes to two stream buffers: stderr as it happens, and a copy for --json's error object.
class TeeBuf : public std::streambuf {
public:
    TeeBuf(std::streambuf* a, std::streambuf* b) : m_a(a), m_b(b) {}

protected:
    int overflow(int c) override {
        if (c == traits_type::eof()) return traits_type::not_eof(c);
        const auto ch = traits_type::to_char_type(c);
        m_a->sputc(ch);
        m_b->sputc(ch);
        return c;
    }
    std::streamsize xsputn(const char* s, std::streamsize n) override {
        m_a->sputn(s, n);
        m_b->sputn(s, n);
        return n;
    }
    int sync() override { return m_a->pubsync(); }

private:
    std::streambuf* m_a;
    std::streambuf* m_b;
};

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
    // With --json, a usage or input error (exit 2) or an internal one (3) is also a JSON object
    // on stdout, {"error": ..., "exit_code": ...}, for scripts that parse the output; the
    // message still goes to stderr.
    const bool json = std::find(rest.begin(), rest.end(), "--json") != rest.end();
    std::ostringstream captured;
    TeeBuf tee(std::cerr.rdbuf(), captured.rdbuf());  // stderr stays live (progress, logs)
    std::streambuf* errBuf = nullptr;
    if (json) errBuf = std::cerr.rdbuf(&tee);
    int rc = 0;
    try {
        rc = match->run(*parsed);
    } catch (const std::exception& e) {
        // Loaders return errors as values; reaching here is a bug, reported as one.
        std::cerr << "internal error in `shardscope " << match->spec.name << "`: " << e.what()
                  << "\nplease report it with the command line and input files\n";
        rc = 3;
    }
    if (json) {
        std::cerr.rdbuf(errBuf);
        if (rc == kExitUsage || rc == 3) {
            std::string message = captured.str();
            while (!message.empty() && message.back() == '\n')
                message.pop_back();
            std::cout << nlohmann::json{{"error", message}, {"exit_code", rc}}.dump(
                             2, ' ', false, nlohmann::json::error_handler_t::replace)
                      << "\n";
        }
    }
    return rc;
}
