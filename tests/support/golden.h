// SPDX-License-Identifier: Apache-2.0
#pragma once
// Golden-file checks (after hotspot and heaptrack): compare `actual` with
// tests/golden/<name>. On mismatch, write <name>.actual beside the golden file and return
// a unified diff for the failure message. SHARDSCOPE_UPDATE_GOLDEN=1 rewrites the golden
// file instead (review the git diff before committing it).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace shardscope::test {

// Path of a file under tests/ in the source tree.
std::string sourcePath(const std::string& relative);
// Path of a file under samples/ in the source tree.
std::string samplePath(const std::string& relative);
// This test process's own temporary folder (mkdtemp in $TMPDIR, made on first use): tests
// put their files there, never at a fixed name another user could have planted first.
std::filesystem::path testTempDir();

::testing::AssertionResult matchesGolden(const std::string& name, const std::string& actual);

// Runs a command, returns its exit status and captures stdout (and stderr if asked).
struct CommandResult {
    int status = -1;
    std::string out;
};
CommandResult runCommand(const std::string& command, bool mergeStderr = false);

}  // namespace shardscope::test
