// SPDX-License-Identifier: Apache-2.0
// shardscope: the command-line front end. Each subcommand lives in cmd_*.cpp and declares
// its options once (args.h); this file only dispatches.
#include <algorithm>
#include <iostream>
#include <map>
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
    for (auto* group :
         {&modelCommands, &planCommands, &fsdpTraceCommands, &simulateCommands, &recommendCommands,
          &collectiveCommands, &runCommands, &calibrateCommands, &traceCommands, &traceDiffCommands,
          &traceOverlapCommands, &benchCommands, &benchPublishedCommands, &doctorCommands})
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
    out << "  completion" << std::string(w > 10 ? w - 10 + 3 : 3, ' ')
        << "print a bash or zsh completion script: source <(shardscope completion bash)\n";
    out << "\nRun `shardscope COMMAND --help` for a command's options and examples.\n"
           "Start with: shardscope model show --model samples/models/llama3-8b/config.json\n";
}

// A completion script for bash (zsh through bashcompinit), made from the command specs:
// subcommands after a group, each command's options after a dash, an option's choices
// ("cpu|cuda") after it, files otherwise.
std::string completionScript(const std::string& shell, const std::vector<Command>& cmds) {
    std::ostringstream o;
    std::vector<std::string> groups;
    std::map<std::string, std::vector<std::string>> subs;  // group -> subcommands
    for (const auto& c : cmds) {
        const auto w = split(c.spec.name, ' ');
        if (std::find(groups.begin(), groups.end(), w[0]) == groups.end()) groups.push_back(w[0]);
        if (w.size() > 1) subs[w[0]].push_back(w[1]);
    }
    auto join = [](const std::vector<std::string>& v) {
        std::string r;
        for (const auto& x : v)
            r += (r.empty() ? "" : " ") + x;
        return r;
    };
    if (shell == "zsh") o << "autoload -U +X bashcompinit && bashcompinit\n";
    o << "# shardscope completion (" << shell << "): source <(shardscope completion " << shell
      << ")\n_shardscope() {\n"
         "    local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
         "    if (( COMP_CWORD == 1 )); then\n"
         "        COMPREPLY=( $(compgen -W \""
      << join(groups)
      << " completion --help --version\" -- \"$cur\") ); return; fi\n"
         "    local g=\"${COMP_WORDS[1]}\" subs=\"\"\n    case \"$g\" in\n";
    for (const auto& [g, v] : subs)
        o << "        " << g << ") subs=\"" << join(v) << "\" ;;\n";
    o << "        completion) COMPREPLY=( $(compgen -W \"bash zsh\" -- \"$cur\") ); return ;;\n"
         "    esac\n"
         "    if [[ -n \"$subs\" ]] && (( COMP_CWORD == 2 )); then\n"
         "        COMPREPLY=( $(compgen -W \"$subs --help\" -- \"$cur\") ); return; fi\n"
         "    local key=\"$g\"\n"
         "    [[ -n \"$subs\" ]] && key=\"$g ${COMP_WORDS[2]}\"\n"
         "    local opts=\"\"\n    case \"$key\" in\n";
    for (const auto& c : cmds) {
        std::vector<std::string> names{"--help"};
        for (const auto& op : c.spec.options) {
            names.push_back(op.name);
            if (!op.shortName.empty()) names.push_back(op.shortName);
        }
        o << "        \"" << c.spec.name << "\") opts=\"" << join(names) << "\" ;;\n";
    }
    o << "    esac\n    case \"$prev\" in\n";
    std::map<std::string, std::string> choices;  // option -> "a b"
    for (const auto& c : cmds)
        for (const auto& op : c.spec.options)
            if (op.metavar.find('|') != std::string::npos) {
                std::string words = op.metavar;
                std::replace(words.begin(), words.end(), '|', ' ');
                choices[op.name] = words;
            }
    for (const auto& [name, words] : choices)
        o << "        " << name << ") COMPREPLY=( $(compgen -W \"" << words
          << "\" -- \"$cur\") ); return ;;\n";
    o << "    esac\n"
         "    if [[ \"$cur\" == -* ]]; then\n"
         "        COMPREPLY=( $(compgen -W \"$opts\" -- \"$cur\") ); return; fi\n"
         "    COMPREPLY=( $(compgen -f -- \"$cur\") )\n"
         "}\n"
         "complete -o filenames -o bashdefault -F _shardscope shardscope\n";
    return o.str();
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
    if (args[0] == "completion") {
        const std::string shell = args.size() > 1 ? args[1] : "";
        if (shell != "bash" && shell != "zsh") {
            (shell == "--help" ? std::cout : std::cerr)
                << "Usage: shardscope completion bash|zsh\n\nPrints a completion script for "
                   "the shell. Load it in the current shell, or add the line to ~/.bashrc "
                   "(~/.zshrc):\n\n  source <(shardscope completion bash)\n";
            return shell == "--help" ? kExitOk : kExitUsage;
        }
        std::cout << completionScript(shell, cmds);
        return kExitOk;
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
