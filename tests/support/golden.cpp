// SPDX-License-Identifier: Apache-2.0
#include "tests/support/golden.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace shardscope::test {

std::string sourcePath(const std::string& relative) {
    return std::string(SHARDSCOPE_SOURCE_DIR) + "/tests/" + relative;
}

std::string samplePath(const std::string& relative) {
    return std::string(SHARDSCOPE_SOURCE_DIR) + "/samples/" + relative;
}

std::filesystem::path testTempDir() {
    static const std::filesystem::path dir = [] {
        std::error_code ec;
        std::filesystem::path base = std::filesystem::temp_directory_path(ec);
        if (ec) base = "/tmp";
        std::string tmpl = (base / "shardscope-test-XXXXXX").string();
        if (!::mkdtemp(tmpl.data())) {
            std::perror("mkdtemp");
            std::abort();
        }
        return std::filesystem::path(tmpl);
    }();
    return dir;
}

CommandResult runCommand(const std::string& command, bool mergeStderr) {
    CommandResult r;
    const std::string cmd = command + (mergeStderr ? " 2>&1" : " 2>/dev/null");
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0)
        r.out.append(buf, n);
    const int st = ::pclose(p);
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return r;
}

::testing::AssertionResult matchesGolden(const std::string& name, const std::string& actual) {
    namespace fs = std::filesystem;
    const std::string golden = sourcePath("golden/" + name);
    const std::string actualPath = golden + ".actual";
    if (const char* u = std::getenv("SHARDSCOPE_UPDATE_GOLDEN"); u && std::string(u) == "1") {
        fs::create_directories(fs::path(golden).parent_path());
        std::ofstream(golden, std::ios::binary) << actual;
        return ::testing::AssertionSuccess() << "updated " << golden;
    }
    std::ifstream in(golden, std::ios::binary);
    if (!in) {
        std::ofstream(actualPath, std::ios::binary) << actual;
        return ::testing::AssertionFailure()
               << "golden file " << golden << " is missing; wrote " << actualPath
               << " (rerun with SHARDSCOPE_UPDATE_GOLDEN=1 to create it)";
    }
    std::stringstream ss;
    ss << in.rdbuf();
    if (ss.str() == actual) {
        std::error_code ec;
        fs::remove(actualPath, ec);
        return ::testing::AssertionSuccess();
    }
    std::ofstream(actualPath, std::ios::binary) << actual;
    const auto diff = runCommand("diff -u '" + golden + "' '" + actualPath + "'", true);
    return ::testing::AssertionFailure() << "output differs from " << golden << "\n"
                                         << diff.out << "(actual written to " << actualPath << ")";
}

}  // namespace shardscope::test
