// SPDX-License-Identifier: Apache-2.0
#pragma once
// A small declarative argument parser: each command declares its options once, and the
// same declaration drives parsing, error messages (with "did you mean") and --help.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "plans/core/expected.h"

namespace shardscope::cli {

struct OptionSpec {
    std::string name{};     // "--model"
    std::string metavar{};  // "FILE"; empty for a flag
    std::string help{};
    std::string defaultValue{};  // shown in --help; applied when absent
    bool required = false;
    std::string shortName{};  // "-o"
};

struct CommandSpec {
    std::string name;  // "plan show"
    std::string summary;
    std::string description;  // paragraphs for --help
    std::vector<OptionSpec> options;
    std::string positionalsMetavar;  // "FILE..." when the command takes positionals
    std::vector<std::string> examples;
};

class Args {
public:
    [[nodiscard]] bool has(const std::string& name) const { return m_values.count(name) > 0; }
    [[nodiscard]] std::string get(const std::string& name) const;  // "" when absent
    [[nodiscard]] bool flag(const std::string& name) const { return has(name); }
    // True only when the user wrote the option (has() is also true for a default).
    [[nodiscard]] bool given(const std::string& name) const { return m_given.count(name) > 0; }
    [[nodiscard]] Expected<int64_t> getInt(const std::string& name, int64_t minimum) const;
    [[nodiscard]] const std::vector<std::string>& positionals() const { return m_positionals; }

private:
    friend Expected<Args> parseArgs(const CommandSpec&, const std::vector<std::string>&);
    std::map<std::string, std::string> m_values;
    std::set<std::string> m_given;  // options the user gave (not defaulted)
    std::vector<std::string> m_positionals;
};

// Parses argv after the command words. `--help` is handled by the caller first.
[[nodiscard]] Expected<Args> parseArgs(const CommandSpec& spec,
                                       const std::vector<std::string>& argv);
[[nodiscard]] std::string helpText(const CommandSpec& spec);
[[nodiscard]] bool wantsHelp(const std::vector<std::string>& argv);

}  // namespace shardscope::cli
