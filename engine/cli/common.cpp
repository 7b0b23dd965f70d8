// SPDX-License-Identifier: Apache-2.0
#include "engine/cli/common.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "engine/cli/model_export.h"
#include "plans/core/atomic_write.h"
#include "plans/core/json_reader.h"
#include "plans/core/strings.h"

namespace shardscope::cli {

KinetoImportOptions traceImportOptions() {
    KinetoImportOptions o;
    const char* forced = std::getenv("SHARDSCOPE_PROGRESS");
    const bool always = forced && std::string(forced) == "1";
    if (!always && !::isatty(2)) return o;
    struct State {
        std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
        double last = 0;
        int shown = 0;  // quarters printed for the current file
    };
    auto st = std::make_shared<State>();
    o.progress = [st, always](double f) {
        const auto now = std::chrono::steady_clock::now();
        if (f < st->last) {  // the next file of a folder
            st->start = now;
            st->shown = 0;
        }
        st->last = f;
        const double s = std::chrono::duration<double>(now - st->start).count();
        const int quarter = static_cast<int>(f * 4.0);
        if ((!always && s < 1.0) || quarter <= st->shown || quarter >= 4) return;
        st->shown = quarter;
        std::fprintf(stderr, "reading the trace: %d%% (%.1f s)\n", quarter * 25, s);
    };
    return o;
}

bool readIntOptions(const Args& a, const std::vector<const char*>& names,
                    const std::vector<int64_t>& mins, std::vector<int64_t>& out) {
    out.assign(names.size(), 0);
    for (size_t i = 0; i < names.size(); ++i)
        if (a.has(names[i])) {
            auto v = a.getInt(names[i], mins[i]);
            if (!v) {
                std::cerr << "error: " << v.error() << "\n";
                return false;
            }
            out[i] = *v;
        }
    return true;
}

std::vector<OptionSpec> modelOptions(bool required) {
    return {
        {"--model", "FILE", "model: a Hugging Face config.json or a ShardScope model JSON", "",
         required, "-m"},
        {"--param-dtype", "DTYPE",
         "dtype of the trained parameters for Hugging Face configs (FSDP keeps fp32 masters)",
         "float32"},
        {"--activation-dtype", "DTYPE", "dtype activations are counted in for Hugging Face configs",
         "float32"},
        {"--no-export", "",
         "refuse a config.json whose model_type has no native loader, instead of building its "
         "model JSON with transformers (scripts/export_model.py, cached)"},
    };
}

Expected<ModelGraph> loadModelArg(const Args& a) {
    HfLoadOptions o;
    for (auto [opt, target] : {std::pair{"--param-dtype", &o.paramDtype},
                               std::pair{"--activation-dtype", &o.activationDtype}}) {
        const std::string v = a.get(opt);
        auto d = parseDType(v);
        if (!d)
            return Error{std::string(opt) + ": unknown dtype \"" + v + "\"" +
                         didYouMean(v, dtypeNames())};
        *target = *d;
    }
    // A Hugging Face model folder (what from_pretrained takes): its config.json.
    std::string path = a.get("--model");
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
        const std::string config = (std::filesystem::path(path) / "config.json").string();
        if (!std::filesystem::exists(config, ec))
            return Error{path +
                         ": a folder without a config.json (give a Hugging Face "
                         "config.json, a model folder holding one, or a ShardScope "
                         "model JSON)"};
        path = config;
    }
    // Read once; a config.json whose model_type has no native loader is exported with
    // transformers (cached), unless --no-export.
    auto j = readJsonFile(path);
    if (!j) return Error{j.error()};
    if (!a.flag("--no-export") && looksLikeHfConfig(*j)) {
        const auto& type = (*j)["model_type"];
        if (type.is_string() && !hfModelTypeSupported(type.get<std::string>())) {
            auto exported = exportedModelPath(path, type.get<std::string>(), o.paramDtype);
            if (!exported) return Error{exported.error()};
            return loadModelFile(*exported, o);
        }
    }
    return modelFromDocument(*j, path, o);
}

std::string setupPython() {
    const char* env = std::getenv("SHARDSCOPE_PYTHON");
    std::string python = env ? env : SHARDSCOPE_DEFAULT_PYTHON;
    return python.empty() ? "python3" : python;
}

