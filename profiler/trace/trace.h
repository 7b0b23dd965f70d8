// SPDX-License-Identifier: Apache-2.0
#pragma once
// The trace model every timeline source feeds: PyTorch profiler (Kineto) files today, the
// engine's recorders and the simulator later. Ranks have lanes (a device stream or a host
// thread); events are stored column by column with interned names, nanoseconds relative to
// the trace start. Counters hold memory over time.
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace shardscope {

class StringTable {
public:
    int32_t intern(std::string_view s);
    [[nodiscard]] const std::string& at(int32_t id) const {
        return m_strings[static_cast<size_t>(id)];
    }
    [[nodiscard]] size_t size() const { return m_strings.size(); }
    // Heap bytes held: the strings and the index (its nodes and buckets).
    [[nodiscard]] size_t memoryBytes() const;

private:
    // Looked up by string_view without building a std::string per event.
    struct Hash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };
    std::vector<std::string> m_strings;
    std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> m_index;
};

// HTA's kernel classes (hta/common/types.py): communication, memory, computation.
enum class EventClass : uint8_t { Computation, Communication, Memory, Cpu, Other };
[[nodiscard]] const char* eventClassName(EventClass c);

enum class LaneKind : uint8_t { DeviceStream, HostThread };

struct Lane {
    int32_t rank = 0;
    LaneKind kind = LaneKind::HostThread;
    int64_t pid = 0;
    std::string tid;  // numeric or "stream 7"
    std::string name;
};

struct Collective {
    int32_t event = -1;  // index into events
    std::string name;    // "allreduce", "_allgather_base", ...
    int64_t bytes = 0;   // message size in bytes (0 when the trace does not say)
    // NCCL's size S for bandwidth: the larger of input and output (the gathered tensor of an
    // all-gather, the full input of a reduce-scatter).
    int64_t fullBytes = 0;
    int32_t groupSize = 0;
    int64_t elements = 0;  // elements of the message (Gloo: of its input)
    std::string dtype;     // as the trace spells it ("float", "c10::BFloat16", "Float")
};

// Input shapes and types of the host ops FSDP analysis reads (record_shapes): collectives'
// issuing ops (c10d::*), Gloo's collectives, and the token embedding (batch and sequence).
struct OpInputs {
    std::vector<std::vector<int64_t>> dims;
    std::vector<std::string> types;
    // record_shapes' "Input Strides" (PyTorch 2.1 and later), per input: empty where the trace
    // gives none or the input is a tensor list. A stride of 0 is a broadcast (expand).
    std::vector<std::vector<int64_t>> strides;
};

// Elements of a record_shapes shape: 0 for a negative dimension or a count beyond int64
// (no real tensor; a fuzzed trace found the overflow). An empty shape (a scalar) is 1.
[[nodiscard]] int64_t shapeElements(const std::vector<int64_t>& shape);
// a * b, or 0 when it overflows int64 or either is negative: byte counts of such shapes.
[[nodiscard]] int64_t checkedProduct(int64_t a, int64_t b);

struct MemoryCounter {
    int64_t ts = 0;
    int64_t allocated = 0;
    int64_t reserved = 0;
    // The [memory] event's own allocation (Bytes > 0) or free (< 0) at Addr; 0 for counters.
    int64_t bytes = 0;
    int64_t addr = 0;
};

struct Trace {
    StringTable strings;
    std::vector<Lane> lanes;
    // Events, one entry per column (structure of arrays).
    std::vector<int64_t> start, dur;
    std::vector<int32_t> lane, name, category;
    std::vector<EventClass> cls;
    // ShardScope's own traces carry the step program's op id, the FSDP unit and the phase
    // in args; -1 elsewhere (unit and phase are string ids).
    std::vector<int32_t> opId, unit, phase;
    std::vector<Collective> collectives;
    // Launch-to-kernel flows (Kineto's "s"/"f" pairs), each as the events they bind to:
    // the host event enclosing the start (cudaLaunchKernel) and the device event at the end.
    std::vector<std::pair<int32_t, int32_t>> flowEvents;
    std::unordered_map<int32_t, OpInputs> opInputs;  // event -> its inputs (see OpInputs)
    // ShardScope's own traces: the measured step of each op (args.step, or fsdp_step on the
    // GPU work of a CUDA run), the top-level "metadata" object as JSON text, and the largest
    // "memory (bytes)" counter of any rank.
    std::unordered_map<int32_t, int32_t> opStep;
    std::string metadata;
    int64_t counterPeakAllocated = 0;
    // What the importer subtracted from every time (ns in the file's clock): a simulated
    // step's time counts from the file's 0.
    int64_t timeOriginNs = 0;
    // Host ops that carry a "stream" argument >= 0 (Triton's launcher cpu_op): HTA counts them
    // as GPU time on that stream, and so does its summary here by default.
    std::vector<int32_t> hostOpsWithStream;
    std::vector<MemoryCounter> memory;  // device memory, from [memory] events
    // ShardScope's own multi-rank traces: every rank's "memory (bytes)" counter, by rank
    // (`memory` holds the first rank's); empty for other traces.
    std::vector<std::pair<int32_t, std::vector<MemoryCounter>>> memoryByRank;
    // Host memory (the CPU allocator's [memory] events, Device Type 0): what a CPU run's
    // memory timeline shows. `allocated` is the profiler's Total Allocated.
    std::vector<MemoryCounter> hostMemory;
    // Import statistics, reported rather than failing on odd input.
    int64_t skippedPythonFunctions = 0;
    int64_t orphanFlowEnds = 0;
    int64_t flows = 0;
    // Events dropped because a field had an unexpected type (a string ts, an object name):
    // counted and reported, never fatal.
    int64_t skippedBadFields = 0;
    int64_t skippedOutOfRange = 0;    // "ts" or "dur" beyond int64 nanoseconds
    int64_t skippedNegativeTime = 0;  // a negative "ts" or "dur": no place on the timeline
    int64_t rank = 0;
    // Kineto's distributedInfo: the job's world size and process groups (0 / empty when the
    // trace does not say).
    int64_t worldSize = 0;
    struct ProcessGroup {
        std::string name, desc;
        int64_t size = 0;
        std::vector<int64_t> ranks;
    };
    std::vector<ProcessGroup> processGroups;
    // Kineto's deviceProperties: the GPUs' names ("NVIDIA B200"), as the trace lists them.
    std::vector<std::string> deviceNames;
    std::string
        dialect;  // "modern (relative ts, baseTimeNanoseconds)", "absolute us", "legacy 2021"
    std::unordered_map<std::string, int64_t> eventsByCategory;

    [[nodiscard]] size_t size() const { return start.size(); }
    // Heap bytes the trace holds (every container at its capacity): what "the trace in
    // memory" means when the importer's peak is compared with it.
    [[nodiscard]] size_t memoryBytes() const;
};

}  // namespace shardscope
