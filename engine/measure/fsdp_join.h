// SPDX-License-Identifier: Apache-2.0
#pragma once
// PyTorch FSDP traces in the step program's terms, so `trace diff` and `calibrate` treat a
// user's own run as they treat `shardscope run`'s: each rank's FSDP work, read from FSDP2's
// labels (fsdp_trace.h), becomes measured ops of the program of the same plan, joined by
// unit, phase, op kind, micro-batch and order within those:
//  - all-gathers, reduce-scatters and HSDP all-reduces: where they ran (Gloo thread, NCCL
//    kernel);
//  - copy-in (fsdp::all_gather_copy_in), copy-out (FSDP::all_gather_copy_out) and the
//    reduce-scatter copy-in (fsdp::chunk_cat);
//  - forward compute: a unit's FSDP::pre_forward end to its FSDP::post_forward start, less
//    the nested units' forwards (the root's forward is two segments around its children);
//  - backward compute: a unit's FSDP::pre_backward end to its post_backward hook, less the
//    nested units' backwards;
//  - the optimizer step (Optimizer.step#...).
// Ops the trace has and the program lacks (or the other way round) stay unjoined, counted.
#include <string>
#include <utility>
#include <vector>

#include "engine/measure/step_trace.h"
#include "engine/schedule/step_program.h"
#include "engine/sim/simulator.h"
#include "profiler/analysis/fsdp_trace.h"
#include "profiler/trace/trace.h"

namespace shardscope {

struct FsdpJoin {
    TraceFile file;  // producer "pytorch": measured ops with program op ids
    int64_t joined = 0;
    int64_t traceOnly = 0;  // trace items no program op took
    std::vector<std::string> notes;
    // Several ranks: their collectives' mean time a step waiting for the last rank to start
    // them (fillPeerWaits); -1 when not known.
    double peerWaitNsPerStep = -1;
};

// `ranks`: (path, trace) per rank, PyTorch FSDP2 traces of a job that ran `plan`, and
// `analyses` their analyzeFsdp, rank for rank (the join fills their peer waits).
[[nodiscard]] Expected<FsdpJoin> joinFsdpTraces(
    const std::vector<std::pair<std::string, const Trace*>>& ranks,
    std::vector<FsdpTraceAnalysis>& analyses, const ResolvedPlan& plan, const StepProgram& program);

// A simulation as a step trace (one rank, one step), the other side of a diff.
[[nodiscard]] TraceFile simulatedStepTrace(const ResolvedPlan& plan, const StepProgram& program,
                                           const SimResult& sim, const std::string& what);

}  // namespace shardscope