ChildExit runChild(const std::vector<std::string>& argv, bool stdoutToStderr,
                   const std::vector<std::pair<std::string, std::string>>& env) {
    ChildExit r;
    if (argv.empty()) return r;
    const pid_t child = ::fork();
    if (child == 0) {
        if (stdoutToStderr) ::dup2(STDERR_FILENO, STDOUT_FILENO);
        for (const auto& [k, v] : env)
            ::setenv(k.c_str(), v.c_str(), 0);
        std::vector<std::string> copy = argv;
        std::vector<char*> args;
        for (auto& s : copy)
            args.push_back(s.data());
        args.push_back(nullptr);
        ::execvp(args[0], args.data());
        std::perror(("cannot run " + argv[0]).c_str());
        ::_exit(127);
    }
    int status = 0;
    if (child < 0 || ::waitpid(child, &status, 0) < 0) return r;
    r.started = true;
    r.exited = WIFEXITED(status);
    r.code = r.exited ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

std::vector<std::string> dataRoots() {
    // Once per process: where the binary is does not change while it runs.
    static const std::vector<std::string> found = [] {
        std::vector<std::string> roots;
        if (const char* d = std::getenv("SHARDSCOPE_DATA_DIR"); d && *d) roots.emplace_back(d);
        std::error_code ec;
        const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
        if (!ec) {
            const std::filesystem::path dir = exe.parent_path();
            roots.push_back((dir.parent_path() / "share" / "shardscope").string());
            roots.push_back(dir.parent_path().parent_path().string());
        }
        roots.emplace_back(SHARDSCOPE_SOURCE_ROOT);
        return roots;
    }();
    return found;
}

std::string dataPath(const std::string& path) {
    std::error_code ec;
    for (const std::string& root : dataRoots())
        if (const std::string p = root + "/" + path; std::filesystem::exists(p, ec)) return p;
    return std::string(SHARDSCOPE_SOURCE_ROOT) + "/" + path;
}

std::string samplePath(const std::string& path) {
    std::error_code ec;
    if (path.empty() || path[0] == '/' || std::filesystem::exists(path, ec)) return path;
    const std::string rooted = dataPath(path);
    return std::filesystem::exists(rooted, ec) ? rooted : path;
}

Expected<ClusterSpec> loadClusterNamed(const std::string& arg) {
    std::error_code ec;
    if (arg.empty() || arg.find('/') != std::string::npos || std::filesystem::exists(arg, ec))
        return loadClusterFile(arg);
    const std::string dir = samplePath("samples/clusters");
    const std::string stem = endsWith(arg, ".json") ? arg.substr(0, arg.size() - 5) : arg;
    const std::string bundled = dir + "/" + stem + ".json";
    if (std::filesystem::exists(bundled, ec)) return loadClusterFile(bundled);
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec))
        if (e.path().extension() == ".json") names.push_back(e.path().stem().string());
    std::sort(names.begin(), names.end());
    std::string msg =
        arg + ": no such file, and no bundled profile of that name" + didYouMean(stem, names);
    if (!names.empty()) {
        msg += "\n  bundled profiles (" + dir + "):";
        for (const std::string& n : names)
            msg += " " + n;
    }
    return Error{msg};
}

Expected<std::optional<ClusterSpec>> loadClusterArg(const Args& a) {
    if (!a.has("--cluster")) return std::optional<ClusterSpec>();
    auto c = loadClusterNamed(a.get("--cluster"));
    if (!c) return Error{c.error()};
    return std::optional<ClusterSpec>(std::move(*c));
}

Status emitJson(const nlohmann::json& j, const std::string& path) {
    // Names come from users' traces and models: invalid UTF-8 is replaced (U+FFFD), never
    // an exception.
    const std::string text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (path.empty() || path == "-") {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
        return {};
    }
    return writeFileAtomically(path, text);
}

Table::Table(std::vector<std::string> headers, std::vector<bool> rightAlign)
    : m_headers(std::move(headers)), m_right(std::move(rightAlign)) {
    m_right.resize(m_headers.size(), false);
}

void Table::row(std::vector<std::string> cells) {
    cells.resize(m_headers.size());
    m_rows.push_back(std::move(cells));
}

void Table::print(std::ostream& out) const {
    std::vector<size_t> w(m_headers.size());
    for (size_t c = 0; c < w.size(); ++c) {
        w[c] = m_headers[c].size();
        for (const auto& r : m_rows)
            w[c] = std::max(w[c], r[c].size());
    }
    auto line = [&](const std::vector<std::string>& cells) {
        std::string s;
        for (size_t c = 0; c < cells.size(); ++c) {
            const std::string pad(w[c] - cells[c].size(), ' ');
            s += m_right[c] ? pad + cells[c] : cells[c] + (c + 1 < cells.size() ? pad : "");
            if (c + 1 < cells.size()) s += "  ";
        }
        while (!s.empty() && s.back() == ' ')
            s.pop_back();
        out << s << "\n";
    };
    line(m_headers);
    for (const auto& r : m_rows)
        line(r);
}

std::string formatFlops(double flops) {
    static const char* units[] = {"", "K", "M", "G", "T", "P", "E"};
    int u = 0;
    while (flops >= 1000.0 && u < 6) {
        flops /= 1000.0;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, u ? "%.2f %sFLOP" : "%.0f FLOP", flops, units[u]);
    return buf;
}

std::string formatMs(double ns, int decimals) {
    char b[48];
    std::snprintf(b, sizeof b, "%.*f ms", decimals, ns * 1e-6);
    return b;
}

std::string formatMiB(double bytes) {
    char b[48];
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / 1048576.0);
    return b;
}

std::string formatError(double reference, double value) {
    if (reference == 0) return "-";
    char b[48];
    std::snprintf(b, sizeof b, "%+.1f%%", (value - reference) / reference * 100.0);
    return b;
}

}  // namespace shardscope::cli
