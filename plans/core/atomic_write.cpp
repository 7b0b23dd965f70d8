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

Status writeFileAtomically(const std::string& path, std::string_view contents) {
    namespace fs = std::filesystem;
    const fs::path target(path);
    std::error_code ec;
    if (target.has_parent_path() && !fs::exists(target.parent_path(), ec))
        return Error{path + ": directory " + target.parent_path().string() + " does not exist"};
    std::string tmpl = path + ".tmp.XXXXXX";
    const int fd = ::mkstemp(tmpl.data());
    if (fd < 0) return Error{path + ": cannot create temporary file: " + std::strerror(errno)};
    size_t written = 0;
    while (written < contents.size()) {
        const ssize_t n = ::write(fd, contents.data() + written, contents.size() - written);
        if (n < 0) {
            if (errno == EINTR) continue;
            const std::string msg = std::strerror(errno);
            ::close(fd);
            ::unlink(tmpl.c_str());
            return Error{path + ": write failed: " + msg};
        }
        written += static_cast<size_t>(n);
    }
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
        const std::string msg = std::strerror(errno);
        ::unlink(tmpl.c_str());
        return Error{path + ": cannot flush: " + msg};
    }
    // mkstemp creates 0600; outputs are ordinary user files.
    ::chmod(tmpl.c_str(), 0644);
    if (std::rename(tmpl.c_str(), path.c_str()) != 0) {
        const std::string msg = std::strerror(errno);
        ::unlink(tmpl.c_str());
        return Error{path + ": cannot rename into place: " + msg};
    }
    return {};
}

}  // namespace shardscope
