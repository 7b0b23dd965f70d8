// SPDX-License-Identifier: Apache-2.0
#include "profiler/export/chrome_trace_writer.h"

#include <utility>

namespace shardscope {

namespace {

double us(double ns) {
    return ns / 1000.0;
}

}  // namespace

void ChromeTraceWriter::processName(int pid, const std::string& name) {
    m_events.push_back(
        {{"ph", "M"}, {"pid", pid}, {"name", "process_name"}, {"args", {{"name", name}}}});
}

void ChromeTraceWriter::threadName(int pid, int tid, const std::string& name) {
    m_events.push_back({{"ph", "M"},
                        {"pid", pid},
                        {"tid", tid},
                        {"name", "thread_name"},
                        {"args", {{"name", name}}}});
}

void ChromeTraceWriter::threadSortIndex(int pid, int tid, int index) {
    m_events.push_back({{"ph", "M"},
                        {"pid", pid},
                        {"tid", tid},
                        {"name", "thread_sort_index"},
                        {"args", {{"sort_index", index}}}});
}

void ChromeTraceWriter::lane(int pid, int tid, const std::string& name, int sortIndex) {
    threadName(pid, tid, name);
    threadSortIndex(pid, tid, sortIndex);
}

void ChromeTraceWriter::span(int pid, int tid, const std::string& name, const std::string& category,
                             double startNs, double durNs, nlohmann::json args) {
    nlohmann::json e{{"ph", "X"},       {"pid", pid},        {"tid", tid},      {"name", name},
                     {"cat", category}, {"ts", us(startNs)}, {"dur", us(durNs)}};
    if (!args.is_null()) e["args"] = std::move(args);
    m_events.push_back(std::move(e));
}

void ChromeTraceWriter::counter(int pid, int tid, const std::string& name, double atNs,
                                nlohmann::json args) {
    m_events.push_back({{"ph", "C"},
                        {"pid", pid},
                        {"tid", tid},
                        {"name", name},
                        {"ts", us(atNs)},
                        {"args", std::move(args)}});
}

void ChromeTraceWriter::instant(int pid, int tid, const std::string& name,
                                const std::string& category, double atNs, nlohmann::json args) {
    m_events.push_back({{"ph", "i"},
                        {"s", "t"},
                        {"name", name},
                        {"cat", category},
                        {"pid", pid},
                        {"tid", tid},
                        {"ts", us(atNs)},
                        {"args", std::move(args)}});
}

void ChromeTraceWriter::flowStart(int pid, int tid, const std::string& name,
                                  const std::string& category, const nlohmann::json& id,
                                  double atNs) {
    m_events.push_back({{"ph", "s"},
                        {"id", id},
                        {"cat", category},
                        {"name", name},
                        {"pid", pid},
                        {"tid", tid},
                        {"ts", us(atNs)}});
}

void ChromeTraceWriter::flowEnd(int pid, int tid, const std::string& name,
                                const std::string& category, const nlohmann::json& id, double atNs,
                                bool bindEnclosing) {
    nlohmann::json e{{"ph", "f"},  {"id", id},   {"cat", category}, {"name", name},
                     {"pid", pid}, {"tid", tid}, {"ts", us(atNs)}};
    if (bindEnclosing) e["bp"] = "e";
    m_events.push_back(std::move(e));
}

nlohmann::json ChromeTraceWriter::finish(nlohmann::json metadata, nlohmann::json extra) {
    nlohmann::json out = std::move(extra);
    out["traceEvents"] = std::exchange(m_events, nlohmann::json::array());
    out["displayTimeUnit"] = "ns";
    out["metadata"] = std::move(metadata);
    return out;
}

}  // namespace shardscope
