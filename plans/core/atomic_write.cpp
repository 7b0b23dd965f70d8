// SPDX-License-Identifier: Apache-2.0
#include "plans/core/atomic_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace shardscope {

namespace {

// Writes all of `contents` to `fd`; the errno of a failed write, else 0.
int writeAll(int fd, std::string_view contents) {
    size_t written = 0;
    while (written < contents.size()) {
        const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        written += static_cast<size_t>(n);
    }
    return 0;
}

}  // namespace

Status writeFileAtomically(const std::string& path, std::string_view contents) {
    namespace fs = std::filesystem;
    std::error_code ec;
    // A symbolic link stays a link: the file it points to is the one replaced.
    fs::path target(path);
    if (fs::is_symlink(target, ec)) {
        target = fs::weakly_canonical(target, ec);
        if (ec) return Error{path + ": cannot resolve the link: " + ec.message()};
    }
    const fs::file_status st = fs::status(target, ec);
    if (fs::is_directory(st)) return Error{path + ": a folder, where a file is to be written"};
    if (fs::exists(st) && !fs::is_regular_file(st)) {
        // A pipe, a terminal or a device (/dev/stdout, /dev/null, a FIFO a reader waits on):
        // written in place. A file beside it renamed over it would replace the device node.
        const int fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd < 0) return Error{path + ": cannot open: " + std::strerror(errno)};
        const int err = writeAll(fd, contents);
        const int closed = ::close(fd);
        if (err != 0) return Error{path + ": write failed: " + std::strerror(err)};
        if (closed != 0) return Error{path + ": write failed: " + std::strerror(errno)};
        return {};
    }
    if (target.has_parent_path() && !fs::exists(target.parent_path(), ec))
        return Error{path + ": directory " + target.parent_path().string() + " does not exist"};
    std::string tmpl = target.string() + ".tmp.XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) return Error{path + ": cannot create temporary file: " + std::strerror(errno)};
    if (const int err = writeAll(fd, contents); err != 0) {
        ::close(fd);
        ::unlink(tmpl.c_str());
        return Error{path + ": write failed: " + std::strerror(err)};
    }
    // A full disk may only show here (delayed allocation); the descriptor is closed either way.
    const int synced = ::fsync(fd);
    const int syncErr = errno;
    const int closed = ::close(fd);
    if (synced != 0 || closed != 0) {
        const std::string msg = std::strerror(synced != 0 ? syncErr : errno);
        ::unlink(tmpl.c_str());
        return Error{path + ": cannot flush: " + msg};
    }
    // mkstemp creates 0600; outputs are ordinary user files.
    ::chmod(tmpl.c_str(), 0644);
    if (std::rename(tmpl.c_str(), target.c_str()) != 0) {
        const std::string msg = std::strerror(errno);
        ::unlink(tmpl.c_str());
        return Error{path + ": cannot rename into place: " + msg};
    }
    return {};
}

Expected<std::string> makeTempFile(const std::string& prefix, const std::string& suffix) {
    std::error_code ec;
    std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
    if (ec) dir = "/tmp";
    std::string tmpl = (dir / (prefix + "-XXXXXX" + suffix)).string();
    const int fd = ::mkstemps(tmpl.data(), static_cast<int>(suffix.size()));
    if (fd < 0)
        return Error{"cannot create a temporary file from " + tmpl + ": " + std::strerror(errno)};
    ::close(fd);
    return tmpl;
}

}  // namespace shardscope
