// SPDX-License-Identifier: Apache-2.0
#pragma once
// A PyTorch-profiler-style trace of any size for benchmarks (shardscope bench import,
// shardscope-gui-bench): per rank a process named "rank N" with GPU streams of
// back-to-back kernels of 2-200 us, one in eight an NCCL all-gather or reduce-scatter with
// Kineto's collective args. Deterministic for a given size.
#include <cstdint>
#include <string>

namespace shardscope {

struct SyntheticTraceOptions {
    int ranks = 4;
    int streams = 8;
    int64_t events = 1'000'000;  // or, when bytes > 0, as many as fill about that many bytes
    int64_t bytes = 0;
};

// Returns the events written; throws std::runtime_error naming the file when it cannot.
int64_t writeSyntheticTrace(const std::string& path, const SyntheticTraceOptions& o);

}  // namespace shardscope
