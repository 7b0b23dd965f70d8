// SPDX-License-Identifier: Apache-2.0
// `shardscope trace summary`: what a PyTorch profiler (Kineto) trace says, per rank, as HTA
// defines it: temporal breakdown, communication-computation overlap, NCCL collectives,
// memory peaks.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "engine/calibrate/allocator_replay.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "profiler/analysis/summary.h"
#include "profiler/analysis/trace_loader.h"
#include "profiler/export/chrome_export.h"
#include "profiler/import/kineto_import.h"

namespace shardscope::cli {

namespace {

std::string ms(int64_t ns) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3f ms", static_cast<double>(ns) * 1e-6);
    return b;
}

// After a command has gone through the traces: the folder files it skipped, the loader's
// error, or the JSON it collected.
int finishTraceCommand(const Args& a, const Status& st, const std::vector<std::string>& skipped,
                       const nlohmann::json& all) {
    std::cout.flush();
    for (const auto& sk : skipped)
        std::cerr << "note: skipped " << sk << "\n";
    if (!st) {
        std::cerr << "error: " << st.error() << "\n";
        return kExitUsage;
    }
    if (a.flag("--json")) return emitJson(all, "").ok() ? kExitOk : kExitUsage;
    return kExitOk;
}

int runTraceSummary(const Args& a) {
    if (a.positionals().empty()) {
        std::cerr << "error: give one or more trace files or folders (see --help)\n";
        return kExitUsage;
    }
    KinetoImportOptions o = traceImportOptions();
    o.keepPythonFunctions = a.flag("--python-functions");
    nlohmann::json all = nlohmann::json::array();
    std::vector<std::string> skipped;
    auto t0 = std::chrono::steady_clock::now();
    const Status st = forEachTrace(
        a.positionals(), o,
        [&](const std::string& f, Trace&& tr) -> Status {
            const Trace* t = &tr;
            const double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            SummaryOptions so;
            so.dropLastStep = !a.flag("--include-last-step");
            so.dropUnlinkedKernels = !a.flag("--keep-unlinked-kernels");
            so.roundToMicroseconds = !a.flag("--no-ns-rounding");
            so.hostOpsWithStream = !a.flag("--no-stream-host-ops");
            const TraceSummary s = summarize(*t, so);
            if (a.flag("--json")) {
                nlohmann::json j = summaryToJson(s);
                j["file"] = f;
                all.push_back(j);
                t0 = std::chrono::steady_clock::now();
                return {};
            }
            std::cout << f << "\n  rank " << s.rank << ", " << s.dialect << "; "
                      << withThousands(static_cast<int64_t>(s.events)) << " events on "
                      << s.deviceLanes << " device streams and " << s.hostLanes
                      << " host threads (read in " << static_cast<int>(secs * 1000) << " ms)\n";
            if (s.droppedLastStep)
                std::cout
                    << "  " << s.profilerSteps
                    << " ProfilerSteps: the last left out as HTA does, with "
                    << withThousands(s.droppedDeviceEvents)
                    << " GPU events it or no kept op launched (--include-last-step keeps it)\n";
            if (s.kernelTimeNs > 0) {
                char line[256];
                std::snprintf(
                    line, sizeof line,
                    "  GPU time %s: compute %s (%.1f%%), non-compute %s, idle %s (%.1f%%)\n",
                    ms(s.kernelTimeNs).c_str(), ms(s.computeNs).c_str(),
                    100.0 * static_cast<double>(s.computeNs) / static_cast<double>(s.kernelTimeNs),
                    ms(s.nonComputeNs).c_str(), ms(s.idleNs).c_str(),
                    100.0 * static_cast<double>(s.idleNs) / static_cast<double>(s.kernelTimeNs));
                std::cout << line;
                std::snprintf(line, sizeof line,
                              "  communication %s, %.1f%% of it overlapped by compute\n",
                              ms(s.commNs).c_str(), 100.0 * s.overlapRatio);
                std::cout << line;
            } else if (s.hostCommNs > 0) {
                char line[256];
                std::snprintf(line, sizeof line,
                              "  CPU run: communication %s on Gloo threads, %s of it exposed (the "
                              "issuing thread ran no op), %.1f%% overlapped\n",
                              ms(s.hostCommNs).c_str(), ms(s.hostExposedNs).c_str(),
                              100.0 * static_cast<double>(s.hostCommNs - s.hostExposedNs) /
                                  static_cast<double>(s.hostCommNs));
                std::cout << line;
            } else {
                std::cout << "  no GPU events and no collectives (a CPU-only trace)\n";
            }
            for (const auto& [name, c] : s.collectives)
                std::cout << "  collective " << name << ": " << c.count << " calls, "
                          << formatBytes(c.bytes) << ", " << ms(c.durationNs) << "\n";
            for (const auto& b : s.bandwidth) {
                const std::string range =
                    b.maxBytes > 0 ? formatBytes(b.minBytes) + " - " + formatBytes(b.maxBytes)
                                   : ">= " + formatBytes(b.minBytes);
                char line[256];
                const int n = std::snprintf(line, sizeof line,
                                            "  bandwidth %s %s: %lld calls, %.1f GB/s algorithm",
                                            b.collective.c_str(), range.c_str(),
                                            static_cast<long long>(b.count), b.algGBps);
                if (b.busGBps >= 0)
                    std::snprintf(line + n, sizeof line - static_cast<size_t>(n), ", %.1f GB/s bus",
                                  b.busGBps);
                else
                    std::snprintf(line + n, sizeof line - static_cast<size_t>(n),
                                  " (bus: group size not in the trace)");
                std::cout << line << "\n";
            }
            if (s.peakAllocated > 0)
                std::cout << "  device memory peak: allocated " << formatBytes(s.peakAllocated)
                          << ", reserved " << formatBytes(s.peakReserved) << "\n";
            if (s.skippedPythonFunctions > 0)
                std::cout << "  skipped " << s.skippedPythonFunctions
                          << " python_function events (--python-functions keeps them)\n";
            if (s.hostPeakAllocated > 0)
                std::cout << "  host memory peak: allocated " << formatBytes(s.hostPeakAllocated)
                          << " (CPU allocator)\n";
            if (s.orphanFlowEnds > 0)
                std::cout << "  " << s.orphanFlowEnds << " flow ends without a start (tolerated)\n";
            if (tr.skippedBadFields > 0)
                std::cout << "  skipped " << tr.skippedBadFields
                          << " events with a field of an unexpected type\n";
            if (tr.skippedOutOfRange > 0)
                std::cout << "  skipped " << tr.skippedOutOfRange
                          << " events whose \"ts\" or \"dur\" is out of range (more than "
                             "9.2e12 us)\n";
            if (tr.skippedNegativeTime > 0)
                std::cout << "  warning: skipped " << tr.skippedNegativeTime
                          << " events with a negative \"ts\" or \"dur\"\n";
            t0 = std::chrono::steady_clock::now();
            return {};
        },
        &skipped);
    return finishTraceCommand(a, st, skipped, all);
}

int runTraceExport(const Args& a) {
    const auto files = a.positionals();
    if (files.size() != 1) {
        std::cerr << "error: give one trace file to export (see --help)\n";
        return kExitUsage;
    }
    KinetoImportOptions o = traceImportOptions();
    o.keepPythonFunctions = a.flag("--python-functions");
    Expected<Trace> t = Error{""};
    const Status loaded = forEachTrace(files, o, [&](const std::string&, Trace&& tr) -> Status {
        t = std::move(tr);
        return {};
    });
    if (!loaded) {
        std::cerr << "error: " << loaded.error() << "\n";
        return kExitUsage;
    }
    const std::string out = a.get("--output");
    const Status st = writeFileAtomically(
        out, exportChromeTrace(*t).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                 "\n");
    if (!st) {
        std::cerr << "error: " << st.error() << "\n";
        return kExitUsage;
    }
    std::cout << "wrote " << out << " (" << withThousands(static_cast<int64_t>(t->size()))
              << " events on " << t->lanes.size() << " lanes, " << t->collectives.size()
              << " collectives, " << t->flowEvents.size()
              << " flows; open in https://ui.perfetto.dev or shardscope-gui)\n";
    return kExitOk;
}

// One file's replay: a JSON object, or the report.
void reportReplay(const Args& a, const std::string& f, int rank, const AllocatorReplay& r,
                  nlohmann::json& all, bool history) {
    if (a.flag("--json")) {
        all.push_back({{"file", f},
                       {"source", history ? "allocator history" : "profiler trace"},
                       {"rank", rank},
                       {"events", r.events},
                       {"allocations", r.allocations},
                       {"frees", r.frees},
                       {"frees_of_earlier_blocks", r.freesOfEarlierBlocks},
                       {"start_allocated_bytes", r.startAllocated},
                       {"start_reserved_bytes", r.startReserved},
                       {"trace_allocated_peak_bytes", r.traceAllocatedPeak},
                       {"trace_reserved_peak_bytes", r.traceReservedPeak},
                       {"model_allocated_peak_bytes", r.modelAllocatedPeak},
                       {"model_reserved_peak_bytes", r.modelReservedPeak},
                       {"allocated_mismatches", r.allocatedMismatches},
                       {"largest_allocated_gap_bytes", r.largestAllocatedGap},
                       {"largest_reserved_gap_bytes", r.largestReservedGap},
                       {"trace_reserved_changed", r.reservedChanged},
                       {"peak_reserved_error", r.peakReservedError()}});
        return;
    }
    std::cout << f
              << (history ? " (the allocator's history from its first allocation)\n"
                          : " (rank " + std::to_string(rank) + ")\n");
    if (r.events == 0) {
        std::cout << "  no CUDA [memory] events with Addr and Bytes (profile with "
                     "profile_memory=True on a GPU)\n";
        return;
    }
    std::cout << "  " << withThousands(r.events)
              << " allocator events: " << withThousands(r.allocations) << " allocations, "
              << withThousands(r.frees) << " frees (" << r.freesOfEarlierBlocks
              << " of blocks allocated before the trace began)\n";
    std::cout << "  trace: allocated " << formatBytes(r.startAllocated) << " at the start, peak "
              << formatBytes(r.traceAllocatedPeak) << "; reserved " << formatBytes(r.startReserved)
              << " at the start, peak " << formatBytes(r.traceReservedPeak)
              << (r.reservedChanged ? "" : " (it never moved during the trace)") << "\n";
    char line[200];
    std::snprintf(line, sizeof line, "%+.1f%%", 100.0 * r.peakReservedError());
    std::cout << "  model: allocated peak " << formatBytes(r.modelAllocatedPeak)
              << (r.allocatedMismatches == 0
                      ? " (equal to the trace's at every event)"
                      : " (differs from the trace's at " + withThousands(r.allocatedMismatches) +
                            " events, by " + formatBytes(r.largestAllocatedGap) +
                            " at most: blocks it left unsplit)")
              << "; reserved peak " << formatBytes(r.modelReservedPeak) << " (" << line
              << " against the trace), largest gap " << formatBytes(r.largestReservedGap) << "\n";
    if (r.startReserved > r.startAllocated)
        std::cout << "  note: the trace began with "
                  << formatBytes(r.startReserved - r.startAllocated)
                  << " cached but not allocated, from before profiling; the model "
                     "starts without it, so a trace that starts mid-run bounds the "
                     "model from below only\n";
}

int runTraceMemory(const Args& a) {
    if (a.positionals().empty()) {
        std::cerr << "error: give one or more GPU profiler traces (profile_memory=True) or "
                     "allocator histories\n";
        return kExitUsage;
    }
    nlohmann::json all = nlohmann::json::array();
    std::vector<std::string> skipped;
    const bool expandable = a.flag("--expandable-segments");
    // Allocator histories (from the first allocation) first; the rest are profiler traces.
    std::vector<std::string> traces;
    for (const auto& f : a.positionals()) {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(f, ec) || !looksLikeAllocatorHistory(f)) {
            traces.push_back(f);
            continue;
        }
        auto h = readAllocatorHistory(f);
        if (!h) {
            std::cerr << "error: " << h.error() << "\n";
            return kExitUsage;
        }
        const AllocatorReplay r = replayAllocatorHistory(*h, expandable);
        reportReplay(a, f, 0, r, all, true);
    }
    Status st;
    if (!traces.empty())
        st = forEachTrace(
            traces, traceImportOptions(),
            [&](const std::string& f, Trace&& t) -> Status {
                reportReplay(a, f, t.rank, replayAllocator(t, expandable), all, false);
                return {};
            },
            &skipped);
    return finishTraceCommand(a, st, skipped, all);
}

}  // namespace

