// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the engine ran, op by op, labelled as the step program labels them (the measured
// side of `run`'s comparison with the simulator), and the label of what the rank is doing
// now for error messages. No LibTorch here.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "engine/schedule/step_program.h"

namespace shardscope::exec {

int64_t nowNs();

// One op the engine ran, labelled as the step program labels it.
struct RecordedOp {
    OpKind kind = OpKind::Forward;
    Phase phase = Phase::Forward;
    Stream stream = Stream::Compute;
    int32_t unit = 0;
    int32_t microBatch = 0;
    int32_t step = 0;
    int64_t startNs = 0;
    int64_t endNs = 0;  // collectives: when the work completed (its future's callback)
};

class Recorder {
public:
    static constexpr size_t kNone = static_cast<size_t>(-1);
    // Off: no op is kept (begin returns kNone); for measuring the recorder's overhead.
    void setEnabled(bool on) { m_enabled = on; }
    [[nodiscard]] bool enabled() const { return m_enabled; }
    size_t begin(OpKind kind, Phase phase, Stream stream, int32_t unit, int32_t mb);
    void end(size_t index);
    void endAt(size_t index, int64_t t);
    void setStart(size_t index, int64_t t);
    void setStep(int32_t step) { m_step = step; }
    [[nodiscard]] std::vector<RecordedOp> ops() const;
    // What the rank is doing now: named in the error when a collective fails or times out.
    [[nodiscard]] std::string current() const;
    void setCurrent(std::string what);
    // Called with each new "current" label (the worker's signal message and fault injection).
    void setHook(std::function<void(const std::string&)> hook) { m_hook = std::move(hook); }
    // Labels the device work a thread launches with the op that thread began last (the
    // CUPTI recorder's external correlation, by op index): `push` at begin, `pop` at that
    // op's end() or at the thread's next begin. A collective's end comes from another
    // thread, so its label lasts until the launching thread begins its next op.
    void setLaunchLabels(void (*push)(uint64_t), void (*pop)()) {
        m_push = push;
        m_pop = pop;
    }

private:
    mutable std::mutex m_mutex;
    std::vector<RecordedOp> m_ops;
    std::string m_current;
    std::function<void(const std::string&)> m_hook;
    void (*m_push)(uint64_t) = nullptr;
    void (*m_pop)() = nullptr;
    int32_t m_step = 0;
    bool m_enabled = true;
};

}  // namespace shardscope::exec
