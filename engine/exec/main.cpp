// SPDX-License-Identifier: Apache-2.0
// shardscope-engine: the LibTorch side of ShardScope, run as its own process so the
// `shardscope` command line never loads LibTorch (0.4 s and ~470 MB at start-up). The
// command line runs it for `doctor` (and, with the engine issue, for each rank of `run`).
#include <cstdio>
#include <cstring>

#include "engine/exec/runtime_info.h"

int main(int argc, char** argv) {
    if (argc >= 2 && std::strcmp(argv[1], "runtime-info") == 0) {
        const std::string out = shardscope::exec::runtimeInfo().dump(2) + "\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
    }
    std::fprintf(stderr,
                 "usage: shardscope-engine runtime-info\n"
                 "  prints what LibTorch offers this process (versions, CUDA devices, a real Gloo "
                 "all-reduce)\n"
                 "  as JSON; `shardscope doctor` runs it.\n");
    return argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)
               ? 0
               : 2;
}
