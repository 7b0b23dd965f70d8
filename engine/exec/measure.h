// SPDX-License-Identifier: Apache-2.0
#pragma once
#include <string>
#include <vector>

namespace shardscope::exec {

// `shardscope-engine measure --out FILE [--device cpu|cuda] [--threads N] [--reps N]
// [--quick] [--timeout-s S]`: microbenchmarks of this machine (GEMMs, copies, attention,
// launch cost on rank 0; collectives over every rank of the torchrun environment when
// WORLD_SIZE > 1), written as JSON samples for `shardscope calibrate --measure`. Throws
// std::runtime_error with a message for the user on any failure.
int runMeasure(const std::vector<std::string>& argv);

}  // namespace shardscope::exec