std::vector<Command> traceCommands() {
    CommandSpec s;
    s.name = "trace summary";
    s.summary =
        "Summarise PyTorch profiler (Kineto) traces: GPU time breakdown, overlap, collectives, "
        "memory.";
    s.description =
        "Reads .json or .json.gz Kineto traces (a file per rank, or folders of them), streaming,\n"
        "in any of the three dialects PyTorch has written. Breakdown and overlap are\n"
        "HolisticTraceAnalysis' (checked against HTA 0.5.0 on real traces): kernels classified\n"
        "by name (communication ^nccl, memory Memcpy/Memset, computation otherwise), idle =\n"
        "span - |union of GPU events|, overlap = |comm ∩ compute| / |comm|, with HTA's\n"
        "defaults: the last ProfilerStep left out (with the GPU events no kept op launched)\n"
        "when there are two or more, fractional microseconds rounded as HTA rounds them\n"
        "(start up, end down), stream syncs and host ops carrying a stream counted as GPU\n"
        "time. Each default has a flag to turn it off.\n"
        "A CPU run (Gloo) has no GPU events: its Gloo collectives are the communication, and\n"
        "exposed is the part during which the thread that issued them ran no op.";
    s.positionalsMetavar = "FILE|DIR...";
    s.options = {{"--json", "", "print JSON, one object per file"},
                 {"--python-functions", "", "keep python_function events (skipped by default)"},
                 {"--include-last-step", "", "keep the last ProfilerStep (HTA drops it)"},
                 {"--keep-unlinked-kernels", "",
                  "keep GPU events that no kept host op launched (HTA drops them)"},
                 {"--no-ns-rounding", "", "keep fractional microseconds (HTA rounds them)"},
                 {"--no-stream-host-ops", "",
                  "do not count host ops that carry a stream argument as GPU time (HTA does)"}};
    s.examples = {"shardscope trace summary traces/rank0.pt.trace.json.gz",
                  "shardscope trace summary --json profiler_output/"};
    CommandSpec x;
    x.name = "trace export";
    x.summary = "Write a trace as Chrome trace JSON that Perfetto UI loads as meant.";
    x.description =
        "Reads a PyTorch profiler (Kineto) trace or a ShardScope trace and writes what ShardScope\n"
        "reads from it as Chrome trace JSON: one process per rank and pid (never pid 0), thread\n"
        "ids unique across processes (Perfetto names threads by tid), lane names, ShardScope's\n"
        "op ids, units and phases, collectives with their sizes, memory counters and\n"
        "launch-to-kernel flows. Reading the export back gives the same trace.";
    x.positionalsMetavar = "FILE";
    x.options = {{"--output", "FILE", "where to write the JSON", "", true, "-o"},
                 {"--python-functions", "", "keep python_function events (skipped by default)"}};
    x.examples = {"shardscope trace export rank0.pt.trace.json.gz -o rank0.perfetto.json"};
    CommandSpec m;
    m.name = "trace memory";
    m.summary = "Replay a GPU trace's allocator events through the caching-allocator model.";
    m.description =
        "Reads the CUDA [memory] events of PyTorch profiler traces (profile_memory=True: Addr,\n"
        "Bytes, Total Allocated, Total Reserved), replays each allocation and free through\n"
        "ShardScope's model of PyTorch's caching allocator (the one `simulate` uses for\n"
        "reserved memory) and prints its allocated and reserved peaks against the trace's.\n"
        "Blocks allocated before profiling began are seeded (those the trace frees at their\n"
        "sizes); memory the allocator had cached before then is unknown and reported.\n\n"
        "An allocator history replays from the first allocation instead, each event on its\n"
        "stream, against the segments the allocator really reserved: record one with\n"
        "torch.cuda.memory._record_memory_history() before the model is built and write\n"
        "json.dump(torch.cuda.memory._snapshot()) (or scripts/record_fsdp_trace.py\n"
        "--memory-history FILE), plain or gzipped.";
    m.positionalsMetavar = "FILE|DIR...";
    m.options = {
        {"--expandable-segments", "", "model PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"},
        {"--json", "", "print JSON, one object per file"}};
    m.examples = {"shardscope trace memory rank0.pt.trace.json.gz",
                  "shardscope trace memory memory-history.json.gz"};
    return {{s, runTraceSummary}, {x, runTraceExport}, {m, runTraceMemory}};
}

}  // namespace shardscope::cli
