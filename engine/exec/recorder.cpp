// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/recorder.h"

#include <chrono>

namespace shardscope::exec {

int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

namespace {
thread_local size_t t_launchLabel = Recorder::kNone;
}

size_t Recorder::begin(OpKind kind, Phase phase, Stream stream, int32_t unit, int32_t mb) {
    if (!m_enabled) return kNone;
    size_t index = 0;
    {
        std::lock_guard lock(m_mutex);
        RecordedOp op{kind, phase, stream, unit, mb, m_step, nowNs(), 0};
        m_ops.push_back(op);
        index = m_ops.size() - 1;
    }
    if (m_push) {
        if (t_launchLabel != kNone) m_pop();
        m_push(index);
        t_launchLabel = index;
    }
    return index;
}
void Recorder::end(size_t index) {
    if (m_push && index != kNone && t_launchLabel == index) {
        m_pop();
        t_launchLabel = kNone;
    }
    endAt(index, nowNs());
}
void Recorder::setStart(size_t index, int64_t t) {
    if (index == kNone) return;
    std::lock_guard lock(m_mutex);
    m_ops[index].startNs = t;
}
void Recorder::endAt(size_t index, int64_t t) {
    if (index == kNone) return;
    std::lock_guard lock(m_mutex);
    m_ops[index].endNs = t;
}
std::vector<RecordedOp> Recorder::ops() const {
    std::lock_guard lock(m_mutex);
    return m_ops;
}
std::string Recorder::current() const {
    std::lock_guard lock(m_mutex);
    return m_current;
}
void Recorder::setCurrent(std::string what) {
    {
        std::lock_guard lock(m_mutex);
        m_current = what;
    }
    if (m_hook) m_hook(what);
}

}  // namespace shardscope::exec
