// SPDX-License-Identifier: Apache-2.0
// Every output goes through writeFileAtomically: a full disk loses nothing that was there, a
// pipe or device is written in place (never replaced by a regular file), a link stays a link.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "plans/core/atomic_write.h"
#include "tests/support/golden.h"

namespace fs = std::filesystem;
using namespace shardscope;

namespace {

fs::path scratch(const char* name) {
    const fs::path dir =
        shardscope::test::testTempDir() / ("shardscope-atomic-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const fs::path p = dir / name;
    std::error_code ec;
    fs::remove(p, ec);
    return p;
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

bool leftoverTemporaries(const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
    return false;
}

}  // namespace

TEST(AtomicWrite, ReplacesARegularFileWhole) {
    const fs::path p = scratch("plain.json");
    ASSERT_TRUE(writeFileAtomically(p.string(), "first\n").ok());
    ASSERT_TRUE(writeFileAtomically(p.string(), "second\n").ok());
    EXPECT_EQ(slurp(p), "second\n");
    EXPECT_FALSE(leftoverTemporaries(p.parent_path()));
}

TEST(AtomicWrite, AFifoIsWrittenInPlaceNotReplaced) {
    // Before: the FIFO was replaced by a regular file and its reader never saw the output.
    const fs::path p = scratch("pipe");
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0) << std::strerror(errno);
    std::string got;
    std::thread reader([&] { got = slurp(p); });
    const Status st = writeFileAtomically(p.string(), "through the pipe\n");
    reader.join();
    ASSERT_TRUE(st.ok()) << st.error();
    EXPECT_EQ(got, "through the pipe\n");
    EXPECT_TRUE(fs::is_fifo(p));
}

TEST(AtomicWrite, AFullDeviceIsAnErrorAndStaysADevice) {
    // As root, a rename over a device used to replace its node with a regular file (found
    // on this project's machine: /dev/null had become one). /dev/full, not /dev/null, so
    // that a regression cannot break the machine's /dev/null.
    if (!fs::is_character_file("/dev/full")) GTEST_SKIP() << "needs /dev/full";
    const Status st = writeFileAtomically("/dev/full", "no room\n");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().find("/dev/full"), std::string::npos) << st.error();
    EXPECT_NE(st.error().find("No space left on device"), std::string::npos) << st.error();
    EXPECT_TRUE(fs::is_character_file("/dev/full"));
}

TEST(AtomicWrite, ALinkStaysALinkAndItsTargetIsReplaced) {
    const fs::path target = scratch("real.json"), link = scratch("link.json");
    ASSERT_TRUE(writeFileAtomically(target.string(), "old\n").ok());
    fs::create_symlink(target, link);
    ASSERT_TRUE(writeFileAtomically(link.string(), "new\n").ok());
    EXPECT_TRUE(fs::is_symlink(link));
    EXPECT_EQ(slurp(target), "new\n");
}

TEST(AtomicWrite, AFolderIsRefusedNamingIt) {
    const fs::path d = scratch("folder");
    fs::create_directories(d);
    const Status st = writeFileAtomically(d.string(), "x");
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().find("a folder"), std::string::npos) << st.error();
}

TEST(AtomicWrite, AFullDiskKeepsTheOldFileAndLeavesNoTemporary) {
    // A 64 KiB tmpfs: mounting one needs CAP_SYS_ADMIN (root in a container that allows it).
    const fs::path dir = scratch("small-fs");
    fs::create_directories(dir);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") != 0)
        GTEST_SKIP() << "needs permission to mount a small tmpfs (" << std::strerror(errno) << ")";
    struct Unmount {
        fs::path d;
        ~Unmount() { ::umount(d.c_str()); }
    } unmount{dir};
    const fs::path p = dir / "out.json";
    ASSERT_TRUE(writeFileAtomically(p.string(), "good\n").ok());
    const Status st = writeFileAtomically(p.string(), std::string(256 * 1024, 'x'));
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().find(p.string()), std::string::npos) << st.error();
    EXPECT_NE(st.error().find("No space left on device"), std::string::npos) << st.error();
    EXPECT_EQ(slurp(p), "good\n");
    EXPECT_FALSE(leftoverTemporaries(dir));
}
