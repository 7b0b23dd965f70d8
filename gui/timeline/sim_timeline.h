// SPDX-License-Identifier: Apache-2.0
#pragma once
// Turns a simulated step into timeline rows, one per stream that ran something.
#include "engine/schedule/step_program.h"
#include "engine/sim/simulator.h"
#include "gui/timeline/timeline_widget.h"

namespace shardscope::gui {

[[nodiscard]] TimelineData timelineFromSimulation(const ResolvedPlan& plan,
                                                  const StepProgram& program, const SimResult& sim);

}  // namespace shardscope::gui
