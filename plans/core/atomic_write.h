// SPDX-License-Identifier: Apache-2.0
#pragma once
// Outputs are written to a temporary file beside the target and renamed into place, so an
// interrupted run or a full disk never leaves a truncated file where a good one was. A
// symbolic link stays a link (its target is replaced); a pipe, terminal or device
// (/dev/stdout, /dev/null, a FIFO) is written in place, never replaced by a file.
#include <string>
#include <string_view>

#include "plans/core/expected.h"

namespace shardscope {

[[nodiscard]] Status writeFileAtomically(const std::string& path, std::string_view contents);

// A new, empty file of this process's own in $TMPDIR (else /tmp), named
// <prefix>-XXXXXX<suffix> with mkstemps: created exclusively, mode 0600, so no other user
// can have planted a file or a link under that name first. Returns its path.
[[nodiscard]] Expected<std::string> makeTempFile(const std::string& prefix,
                                                 const std::string& suffix = "");

}  // namespace shardscope
