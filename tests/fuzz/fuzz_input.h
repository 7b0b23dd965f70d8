// SPDX-License-Identifier: Apache-2.0
#pragma once
// What every libFuzzer harness shares: the input written to a file (the loaders read files,
// as users give them), plain or gzip-compressed, in a folder of this process.
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace shardscope::fuzzing {

inline std::string inputPath(const std::string& name) {
    static const std::string dir = [] {
        const char* tmp = std::getenv("TMPDIR");
        std::string d = std::string(tmp && *tmp ? tmp : "/tmp") + "/shardscope-fuzz-" +
                        std::to_string(::getpid());
        std::filesystem::create_directories(d);
        return d;
    }();
    return dir + "/" + name;
}

inline std::string writeInput(const uint8_t* data, size_t size, const std::string& name,
                              bool gzip = false) {
    const std::string path = inputPath(name);
    if (gzip) {
        gzFile f = gzopen(path.c_str(), "wb1");
        if (f) {
            if (size) gzwrite(f, data, static_cast<unsigned>(size));
            gzclose(f);
        }
    } else if (FILE* f = std::fopen(path.c_str(), "wb")) {
        if (size) std::fwrite(data, 1, size, f);
        std::fclose(f);
    }
    return path;
}

// A sample of the source tree (the seed model, plan and cluster the harnesses resolve with).
inline std::string sample(const std::string& rel) {
    return std::string(SHARDSCOPE_SOURCE_DIR) + "/samples/" + rel;
}

}  // namespace shardscope::fuzzing
