// SPDX-License-Identifier: Apache-2.0
#include "tests/support/sample_traces.h"

#include <filesystem>
#include <fstream>
#include "tests/support/golden.h"

namespace shardscope::test {

std::string writeLaunchFlowTrace(const std::string& fileName) {
    const std::string path = shardscope::test::testTempDir() / fileName;
    std::ofstream(path) << R"JSON({"traceEvents": [
      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 100, "dur": 5},
      {"ph": "s", "id": 1, "cat": "ac2g", "name": "ac2g", "pid": 10, "tid": 11, "ts": 100},
      {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": 11, "ts": 300, "dur": 5},
      {"ph": "s", "id": 2, "cat": "ac2g", "name": "ac2g", "pid": 10, "tid": 11, "ts": 300},
      {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 120, "dur": 150},
      {"ph": "f", "id": 1, "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": 120, "bp": "e"},
      {"ph": "X", "cat": "kernel", "name": "relu", "pid": 0, "tid": 7, "ts": 320, "dur": 100},
      {"ph": "f", "id": 2, "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": 320, "bp": "e"},
      {"ph": "f", "id": 9, "cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "ts": 420, "bp": "e"}
    ]})JSON";
    return path;
}

std::string writeKernelTrace(const std::string& fileName, int events) {
    const std::string path = shardscope::test::testTempDir() / fileName;
    std::ofstream out(path);
    out << R"({"traceEvents": [)";
    for (int i = 0; i < events; ++i)
        out << (i ? ",\n" : "") << R"({"ph": "X", "cat": "kernel", "name": "gemm_kernel_)" << i % 7
            << R"(", "pid": 0, "tid": 7, "ts": )" << i * 10
            << R"(, "dur": 5, "args": {"stream": 7, "correlation": )" << i << "}}";
    out << "]}\n";
    return path;
}

}  // namespace shardscope::test
