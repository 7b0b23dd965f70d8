// SPDX-License-Identifier: Apache-2.0
// libFuzzer: the model loader (ShardScope's model format and Hugging Face config.json), then
// a sample plan resolved against what loaded.
#include <cstdlib>

#include "plans/model/model_json.h"
#include "plans/plan/plan_json.h"
#include "plans/plan/resolve.h"
#include "tests/fuzz/fuzz_input.h"

using namespace shardscope;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const Plan plan = *loadPlanFile(fuzzing::sample("plans/tiny-llama-2rank.json"));
    const std::string path = fuzzing::writeInput(data, size, "config.json");
    auto model = loadModelFile(path);
    if (!model.ok()) {
        if (model.error().find(path) == std::string::npos) std::abort();
        return 0;
    }
    (void)resolvePlan(*model, plan, nullptr, "plan.json");
    return 0;
}
