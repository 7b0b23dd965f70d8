// SPDX-License-Identifier: Apache-2.0
// libFuzzer: the plan loader, then plan resolution against the tiny Llama on a CPU cluster.
#include <cstdlib>

#include "plans/model/model_json.h"
#include "plans/plan/plan_json.h"
#include "plans/plan/resolve.h"
#include "tests/fuzz/fuzz_input.h"

using namespace shardscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const ModelGraph model =
        *loadModelFile(fuzzing::sample("models/tiny-llama/config.json"));
    static const ClusterSpec cluster = *loadClusterFile(fuzzing::sample("clusters/cpu-2core.json"));
    const std::string path = fuzzing::writeInput(data, size, "plan.json");
    auto plan = loadPlanFile(path);
    if (!plan.ok()) {
        if (plan.error().find(path) == std::string::npos) std::abort();  // names the file
        return 0;
    }
    (void)resolvePlan(model, *plan, &cluster, path);
    return 0;
}
