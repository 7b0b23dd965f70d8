// SPDX-License-Identifier: Apache-2.0
// libFuzzer: the CUDA allocator-history reader (`shardscope trace memory HISTORY`) and the
// replay through the caching-allocator model: what loads must replay; what is refused must
// name the file.
#include <cstdlib>

#include "engine/calibrate/allocator_replay.h"
#include "tests/fuzz/fuzz_input.h"

using namespace shardscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzzing::writeInput(data, size, "history.json");
    (void)looksLikeAllocatorHistory(path);
    auto h = readAllocatorHistory(path);
    if (!h.ok()) {
        if (h.error().find(path) == std::string::npos) std::abort();
        return 0;
    }
    const AllocatorReplay r = replayAllocatorHistory(*h);
    if (r.allocations < 0 || r.modelReservedPeak < r.modelAllocatedPeak) std::abort();
    (void)replayAllocatorHistory(*h, true);  // expandable segments
    return 0;
}
