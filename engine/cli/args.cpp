// SPDX-License-Identifier: Apache-2.0
#include "engine/cli/args.h"

#include <algorithm>

#include <sstream>

#include "plans/core/strings.h"

namespace shardscope::cli {

std::string Args::get(const std::string& name) const {
    auto it = m_values.find(name);
    return it == m_values.end() ? std::string() : it->second;
}

Expected<int64_t> Args::getInt(const std::string& name, int64_t minimum) const {
    const std::string v = get(name);
    try {
        size_t used = 0;
        const long long n = std::stoll(v, &used);
        if (used != v.size()) throw std::invalid_argument(v);
        if (n < minimum)
            return Error{name + ": expected an integer >= " + std::to_string(minimum) + ", got " +
                         v};
        return static_cast<int64_t>(n);
    } catch (const std::exception&) {
        return Error{name + ": expected an integer, got \"" + v + "\""};
    }
}

bool wantsHelp(const std::vector<std::string>& argv) {
    for (const auto& a : argv)
        if (a == "--help" || a == "-h") return true;
    return false;
}

Expected<Args> parseArgs(const CommandSpec& spec, const std::vector<std::string>& argv) {
    Args args;
    std::vector<std::string> names;
    for (const auto& o : spec.options)
        names.push_back(o.name);
    for (size_t i = 0; i < argv.size(); ++i) {
        std::string a = argv[i];
        if (a.size() > 1 && a[0] == '-' && a != "-") {
            std::string value;
            bool hasInlineValue = false;
            if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
                value = a.substr(eq + 1);
                a = a.substr(0, eq);
                hasInlineValue = true;
            }
            const OptionSpec* opt = nullptr;
            for (const auto& o : spec.options)
                if (o.name == a || (!o.shortName.empty() && o.shortName == a)) opt = &o;
            if (!opt)
                return Error{"shardscope " + spec.name + ": unknown option " + a +
                             didYouMean(a, names) + "\n(see: shardscope " + spec.name + " --help)"};
            if (opt->metavar.empty()) {
                if (hasInlineValue) return Error{opt->name + " takes no value"};
                args.m_values[opt->name] = "1";
                args.m_given.insert(opt->name);
                continue;
            }
            if (!hasInlineValue) {
                if (i + 1 >= argv.size())
                    return Error{"shardscope " + spec.name + ": " + opt->name + " needs a value (" +
                                 opt->metavar + ")"};
                value = argv[++i];
            }
            args.m_values[opt->name] = value;
            args.m_given.insert(opt->name);
        } else {
            // `shardscope model show config.json`: a command that takes a model and no
            // positionals reads a bare argument as its --model.
            const bool takesModel =
                std::any_of(spec.options.begin(), spec.options.end(),
                            [](const OptionSpec& o) { return o.name == "--model"; });
            if (spec.positionalsMetavar.empty() && takesModel && !args.has("--model")) {
                args.m_values["--model"] = a;
                args.m_given.insert("--model");
                continue;
            }
            if (spec.positionalsMetavar.empty())
                return Error{"shardscope " + spec.name + ": unexpected argument \"" + a + "\"" +
                             "\n(see: shardscope " + spec.name + " --help)"};
            args.m_positionals.push_back(a);
        }
    }
    for (const auto& o : spec.options) {
        if (!args.has(o.name) && !o.defaultValue.empty() && !o.metavar.empty())
            args.m_values[o.name] = o.defaultValue;
        if (o.required && !args.has(o.name))
            return Error{"shardscope " + spec.name + ": missing " + o.name + " " + o.metavar +
                         "\n(see: shardscope " + spec.name + " --help)"};
    }
    return args;
}

std::string helpText(const CommandSpec& spec) {
    std::ostringstream out;
    out << "Usage: shardscope " << spec.name;
    for (const auto& o : spec.options)
        if (o.required) out << " " << o.name << " " << o.metavar;
    out << " [options]";
    if (!spec.positionalsMetavar.empty()) out << " " << spec.positionalsMetavar;
    out << "\n\n" << spec.summary << "\n";
    if (!spec.description.empty()) out << "\n" << spec.description << "\n";
    if (!spec.options.empty()) {
        out << "\nOptions:\n";
        size_t width = 0;
        std::vector<std::string> heads;
        for (const auto& o : spec.options) {
            std::string h = "  " + (o.shortName.empty() ? "" : o.shortName + ", ") + o.name;
            if (!o.metavar.empty()) h += " " + o.metavar;
            heads.push_back(h);
            width = std::max(width, h.size());
        }
        for (size_t i = 0; i < spec.options.size(); ++i) {
            const auto& o = spec.options[i];
            out << heads[i] << std::string(width - heads[i].size() + 2, ' ') << o.help;
            if (o.required) out << " (required)";
            if (!o.defaultValue.empty()) out << " [default: " << o.defaultValue << "]";
            out << "\n";
        }
        out << "  -h, --help" << std::string(width > 10 ? width - 10 + 2 : 2, ' ')
            << "show this help\n";
    }
    if (!spec.examples.empty()) {
        out << "\nExamples:\n";
        for (const auto& e : spec.examples)
            out << "  " << e << "\n";
    }
    return out.str();
}

}  // namespace shardscope::cli
