// SPDX-License-Identifier: Apache-2.0
#pragma once
// The Chrome Trace Event records every trace ShardScope writes is made of (`trace export`,
// `simulate --trace`, `run --trace`), written in one place: process and thread names and
// sort order ("M"), complete events ("X"), counters ("C"), instant events ("i") and flow
// arrows ("s"/"f"), times in nanoseconds turned into the format's microseconds. Perfetto UI
// and chrome://tracing open the result; tests/python/perfetto_rules.py says what Perfetto
// needs (a pid >= 1, tids unique across processes).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace shardscope {

class ChromeTraceWriter {
public:
    // A process's and a thread's names; a thread's place among its process's threads.
    void processName(int pid, const std::string& name);
    void threadName(int pid, int tid, const std::string& name);
    void threadSortIndex(int pid, int tid, int index);
    // A named thread in its place (threadName, then threadSortIndex).
    void lane(int pid, int tid, const std::string& name, int sortIndex);
    // A complete event from `startNs` for `durNs`, relative to the trace's zero; `args` left
    // out when null.
    void span(int pid, int tid, const std::string& name, const std::string& category,
              double startNs, double durNs, nlohmann::json args = nullptr);
    // A counter sample: each member of `args` is a series of the counter `name`.
    void counter(int pid, int tid, const std::string& name, double atNs, nlohmann::json args);
    // A thread-scoped instant event.
    void instant(int pid, int tid, const std::string& name, const std::string& category,
                 double atNs, nlohmann::json args);
    // A flow arrow's start and end, matched by `id`; an end bound to its enclosing slice
    // (Kineto's "bp": "e") when `bindEnclosing`.
    void flowStart(int pid, int tid, const std::string& name, const std::string& category,
                   const nlohmann::json& id, double atNs);
    void flowEnd(int pid, int tid, const std::string& name, const std::string& category,
                 const nlohmann::json& id, double atNs, bool bindEnclosing);

    // The trace: {"traceEvents": [...], "displayTimeUnit": "ns", "metadata": metadata},
    // with `extra`'s members beside them. The writer is empty afterwards.
    [[nodiscard]] nlohmann::json finish(nlohmann::json metadata,
                                        nlohmann::json extra = nlohmann::json::object());

private:
    nlohmann::json m_events = nlohmann::json::array();
};

}  // namespace shardscope
