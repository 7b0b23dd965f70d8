// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/runtime_info.h"

#include <ATen/ATen.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <string>

#include <dlfcn.h>

namespace shardscope::exec {

namespace {
// The NCCL the LibTorch wheel loads (ncclGetVersion needs no GPU): the version whose cost
// model constants the cluster profiles should name (samples/clusters, docs/collectives.md).
std::string ncclVersion() {
    using GetVersion = int (*)(int*);
    void* sym = ::dlsym(RTLD_DEFAULT, "ncclGetVersion");
    if (!sym) {
        if (void* h = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL))
            sym = ::dlsym(h, "ncclGetVersion");
    }
    if (!sym) return "not found (no libnccl.so.2 loaded or on the library path)";
    int code = 0;
    if (reinterpret_cast<GetVersion>(sym)(&code) != 0 || code <= 0)
        return "unknown (ncclGetVersion failed)";
    // NCCL_VERSION(X, Y, Z): X*1000 + Y*100 + Z before 2.9, X*10000 + Y*100 + Z since.
    const int major = code >= 10000 ? code / 10000 : code / 1000;
    const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
    const int patch = code % 100;
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}
}  // namespace

nlohmann::json runtimeInfo() {
    nlohmann::json j;
    j["libtorch"] = TORCH_VERSION;
    j["cuda_available"] = at::hasCUDA() ? "yes" : "no (no CUDA driver or device)";
    const int devices =
        at::hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().deviceCount()) : 0;
    j["cuda_devices"] = devices;
#ifdef USE_C10D_NCCL
    j["nccl_compiled"] = "yes";
#else
    j["nccl_compiled"] = "no";
#endif
    j["nccl"] = ncclVersion();
    // Gloo: a real one-rank all-reduce through c10d, as the engine's CPU path uses it.
    try {
        auto store = c10::make_intrusive<c10d::HashStore>();
        auto opts = c10d::ProcessGroupGloo::Options::create();
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
        opts->timeout = std::chrono::seconds(10);
        auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, 0, 1, opts);
        std::vector<at::Tensor> t{at::ones({4})};
        pg->allreduce(t)->wait();
        j["gloo"] =
            t[0].sum().item<float>() == 4.0f ? "ok (1-rank all-reduce ran)" : "wrong result";
    } catch (const std::exception& e) {
        j["gloo"] = std::string("failed: ") + e.what();
    }
    return j;
}

}  // namespace shardscope::exec
