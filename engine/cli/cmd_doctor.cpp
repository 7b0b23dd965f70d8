// SPDX-License-Identifier: Apache-2.0
// `shardscope doctor`: what this build contains and what the runtime finds (LibTorch,
// its CUDA, NCCL and Gloo; CUPTI; Qt), so a user can tell why a capability is missing.
#include <iostream>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

namespace shardscope::cli {

namespace {

// Runs the sibling `shardscope-engine runtime-info` and returns its JSON (null when the
// engine is not built or fails; `why` says which).
nlohmann::json engineRuntimeInfo(std::string& why) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    const fs::path engine = self.parent_path() / "shardscope-engine";
    if (ec || !fs::exists(engine)) {
        why = "shardscope-engine not found beside " + self.string();
        return nullptr;
    }
    FILE* p = ::popen(("'" + engine.string() + "' runtime-info 2>&1").c_str(), "r");
    if (!p) {
        why = "cannot run " + engine.string();
        return nullptr;
    }
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
        out.append(buf, n);
    const int st = ::pclose(p);
    auto j = nlohmann::json::parse(out, nullptr, false);
    if (st != 0 || j.is_discarded()) {
        why = engine.string() + " failed: " + out.substr(0, 500);
        return nullptr;
    }
    return j;
}

int runDoctor(const Args& a) {
    nlohmann::json j;
    j["version"] = SHARDSCOPE_VERSION;
    j["build"] = {{"gui", SHARDSCOPE_BUILT_GUI != 0},
                  {"libtorch", SHARDSCOPE_BUILT_TORCH != 0},
                  {"cuda", SHARDSCOPE_BUILT_CUDA != 0}};
    std::string why;
    if (SHARDSCOPE_BUILT_TORCH) {
        j["runtime"] = engineRuntimeInfo(why);
        if (j["runtime"].is_null()) j["runtime_error"] = why;
    }
    if (a.flag("--json")) return emitJson(j, "").ok() ? kExitOk : kExitUsage;
    std::cout << "shardscope " << SHARDSCOPE_VERSION << "\n"
              << "  GUI (Qt6)        " << (SHARDSCOPE_BUILT_GUI ? "built" : "not built") << "\n"
              << "  LibTorch engine  " << (SHARDSCOPE_BUILT_TORCH ? "built" : "not built") << "\n"
              << "  CUDA/CUPTI/NCCL  " << (SHARDSCOPE_BUILT_CUDA ? "built" : "not built") << "\n";
    if (!why.empty()) std::cout << "  engine runtime   unavailable: " << why << "\n";
    if (j.contains("runtime") && j["runtime"].is_object())
        for (auto it = j["runtime"].begin(); it != j["runtime"].end(); ++it)
            std::cout << "  " << it.key()
                      << std::string(it.key().size() < 17 ? 17 - it.key().size() : 1, ' ')
                      << (it->is_string() ? it->get<std::string>() : it->dump()) << "\n";
    return kExitOk;
}

}  // namespace

std::vector<Command> doctorCommands() {
    CommandSpec s;
    s.name = "doctor";
    s.summary =
        "Report what this build contains and what the runtime finds (LibTorch, CUDA, NCCL, Gloo).";
    s.options = {{"--json", "", "print JSON"}};
    return {{s, runDoctor}};
}

}  // namespace shardscope::cli
