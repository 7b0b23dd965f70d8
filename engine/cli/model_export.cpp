// SPDX-License-Identifier: Apache-2.0
#include "engine/cli/model_export.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include "engine/cli/common.h"

namespace shardscope::cli {

namespace {

std::optional<std::string> readAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

// FNV-1a, 64 bits: a cache key, not a security boundary.
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ULL) {
    for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ULL;
    }
    return h;
}

}  // namespace

// What an exported family's figures stand for, where that differs from what training runs.
// The hybrid linear-attention families are exported rather than loaded natively: their
// recurrent layers' cost lives in fused GPU kernels (flash-linear-attention's Gated DeltaNet,
// MiniMax's lightning attention) that have no CPU implementation to check a formula against,
// and transformers without them runs a PyTorch fallback, which is what the exporter measures.
std::string exportCaveat(const std::string& configPath, const std::string& modelType) {
    if (modelType != "qwen3_next" && modelType != "minimax") return "";
    return "note: " + configPath + ": its linear-attention layers (" +
           (modelType == "qwen3_next" ? std::string("Gated DeltaNet")
                                      : std::string("lightning attention")) +
           ") are priced as transformers' PyTorch fallback runs them (the chunked recurrence "
           "as matmuls, its intermediates saved), not the fused kernels training uses: their "
           "saved activations and time are upper bounds; calibrate from a GPU trace "
           "(shardscope calibrate --from-trace) for figures to trust\n";
}

std::string modelCacheDir() {
    if (const char* d = std::getenv("SHARDSCOPE_CACHE"); d && *d) return d;
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
        return std::string(x) + "/shardscope";
    const char* home = std::getenv("HOME");
    return std::string(home && *home ? home : "/tmp") + "/.cache/shardscope";
}

Expected<std::string> exportedModelPath(const std::string& configPath, const std::string& modelType,
                                        DType dtype) {
    const std::string script = dataPath("scripts/export_model.py");
    const auto config = readAll(configPath);
    if (!config) return Error{configPath + ": cannot read"};
    const auto exporter = readAll(script);
    if (!exporter)
        return Error{configPath + ": model_type \"" + modelType +
                     "\" has no native loader, and the exporter (" + script +
                     ") is not there to build it: export it with scripts/export_model.py from "
                     "a checkout and pass the JSON"};
    char key[17];
    std::snprintf(key, sizeof key, "%016llx",
                  static_cast<unsigned long long>(
                      fnv1a(std::string(dtypeName(dtype)), fnv1a(*exporter, fnv1a(*config)))));
    const std::filesystem::path dir = std::filesystem::path(modelCacheDir()) / "models";
    const std::string out = (dir / (modelType + "-" + key + ".json")).string();
    std::error_code ec;
    if (std::filesystem::exists(out, ec)) {
        std::cerr << "note: " << configPath << ": model_type \"" << modelType
                  << "\" has no native loader: using its exported model JSON " << out << "\n"
                  << exportCaveat(configPath, modelType);
        return out;
    }
    std::filesystem::create_directories(dir, ec);
    if (ec) return Error{dir.string() + ": cannot create the model cache: " + ec.message()};
    const std::string python = setupPython();
    std::cerr << "note: " << configPath << ": model_type \"" << modelType
              << "\" has no native loader: building its model JSON with transformers "
                 "(scripts/export_model.py), once; cached as "
              << out << " (--no-export refuses instead)\n"
              << std::flush;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::string> argv = {
        python,    script,   "--hf-config", configPath,
        "--input", "tokens", "--dtype",     std::string(dtypeName(dtype)),
        "-o",      out};
    const ChildExit r = runChild(argv, /*stdoutToStderr=*/true);
    if (!r.started) return Error{"cannot start " + python + " to export " + configPath};
    const int code = r.code;
    if (code != 0 || !std::filesystem::exists(out, ec))
        return Error{configPath + ": exporting model_type \"" + modelType + "\" with " + python +
                     " scripts/export_model.py failed (exit " + std::to_string(code) +
                     "; its messages are above). It needs torch and transformers (`bash "
                     "scripts/setup.sh build`, or set SHARDSCOPE_PYTHON); or export the model "
                     "yourself and pass the JSON"};
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "note: exported in %.1f s\n", s);
    std::cerr << exportCaveat(configPath, modelType);
    return out;
}

}  // namespace shardscope::cli
