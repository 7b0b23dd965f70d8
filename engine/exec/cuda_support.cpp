// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/cuda_support.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <stdexcept>

namespace shardscope::exec {

bool builtWithCuda() {
    return true;
}

void useCudaDevice(int index) {
    const int count = static_cast<int>(c10::cuda::device_count());
    if (index < 0 || index >= count)
        throw std::runtime_error(
            "--device cuda: this rank needs cuda:" + std::to_string(index) + " (LOCAL_RANK) but " +
            (count == 0 ? std::string("this machine has no CUDA device (or no CUDA driver)")
                        : "this machine has " + std::to_string(count) + " CUDA device(s)") +
            "; run fewer ranks per machine, or --device cpu");
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
}

c10::intrusive_ptr<c10d::Backend> makeNcclBackend(const c10::intrusive_ptr<c10d::Store>& store,
                                                  const std::string& prefix, int rank, int size,
                                                  std::chrono::milliseconds timeout) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto ps = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(ps, rank, size, opts);
}

CudaMemory cudaMemory() {
    const auto dev = c10::cuda::current_device();
    const auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(dev);
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    CudaMemory m;
    m.allocated = st.allocated_bytes[all].current;
    m.peakAllocated = st.allocated_bytes[all].peak;
    m.reserved = st.reserved_bytes[all].current;
    m.peakReserved = st.reserved_bytes[all].peak;
    return m;
}

void resetCudaPeaks() {
    c10::cuda::CUDACachingAllocator::resetPeakStats(c10::cuda::current_device());
}

CudaDeviceInfo cudaDeviceInfo() {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, c10::cuda::current_device()) != cudaSuccess)
        throw std::runtime_error("cudaGetDeviceProperties failed on the current device");
    return {p.name, static_cast<int64_t>(p.totalGlobalMem)};
}

void synchronizeCuda() {
    c10::cuda::device_synchronize();
}

}  // namespace shardscope::exec
