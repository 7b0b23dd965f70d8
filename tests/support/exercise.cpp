// SPDX-License-Identifier: Apache-2.0
#include "tests/support/exercise.h"

#include <cstdint>

#include "engine/calibrate/allocator_replay.h"
#include "profiler/analysis/fsdp_trace.h"
#include "engine/calibrate/kernel_fit.h"
#include "engine/calibrate/kernel_samples.h"
#include "engine/measure/step_overlap.h"
#include "engine/measure/step_trace.h"
#include "profiler/analysis/summary.h"
#include "profiler/export/chrome_export.h"

namespace shardscope::fuzzing {

void exerciseTrace(const Trace& t, const ClusterSpec* cluster) {
    using Json = nlohmann::json;
    for (bool hta : {true, false}) {
        SummaryOptions o;
        o.dropLastStep = o.dropUnlinkedKernels = o.roundToMicroseconds = o.hostOpsWithStream = hta;
        (void)summaryToJson(summarize(t, o)).dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    FsdpTraceAnalysis a = analyzeFsdp(t);
    {
        // The trace as two ranks of one job: the peer-wait matching over its collectives.
        FsdpTraceAnalysis b = a;
        if (b.rank < INT64_MAX) ++b.rank;  // two ranks, so that the trace's groups are matched
        (void)fillPeerWaits({&a, &b});
    }
    (void)fsdpAnalysisToJson(a).dump(-1, ' ', false, Json::error_handler_t::replace);
    if (!a.api.empty()) (void)recoverPlan(a, "fuzz");
    if (auto st = stepTraceOf(t, "fuzz")) (void)stepOverlap(*st);
    (void)exportChromeTrace(t).dump(-1, ' ', false, Json::error_handler_t::replace);
    (void)replayAllocator(t);
    KernelSamples samples;
    collectKernelSamples(t, 0, samples);
    if (cluster) (void)fitKernels(samples, *cluster, "fuzz");
}

}  // namespace shardscope::fuzzing
