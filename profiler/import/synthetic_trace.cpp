// SPDX-License-Identifier: Apache-2.0
#include "profiler/import/synthetic_trace.h"

#include <cstdio>
#include <fstream>
#include <random>
#include <stdexcept>
#include <vector>

namespace shardscope {

int64_t writeSyntheticTrace(const std::string& path, const SyntheticTraceOptions& o) {
    std::ofstream out(path, std::ios::binary);
    if (!out) throw std::runtime_error(path + ": cannot write");
    std::mt19937_64 rng(42);
    out << "{\"schemaVersion\": 1, \"baseTimeNanoseconds\": 1700000000000000000,\n"
           "\"traceEvents\": [\n";
    for (int r = 0; r < o.ranks; ++r)
        out << "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " << r + 1
            << ", \"args\": {\"name\": \"rank " << r << "\"}},\n";
    static const char* kernels[] = {"sm90_xmma_gemm_bf16bf16_bf16f32", "flash_fwd_kernel",
                                    "vectorized_elementwise_kernel", "reduce_kernel"};
    static const char* collectives[] = {"ncclDevKernel_AllGather_RING_LL",
                                        "ncclDevKernel_ReduceScatter_RING_LL"};
    const int lanes = o.ranks * o.streams;
    std::vector<double> clock(static_cast<size_t>(lanes), 0.0);
    int64_t written = 0, bytes = 0;
    char line[512];
    for (int64_t i = 0; o.bytes > 0 ? bytes < o.bytes : i < o.events; ++i) {
        const int lane = static_cast<int>(i % lanes);
        const int rank = lane / o.streams, stream = lane % o.streams;
        double& t = clock[static_cast<size_t>(lane)];
        t += static_cast<double>(rng() % 50) / 10.0;
        const double dur = 2.0 + static_cast<double>(rng() % 19800) / 100.0;  // us
        int n;
        if (rng() % 8 == 0) {
            const int c = static_cast<int>(rng() % 2);
            const int64_t nelems = int64_t{1} << (16 + rng() % 10);
            n = std::snprintf(
                line, sizeof line,
                "%s{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"%s\", \"pid\": %d, \"tid\": "
                "%d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {\"stream\": %d, \"Collective name\": "
                "\"%s\", \"In msg nelems\": %lld, \"Out msg nelems\": %lld, \"dtype\": "
                "\"BFloat16\", \"Group size\": %d}}",
                i == 0 ? "" : ",\n", collectives[c], rank + 1, 100 * (rank + 1) + stream, t, dur,
                stream, c == 0 ? "_allgather_base" : "_reduce_scatter_base",
                static_cast<long long>(c == 0 ? nelems / o.ranks : nelems),
                static_cast<long long>(c == 0 ? nelems : nelems / o.ranks), o.ranks);
        } else {
            n = std::snprintf(line, sizeof line,
                              "%s{\"ph\": \"X\", \"cat\": \"kernel\", \"name\": \"%s\", \"pid\": "
                              "%d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f}",
                              i == 0 ? "" : ",\n", kernels[rng() % 4], rank + 1,
                              100 * (rank + 1) + stream, t, dur);
        }
        out.write(line, n);
        bytes += n;
        t += dur;
        ++written;
    }
    out << "\n]}\n";
    if (!out) throw std::runtime_error(path + ": write failed (disk full?)");
    return written;
}

}  // namespace shardscope
