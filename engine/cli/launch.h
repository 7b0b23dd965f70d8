// SPDX-License-Identifier: Apache-2.0
#pragma once
// Local ranks of `shardscope-engine` (for `run` and `calibrate --measure`): found beside
// this binary, started with the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE,
// MASTER_ADDR=127.0.0.1, a free MASTER_PORT), each rank's log in the run's folder, watched
// until all exit; all are stopped when one fails or on Ctrl-C.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "plans/core/expected.h"

namespace shardscope::cli {

// shardscope-engine beside this binary; the error says the build has no LibTorch engine.
[[nodiscard]] Expected<std::filesystem::path> findEngine();

// Threads per rank for `nproc` local ranks: `given` (--threads, 0 when absent) or the
// machine's cores shared among the ranks. Refused, naming the option: more than 1,024 ranks,
// or more than 4x the cores in threads per rank (more only contend).
[[nodiscard]] Expected<int64_t> threadsPerRank(int64_t nproc, int64_t given);

// A new folder in $TMPDIR named `prefix`-XXXXXX, for a run's logs and results.
[[nodiscard]] Expected<std::filesystem::path> makeRunFolder(const std::string& prefix);

// Starts `nproc` ranks of `args` (the engine and its arguments; each rank also gets
// `--out DIR/rank<R>.json`, its stderr in DIR/rank<R>.log, rank 0's stdout on ours), and
// waits for them, saying every 10 s how many run. Returns 0 when every rank exited 0;
// otherwise prints which rank failed with the last lines of each failed rank's log (or
// that it was interrupted) as `who`, and returns the exit code for the command (1, or
// 128 + the signal).
[[nodiscard]] int launchLocalRanks(const std::vector<std::string>& args, int64_t nproc,
                                   const std::filesystem::path& dir, int64_t timeoutS,
                                   const std::string& who);

}  // namespace shardscope::cli
