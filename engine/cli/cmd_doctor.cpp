// SPDX-License-Identifier: Apache-2.0
// `shardscope doctor`: what this build contains and what the runtime finds (LibTorch,
// its CUDA, NCCL and Gloo; CUPTI; Qt), so a user can tell why a capability is missing.
#include <iostream>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"

#ifdef SHARDSCOPE_HAVE_TORCH
#include "engine/exec/runtime_info.h"
#endif

namespace shardscope::cli {

namespace {

int runDoctor(const Args& a) {
    nlohmann::json j;
    j["version"] = SHARDSCOPE_VERSION;
    j["build"] = {{"gui", SHARDSCOPE_BUILT_GUI != 0},
                  {"libtorch", SHARDSCOPE_BUILT_TORCH != 0},
                  {"cuda", SHARDSCOPE_BUILT_CUDA != 0}};
#ifdef SHARDSCOPE_HAVE_TORCH
    j["runtime"] = exec::runtimeInfo();
#endif
    if (a.flag("--json")) return emitJson(j, "").ok() ? kExitOk : kExitUsage;
    std::cout << "shardscope " << SHARDSCOPE_VERSION << "\n"
              << "  GUI (Qt6)        " << (SHARDSCOPE_BUILT_GUI ? "built" : "not built") << "\n"
              << "  LibTorch engine  " << (SHARDSCOPE_BUILT_TORCH ? "built" : "not built") << "\n"
              << "  CUDA/CUPTI/NCCL  " << (SHARDSCOPE_BUILT_CUDA ? "built" : "not built") << "\n";
    if (j.contains("runtime"))
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
