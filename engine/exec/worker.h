// SPDX-License-Identifier: Apache-2.0
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace shardscope::exec {

// The integer value of a command-line flag, at least `minimum`; throws std::runtime_error
// naming the flag and the value otherwise.
int64_t flagInt(const std::string& flag, const std::string& v, int64_t minimum);

// `shardscope-engine worker --model M --plan P [--steps S --warmup W --out FILE ...]`:
// one rank. Throws std::runtime_error with a message for the user on any failure.
int runWorker(const std::vector<std::string>& argv);

// `shardscope-engine recorder-cost`: what the CPU recorder adds per allocation and per op,
// timed directly (allocate + free through the counting allocator against the allocator
// it wraps, with the memory timeline on; Recorder begin + end), printed as JSON.
int runRecorderCost();

}  // namespace shardscope::exec
