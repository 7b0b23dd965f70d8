// SPDX-License-Identifier: Apache-2.0
#include "profiler/analysis/trace_loader.h"

#include <algorithm>
#include <filesystem>

namespace shardscope {

namespace {
bool endsWith(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

Expected<std::vector<TraceArg>> expandTraceArgs(const std::vector<std::string>& args) {
    namespace fs = std::filesystem;
    std::vector<TraceArg> out;
    for (const auto& a : args) {
        std::error_code ec;
        const auto st = fs::status(a, ec);
        if (ec || !fs::exists(st)) return Error{a + ": no such file or folder"};
        if (!fs::is_directory(st)) {
            out.push_back({a, false});
            continue;
        }
        std::vector<std::string> files;
        for (const auto& e : fs::directory_iterator(a, ec)) {
            const std::string p = e.path().string();
            std::error_code fe;
            if (!e.is_regular_file(fe)) continue;
            if (endsWith(p, ".json") || endsWith(p, ".json.gz")) files.push_back(p);
        }
        if (ec) return Error{a + ": cannot list the folder: " + ec.message()};
        if (files.empty()) return Error{a + ": a folder with no .json or .json.gz trace files"};
        std::sort(files.begin(), files.end());
        for (auto& f : files)
            out.push_back({std::move(f), true});
    }
    return out;
}

Status forEachTrace(const std::vector<std::string>& args, const KinetoImportOptions& o,
                    const std::function<Status(const std::string& path, Trace&& t)>& use,
                    std::vector<std::string>* skipped) {
    auto files = expandTraceArgs(args);
    if (!files) return Error{files.error()};
    size_t used = 0;
    for (const auto& f : *files) {
        auto t = importKinetoFile(f.path, o);
        if (!t) {
            if (f.fromFolder && t.error().find("no traceEvents array") != std::string::npos) {
                if (skipped) skipped->push_back(f.path + " (not a trace: no traceEvents array)");
                continue;
            }
            return Error{t.error()};
        }
        ++used;
        if (auto st = use(f.path, std::move(*t)); !st) return st;
    }
    if (used == 0) return Error{"no traces among the files given"};
    return {};
}

bool isShardScopeTrace(const Trace& t) {
    return std::any_of(t.opId.begin(), t.opId.end(), [](int32_t id) { return id >= 0; });
}

}  // namespace shardscope
