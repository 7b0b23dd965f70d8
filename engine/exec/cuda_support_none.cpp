// SPDX-License-Identifier: Apache-2.0
// The engine built without CUDA, CUPTI or NCCL: --device cuda is refused with the reason.
#include <stdexcept>

#include "engine/exec/cuda_support.h"

namespace shardscope::exec {

namespace {
[[noreturn]] void noCuda() {
    throw std::runtime_error(
        "--device cuda: this shardscope-engine was built without CUDA (the CUDA toolkit with "
        "CUPTI and NCCL was not found at build time; see `shardscope doctor`)");
}
}  // namespace

bool builtWithCuda() {
    return false;
}
void useCudaDevice(int) {
    noCuda();
}
c10::intrusive_ptr<c10d::Backend> makeNcclBackend(const c10::intrusive_ptr<c10d::Store>&,
                                                  const std::string&, int, int,
                                                  std::chrono::milliseconds) {
    noCuda();
}
CudaMemory cudaMemory() {
    noCuda();
}
void resetCudaPeaks() {
    noCuda();
}
CudaDeviceInfo cudaDeviceInfo() {
    noCuda();
}
void synchronizeCuda() {
    noCuda();
}

}  // namespace shardscope::exec
