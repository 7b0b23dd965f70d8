// SPDX-License-Identifier: Apache-2.0
// libFuzzer: the Kineto importer on the input as a plain .json (FUZZ_GZIP: gzip-compressed as
// a .json.gz), then everything that reads a loaded trace (tests/support/exercise.h). A
// refused trace must name its file.
#include <cstdlib>

#include "profiler/import/kineto_import.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/support/exercise.h"

using namespace shardscope;

#ifndef FUZZ_GZIP
#define FUZZ_GZIP 0
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const ClusterSpec cluster =
        *loadClusterFile(fuzzing::sample("clusters/h100-sxm-8x8.json"));
    const std::string path =
        fuzzing::writeInput(data, size, FUZZ_GZIP ? "trace.json.gz" : "trace.json", FUZZ_GZIP);
    KinetoImportOptions o;
    o.keepAllOpInputs = true;
    auto t = importKinetoFile(path, o);
    if (!t.ok()) {
        if (t.error().find(path) == std::string::npos) std::abort();
        return 0;
    }
    fuzzing::exerciseTrace(*t, &cluster);
    return 0;
}
