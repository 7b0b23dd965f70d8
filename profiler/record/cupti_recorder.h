// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CUPTI recorder: GPU kernels with their stream, memcpy, memset, device allocations and
// frees (MEMORY2), synchronisation, the runtime and driver calls that launched them, and
// external correlation so each GPU op links to the FSDP op the engine was running. CUPTI
// fills 4 MB buffers that this recorder hands it; the count of records CUPTI dropped
// because no buffer was free is kept and reported. GPU and CPU clocks are aligned by
// sampling both at start and at stop.
//
// CUPTI allows one subscriber per process: when the PyTorch profiler, Nsight Systems or
// Nsight Compute holds it, start() fails with a message that names the holder.
//
// No CUDA headers here: the engine's CPU-only translation units may include it.
#include <cstdint>
#include <functional>
#include <memory>

#include "plans/core/expected.h"
#include "profiler/record/device_activity.h"

namespace shardscope::record {

class CuptiRecorder {
public:
    static constexpr size_t kBufferBytes = size_t{4} << 20;

    // cpuClock: the clock the engine's own op records use (steady_clock nanoseconds).
    explicit CuptiRecorder(std::function<int64_t()> cpuClock);
    ~CuptiRecorder();
    CuptiRecorder(const CuptiRecorder&) = delete;
    CuptiRecorder& operator=(const CuptiRecorder&) = delete;

    // Subscribes to CUPTI and enables the activity kinds. One recorder per process.
    Status start();
    // Marks the work launched from this thread as the FSDP op `id` until pop (CUPTI's
    // external correlation, kind CUSTOM0). Cheap enough to call around every op.
    static void pushOp(uint64_t id);
    static void popOp();
    // Flushes CUPTI's buffers, disables the kinds, unsubscribes and returns what was
    // recorded since start(), on the CPU clock.
    [[nodiscard]] Expected<DeviceActivity> stop();
    [[nodiscard]] bool running() const { return m_running; }

    // The text of a CUPTI result code, for messages.
    static std::string resultText(int result);

private:
    struct Impl;
    std::unique_ptr<Impl> d;
    bool m_running = false;
};

}  // namespace shardscope::record
