// SPDX-License-Identifier: Apache-2.0
// libFuzzer: the cluster loader; what loads must write and load again, and price a
// collective and a kernel.
#include <cstdlib>

#include "engine/sim/cost_model.h"
#include "plans/cluster/cluster.h"
#include "engine/calibrate/kernel_fit.h"
#include "tests/fuzz/fuzz_input.h"

using namespace shardscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzzing::writeInput(data, size, "cluster.json");
    auto c = loadClusterFile(path);
    if (!c.ok()) {
        if (c.error().find(path) == std::string::npos) std::abort();
        return 0;
    }
    if (!clusterFromJson(clusterToJson(*c), path).ok()) std::abort();  // round trip
    (void)collectiveTime(*c, OpKind::AllGather, 1 << 20, 8, 1, 8);
    KernelSample s;
    s.cls = KernelClass::MemoryBound;
    s.bytes = 1e6;
    (void)predictKernelNs(*c, s);
    return 0;
}
