// SPDX-License-Identifier: Apache-2.0
#pragma once
// Small PyTorch-profiler traces written by the tests that need them.
#include <string>

namespace shardscope::test {

// Two cudaLaunchKernel events on a CPU thread (pid 10, tid 11) at 100 and 300 us, each with a
// flow to its kernel on stream 7 ("gemm" at 120 us for 150 us, "relu" at 320 us for 100 us),
// and one flow end without a start. Returns the file's path (in the temp folder).
std::string writeLaunchFlowTrace(const std::string& fileName);

// `events` kernels of 5 us, 10 us apart, on one stream, each with Kineto-style args.
std::string writeKernelTrace(const std::string& fileName, int events);

}  // namespace shardscope::test
