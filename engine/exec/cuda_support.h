// SPDX-License-Identifier: Apache-2.0
#pragma once
// The engine's CUDA side: the rank's device, ProcessGroupNCCL for the shard, replicate and
// post-forward groups, the caching allocator's memory statistics, and the CUPTI recorder's
// op labels. Declared here without CUDA headers; cuda_support.cpp implements it when the
// build found CUDA, CUPTI and NCCL, and cuda_support_none.cpp otherwise (each call then
// throws, saying that this engine was built without CUDA).
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace shardscope::exec {

// Whether this engine was built with the CUDA/NCCL path.
[[nodiscard]] bool builtWithCuda();

// Makes cuda:`index` this process's device. Throws, naming the count it found, when the
// machine has no such device (or no CUDA driver).
void useCudaDevice(int index);

// A ProcessGroupNCCL on `store` (prefixed) with this timeout.
[[nodiscard]] c10::intrusive_ptr<c10d::Backend> makeNcclBackend(
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
    std::chrono::milliseconds timeout);

struct CudaMemory {
    int64_t allocated = 0, peakAllocated = 0, reserved = 0, peakReserved = 0;
};
// The caching allocator's figures for the current device (what torch.cuda.memory_stats
// reports as allocated_bytes.all and reserved_bytes.all).
[[nodiscard]] CudaMemory cudaMemory();
void resetCudaPeaks();
// The current device's name ("NVIDIA H100 80GB HBM3") and memory, as cudaGetDeviceProperties
// reports them.
struct CudaDeviceInfo {
    std::string name;
    int64_t memoryBytes = 0;
};
[[nodiscard]] CudaDeviceInfo cudaDeviceInfo();
// Waits for every stream of the current device (step boundaries: host time = GPU time).
void synchronizeCuda();

}  // namespace shardscope::exec
