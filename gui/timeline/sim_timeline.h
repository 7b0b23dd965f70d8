// SPDX-License-Identifier: Apache-2.0
#pragma once
// Turns a simulated step into timeline rows, one per stream that ran something.
#include "engine/schedule/step_program.h"
#include "engine/sim/simulator.h"
#include "gui/timeline/timeline_widget.h"

namespace shardscope::gui {

// "all_gather of 1.2 GiB over 8 ranks" and, given a duration, the achieved algorithm and
// bus bandwidth (NCCL's definitions).
[[nodiscard]] std::string describeCollective(const char* kind, int64_t bytes, int32_t groupSize,
                                             int64_t ns);

[[nodiscard]] TimelineData timelineFromSimulation(const ResolvedPlan& plan,
                                                  const StepProgram& program, const SimResult& sim);

}  // namespace shardscope::gui
