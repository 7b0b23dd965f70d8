// SPDX-License-Identifier: Apache-2.0
// libFuzzer: ShardScope's own traces (`run --trace`, `simulate --trace`) as `trace diff`,
// `trace overlap` and `calibrate --trace` read them.
#include <cstdlib>

#include "engine/measure/step_trace.h"
#include "tests/fuzz/fuzz_input.h"

using namespace shardscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = fuzzing::writeInput(data, size, "shardscope-trace.json");
    auto t = readTraceFile(path);
    if (!t.ok() && t.error().find(path) == std::string::npos) std::abort();
    return 0;
}
