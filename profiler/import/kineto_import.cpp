// SPDX-License-Identifier: Apache-2.0
#include "profiler/import/kineto_import.h"

#include "profiler/import/json_span.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <unordered_set>

namespace shardscope {

namespace {

using json = nlohmann::ordered_json;  // vector-backed objects: cheaper to build per event

// The file (gzip or plain) in 256 KiB chunks; the splitter below walks the buffer.
class GzReader {
public:
    GzReader(const std::string& path, const KinetoImportOptions& o)
        : m_file(gzopen(path.c_str(), "rb")), m_o(o) {
        std::error_code ec;
        m_fileBytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
        if (ec) m_fileBytes = 0;
        if (m_file) {
            gzbuffer(m_file, 64 << 10);
            refill();
        }
    }
    ~GzReader() {
        if (m_file) gzclose(m_file);
    }
    GzReader(const GzReader&) = delete;
    GzReader& operator=(const GzReader&) = delete;
    [[nodiscard]] bool ok() const { return m_file != nullptr; }
    // Whether a byte is left (reading the next chunk when this one is done).
    bool more() { return m_pos < m_end || refill(); }
    [[nodiscard]] char peek() const { return *m_pos; }
    void next() { ++m_pos; }
    void skipWs() {
        while (more() && (*m_pos == ' ' || *m_pos == '\n' || *m_pos == '\r' || *m_pos == '\t'))
            ++m_pos;
    }
    [[nodiscard]] int64_t offset() const { return m_consumed + (m_pos - m_buf.data()); }

    // Appends one JSON value's bytes (at the current position) to `out`: balanced braces
    // and brackets outside strings, a string, or a scalar up to its delimiter. False when
    // the file ends first.
    bool capture(std::string& out) {
        if (!more()) return false;
        const char first = *m_pos;
        if (first != '{' && first != '[' && first != '"') {
            const char* run = m_pos;
            while (true) {
                if (m_pos == m_end) {
                    out.append(run, m_pos);
                    if (!refill()) return true;  // a scalar may end the file
                    run = m_pos;
                }
                const char c = *m_pos;
                if (c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\r' ||
                    c == '\t')
                    break;
                ++m_pos;
            }
            out.append(run, m_pos);
            return true;
        }
        int depth = 0;
        bool inString = false, escape = false;
        const char* run = m_pos;
        while (true) {
            if (m_pos == m_end) {
                out.append(run, m_pos);
                if (!refill()) return false;
                run = m_pos;
            }
            const char c = *m_pos++;
            if (inString) {
                if (escape)
                    escape = false;
                else if (c == '\\')
                    escape = true;
                else if (c == '"') {
                    inString = false;
                    if (depth == 0) break;  // a lone string
                }
                continue;
            }
            if (c == '"')
                inString = true;
            else if (c == '{' || c == '[')
                ++depth;
            else if ((c == '}' || c == ']') && --depth == 0)
                break;
        }
        out.append(run, m_pos);
        return true;
    }

    [[nodiscard]] bool cancelled() const { return m_cancelled; }

private:
    bool refill() {
        if (!m_file || m_cancelled) return false;
        if (m_o.cancel && m_o.cancel->load()) {
            m_cancelled = true;  // reads as the end of the file; the caller reports it
            m_pos = m_end = m_buf.data();
            return false;
        }
        if (m_o.progress && m_fileBytes > 0)
            m_o.progress(std::min(
                1.0, static_cast<double>(gzoffset(m_file)) / static_cast<double>(m_fileBytes)));
        m_consumed += m_end - m_buf.data();
        const int n = gzread(m_file, m_buf.data(), static_cast<unsigned>(m_buf.size()));
        m_pos = m_buf.data();
        m_end = m_pos + std::max(0, n);
        return n > 0;
    }
    gzFile m_file;
    const KinetoImportOptions& m_o;
    int64_t m_fileBytes = 0;
    bool m_cancelled = false;
    std::vector<char> m_buf = std::vector<char>(256 << 10);
    const char* m_pos = m_buf.data();
    const char* m_end = m_buf.data();
    int64_t m_consumed = 0;
};

int64_t dtypeBytes(std::string_view d) {
    if (d.rfind("c10::", 0) == 0) d.remove_prefix(5);  // record_shapes' "c10::BFloat16"
    static const std::pair<const char*, int64_t> table[] = {
        {"Float", 4}, {"float", 4}, {"Half", 2}, {"BFloat16", 2}, {"Double", 8}, {"Int", 4},
        {"Long", 8},  {"Byte", 1},  {"Char", 1}, {"Bool", 1},     {"Short", 2},  {"Float8", 1}};
    for (const auto& [name, size] : table)
        if (d.rfind(name, 0) == 0) return size;
    if (d == "double") return 8;
    if (d == "long int" || d == "long") return 8;
    if (d == "int") return 4;
    return 0;
}

int64_t number(const json& j) {
    if (j.is_number_integer() || j.is_number_unsigned()) return j.get<int64_t>();
    if (j.is_number_float()) return static_cast<int64_t>(std::llround(j.get<double>()));
    if (j.is_string()) {
        try {
            return std::stoll(j.get<std::string>());
        } catch (...) {
        }
    }
    return 0;
}

// Microseconds (integer or fractional) to nanoseconds.
int64_t usToNs(const json& j) {
    if (j.is_number_float()) return static_cast<int64_t>(std::llround(j.get<double>() * 1000.0));
    return number(j) * 1000;
}

std::string tidString(const json& j) {
    return j.is_string() ? j.get<std::string>() : j.dump();
}

class Importer {
public:
    Importer(Trace& t, const KinetoImportOptions& o) : t(t), o(o) {}

    void consume(const json& e) {
        if (!e.is_object()) return;
        // Each field looked up once, strings by reference: a trace has millions of events.
        static const std::string none;
        auto str = [&](const char* k) -> const std::string& {
            const auto it = e.find(k);
            return it != e.end() && it->is_string() ? it->get_ref<const std::string&>() : none;
        };
        // A field of an unexpected type drops the event, counted (Trace::skippedBadFields).
        auto wrongType = [&](const char* k, bool (json::*ok)() const noexcept) {
            const auto it = e.find(k);
            return it != e.end() && !((*it).*ok)();
        };
        if (wrongType("ph", &json::is_string) || wrongType("name", &json::is_string) ||
            wrongType("cat", &json::is_string) || wrongType("ts", &json::is_number) ||
            wrongType("dur", &json::is_number)) {
            ++t.skippedBadFields;
            return;
        }
        const std::string& ph = str("ph");
        const std::string& cat = str("cat");
        const std::string& name = str("name");
        if (cat.empty()) {
            ++t.eventsByCategory["(" + ph + ")"];
        } else {
            if (!lastCategoryCount || cat != lastCategory) {
                lastCategory = cat;
                lastCategoryCount = &t.eventsByCategory[cat];
            }
            ++*lastCategoryCount;
        }
        if (ph == "M") {
            if (name == "thread_name" && e.contains("args"))
                threadNames[key(e)] = e["args"].value("name", "");
            if (name == "process_name" && e.contains("args") && e["args"].contains("name") &&
                e["args"]["name"].is_string())
                processNames[number(e.value("pid", json(0)))] =
                    e["args"]["name"].get<std::string>();
            return;
        }
        // ShardScope's own traces (`simulate --trace`, `run --trace`): the memory counter of
        // the first rank (the lowest pid; kept per pid until the end).
        if (ph == "C" && name == "memory (bytes)" && e.contains("args") && e["args"].is_object()) {
            MemoryCounter m;
            m.ts = usToNs(e.value("ts", json(0)));
            m.allocated = number(e["args"].value("allocated", json(0)));
            m.reserved = number(e["args"].value("reserved", json(0)));
            t.counterPeakAllocated = std::max(t.counterPeakAllocated, m.allocated);
            ourMemory[number(e.value("pid", json(0)))].push_back(m);
            return;
        }
        if (ph == "s") {
            ++t.flows;
            if (e.contains("id")) {
                flowPoints.push_back({flowId(e, cat), laneHash(key(e)) | FlowPoint::kStart,
                                      usToNs(e.value("ts", json(0)))});
            }
            return;
        }
        if (ph == "f") {
            if (e.contains("id")) {
                flowPoints.push_back({flowId(e, cat), laneHash(key(e)) & ~FlowPoint::kStart,
                                      usToNs(e.value("ts", json(0)))});
            }
            return;
        }
        if ((ph == "i" || ph == "I") && name == "[memory]") {
            memory(e);
            return;
        }
        if (ph != "X") return;
        if (cat == "python_function" && !o.keepPythonFunctions) {
            ++t.skippedPythonFunctions;
            return;
        }
        const json& args = e.contains("args") && e["args"].is_object() ? e["args"] : empty;
        if (cat == "cpu_op" || cat == "Operator") {
            if (name == "record_param_comms" && args.contains("External id"))
                paramComms[number(args["External id"])] = args;
        }
        // A ShardScope op (its step-program kind rides in args): one row per stream and rank.
        const bool ours =
            args.contains("op_id") && args.contains("kind") && args["kind"].is_string();
        // A CUDA run's FSDP ops are the host's launches (its kernels are the device work):
        // host rows, out of the device analyses.
        const bool onHost = ours && args.contains("launched_on_host") &&
                            args["launched_on_host"].is_boolean() &&
                            args["launched_on_host"].get<bool>();
        // A stream synchronisation (cuda_sync with a stream and a correlation) is GPU time,
        // as HTA counts it; a device-wide one (stream -1) is not on a stream.
        const bool streamSync = cat == "cuda_sync" && args.contains("stream") &&
                                args.contains("correlation") && number(args["stream"]) >= 0 &&
                                number(args["correlation"]) >= 0;
        const bool gpu = (ours && !onHost) || cat == "kernel" || cat == "gpu_memcpy" ||
                         cat == "gpu_memset" || cat == "Kernel" || cat == "Memcpy" ||
                         cat == "Memset" || streamSync;
        // Gloo's collectives (CPU runs): user_annotation ranges on Gloo's worker threads,
        // named "gloo:all_gather", sized by their input (record_shapes).
        const bool gloo = !gpu && name.rfind("gloo:", 0) == 0;
        const bool keepInputs = gloo || name.rfind("c10d::", 0) == 0 || name == "aten::embedding";
        const int64_t ts = usToNs(e.value("ts", json(0)));
        const int64_t dur = std::max<int64_t>(0, usToNs(e.value("dur", json(0))));
        minTs = std::min(minTs, ts);
        const int32_t laneId = lane(e, gpu);
        const auto idx = static_cast<int32_t>(t.start.size());
        t.start.push_back(ts);
        t.dur.push_back(dur);
        t.lane.push_back(laneId);
        t.name.push_back(t.strings.intern(name));
        t.category.push_back(t.strings.intern(cat));
        EventClass cls = EventClass::Cpu;
        if (ours && !onHost) {
            const std::string kind = args["kind"].get<std::string>();
            cls = kind == "all_gather" || kind == "reduce_scatter" || kind == "all_reduce"
                      ? EventClass::Communication
                  : kind == "forward" || kind == "backward" || kind == "recompute" ||
                          kind == "optimizer"
                      ? EventClass::Computation
                      : EventClass::Memory;
            if (cls == EventClass::Communication) {
                Collective c;
                c.event = idx;
                c.name = kind;
                c.bytes = args.contains("bytes") ? number(args["bytes"]) : 0;
                c.fullBytes = c.bytes;  // ShardScope writes the full tensor's bytes
                c.groupSize = args.contains("group_size")
                                  ? static_cast<int32_t>(number(args["group_size"]))
                                  : 0;
                t.collectives.push_back(std::move(c));
            }
        } else if (gloo) {
            cls = EventClass::Communication;
        } else if (gpu) {
            // Kernel names repeat by the thousand: classify each (name, category) once.
            const int64_t key = (static_cast<int64_t>(t.name.back()) << 32) |
                                static_cast<uint32_t>(t.category.back());
            auto it = classCache.find(key);
            cls = it != classCache.end()
                      ? it->second
                      : classCache.emplace(key, classifyDeviceEvent(name, cat)).first->second;
        }
        t.cls.push_back(cls);
        // A GPU op of a `shardscope run --device cuda` trace names the FSDP op that launched
        // it (fsdp_op_id, fsdp_unit, fsdp_phase): it joins the op's unit and phase.
        const char* idKey = ours ? "op_id" : "fsdp_op_id";
        const char* unitKey = ours ? "unit" : "fsdp_unit";
        const char* phaseKey = ours ? "phase" : "fsdp_phase";
        const bool labelled = ours || (gpu && args.contains("fsdp_op_id"));
        t.opId.push_back(labelled && args.contains(idKey) && args[idKey].is_number_integer()
                             ? args[idKey].get<int32_t>()
                             : -1);
        t.unit.push_back(labelled && args.contains(unitKey) && args[unitKey].is_string()
                             ? t.strings.intern(args[unitKey].get<std::string>())
                             : -1);
        t.phase.push_back(labelled && args.contains(phaseKey) && args[phaseKey].is_string()
                              ? t.strings.intern(args[phaseKey].get<std::string>())
                              : -1);
        const char* stepKey = ours ? "step" : "fsdp_step";
        if (labelled && args.contains(stepKey) && args[stepKey].is_number_integer())
            t.opStep.emplace(idx, args[stepKey].get<int32_t>());
        if (!ours && gpu && cls == EventClass::Communication && isNcclKernel(name))
            collective(idx, name, args);
        if (!gpu && (cat == "cpu_op" || cat == "Operator") && args.contains("stream") &&
            number(args["stream"]) >= 0)
            t.hostOpsWithStream.push_back(idx);
        if (keepInputs && args.contains("Input Dims")) {
            OpInputs in = inputsOf(args);
            if (gloo) {
                Collective c;
                c.event = idx;
                c.name = name.substr(5);
                if (!in.dims.empty()) {
                    c.elements = 1;
                    for (int64_t d : in.dims[0])
                        c.elements *= std::max<int64_t>(0, d);
                }
                if (!in.types.empty()) c.dtype = in.types[0];
                c.bytes = c.elements * dtypeBytes(c.dtype);
                c.fullBytes = c.bytes;  // the group (and so the gathered size) is unknown
                t.collectives.push_back(std::move(c));
            }
            t.opInputs.emplace(idx, std::move(in));
        }
    }

    // record_shapes' "Input Dims" (a list per input: a shape, or for a tensor list the
    // shapes of its tensors, given here as one 1-D shape of their total elements) and
    // "Input type".
    static OpInputs inputsOf(const json& args) {
        OpInputs in;
        const json& dims = args["Input Dims"];
        if (dims.is_array()) {
            for (const auto& d : dims) {
                std::vector<int64_t> shape;
                if (d.is_array()) {
                    bool nested = false;
                    int64_t total = 0;
                    for (const auto& x : d) {
                        if (x.is_array()) {
                            nested = true;
                            int64_t n = 1;
                            for (const auto& y : x)
                                n *= y.is_number_integer() ? std::max<int64_t>(0, y.get<int64_t>())
                                                           : 0;
                            total += n;
                        } else if (x.is_number_integer()) {
                            shape.push_back(x.get<int64_t>());
                        }
                    }
                    if (nested) shape = {total};
                }
                in.dims.push_back(std::move(shape));
            }
        }
        if (args.contains("Input type") && args["Input type"].is_array())
            for (const auto& ty : args["Input type"])
                in.types.push_back(ty.is_string() ? ty.get<std::string>() : std::string());
        return in;
    }

    void finish() {
        if (minTs == INT64_MAX) minTs = 0;
        if (!ourMemory.empty()) {
            auto& first = ourMemory.begin()->second;
            if (t.memory.empty())
                t.memory = std::move(first);
            else
                t.memory.insert(t.memory.end(), first.begin(), first.end());
        }
        resolveFlows();
        t.timeOriginNs = minTs;
        for (auto& s : t.start)
            s -= minTs;
        for (auto& m : t.memory)
            m.ts -= minTs;
        for (auto& m : t.hostMemory)
            m.ts -= minTs;
        for (auto& c : t.collectives) {
            if (c.bytes > 0) continue;
            // Fallback: the record_param_comms CPU op of the same External id.
            auto it = pendingExternal.find(c.event);
            if (it == pendingExternal.end()) continue;
            auto pc = paramComms.find(it->second);
            if (pc == paramComms.end()) continue;
            fill(c, pc->second);
        }
        // Several ranks in one file (`shardscope run --trace`): "rank 1 · compute".
        std::unordered_set<int64_t> pids;
        for (const auto& l : t.lanes)
            pids.insert(l.pid);
        for (auto& l : t.lanes) {
            auto it = threadNames.find(std::to_string(l.pid) + "/" + l.tid);
            l.name = it != threadNames.end() && !it->second.empty() ? it->second : l.tid;
            auto pn = processNames.find(l.pid);
            if (pids.size() > 1 && pn != processNames.end() && pn->second.rfind("rank ", 0) == 0) {
                const size_t sp = pn->second.find(' ', 5);
                l.name = pn->second.substr(0, sp) + " \u00b7 " + l.name;
                l.rank = static_cast<int32_t>(std::strtol(pn->second.c_str() + 5, nullptr, 10));
            }
            // Kineto writes "stream 7 " (trailing space) and quoted legacy tids.
            while (!l.name.empty() && (l.name.back() == ' ' || l.name.back() == '"'))
                l.name.pop_back();
            while (!l.name.empty() && l.name.front() == '"')
                l.name.erase(l.name.begin());
        }
    }

    void topLevel(const std::string& key, const json& v) {
        if (key == "baseTimeNanoseconds") baseTime = true;
        if (key == "metadata") t.metadata = v.dump();
        if (key != "distributedInfo" || !v.is_object()) return;
        if (v.contains("rank")) t.rank = number(v["rank"]);
        if (v.contains("world_size")) t.worldSize = number(v["world_size"]);
        if (!v.contains("pg_config") || !v["pg_config"].is_array()) return;
        for (const auto& g : v["pg_config"]) {
            if (!g.is_object()) continue;
            Trace::ProcessGroup pg;
            if (g.contains("pg_name") && g["pg_name"].is_string())
                pg.name = g["pg_name"].get<std::string>();
            if (g.contains("pg_desc") && g["pg_desc"].is_string())
                pg.desc = g["pg_desc"].get<std::string>();
            if (g.contains("pg_size")) pg.size = number(g["pg_size"]);
            if (g.contains("ranks") && g["ranks"].is_array())
                for (const auto& r : g["ranks"])
                    pg.ranks.push_back(number(r));
            t.processGroups.push_back(std::move(pg));
        }
    }

    bool baseTime = false;
    int64_t minTs = INT64_MAX;
    bool sawLegacy = false;

private:
    Trace& t;
    const KinetoImportOptions& o;
    const json empty = json::object();
    std::unordered_map<std::string, int32_t> laneIndex;
    std::unordered_map<std::string, std::string> threadNames;
    std::unordered_map<int64_t, std::string> processNames;
    std::map<int64_t, std::vector<MemoryCounter>> ourMemory;  // pid -> "memory (bytes)"
    // Flows by hashes of their id (with category) and of their lane's pid/tid: a trace has
    // tens of thousands, and strings per point cost more than the events they join.
    // 24 bytes a point: the start flag rides in the top bit of the lane's hash.
    struct FlowPoint {
        static constexpr uint64_t kStart = uint64_t{1} << 63;
        uint64_t id = 0;
        uint64_t laneAndStart = 0;  // laneHash of the lane's key, kStart on a flow's start
        int64_t ts = 0;
        [[nodiscard]] bool start() const { return (laneAndStart & kStart) != 0; }
        [[nodiscard]] uint64_t lane() const { return laneAndStart & ~kStart; }
    };
    std::vector<FlowPoint> flowPoints;

    static uint64_t flowId(const json& e, const std::string& cat) {
        return std::hash<std::string>{}(e["id"].dump() + "\x1f" + cat);
    }
    static uint64_t laneHash(const std::string& laneKey) {
        return std::hash<std::string>{}(laneKey) & ~FlowPoint::kStart;
    }

    // Each flow's ends bound to events: the innermost event of the flow point's lane that
    // encloses its time (Kineto's "bp": "e"; starts bind the same way, to the launch). Ends
    // whose id has no start are counted as orphans. Memory stays near the trace's own: one
    // index of the events by (lane, start), and the points sorted by id instead of a map.
    void resolveFlows() {
        if (flowPoints.empty()) return;
        std::unordered_map<uint64_t, int32_t> laneOfHash;
        for (const auto& [k, id] : laneIndex)
            laneOfHash.emplace(laneHash(k), id);
        std::vector<int32_t> byLane(t.size());
        for (size_t i = 0; i < t.size(); ++i)
            byLane[i] = static_cast<int32_t>(i);
        std::stable_sort(byLane.begin(), byLane.end(), [&](int32_t a, int32_t b) {
            return t.lane[a] != t.lane[b] ? t.lane[a] < t.lane[b] : t.start[a] < t.start[b];
        });
        std::vector<size_t> laneBegin(t.lanes.size() + 1, 0);
        for (size_t i = 0; i < t.size(); ++i)
            ++laneBegin[static_cast<size_t>(t.lane[i]) + 1];
        for (size_t l = 0; l < t.lanes.size(); ++l)
            laneBegin[l + 1] += laneBegin[l];
        auto enclosing = [&](const FlowPoint& f) -> int32_t {
            const auto it = laneOfHash.find(f.lane());
            if (it == laneOfHash.end()) return -1;
            const auto l = static_cast<size_t>(it->second);
            const auto first = byLane.begin() + static_cast<std::ptrdiff_t>(laneBegin[l]);
            const auto last = byLane.begin() + static_cast<std::ptrdiff_t>(laneBegin[l + 1]);
            auto up = std::upper_bound(first, last, f.ts,
                                       [&](int64_t ts, int32_t e) { return ts < t.start[e]; });
            for (int k = 0; k < 32 && up != first; ++k) {
                --up;
                if (t.start[*up] + t.dur[*up] >= f.ts) return *up;
            }
            return -1;
        };
        // By id, starts first, each kind in file order.
        std::stable_sort(flowPoints.begin(), flowPoints.end(),
                         [](const FlowPoint& x, const FlowPoint& y) {
                             return x.id != y.id ? x.id < y.id : x.start() > y.start();
                         });
        for (size_t i = 0; i < flowPoints.size();) {
            const uint64_t id = flowPoints[i].id;
            size_t j = i;
            bool hasStart = false;
            int32_t from = -1;
            for (; j < flowPoints.size() && flowPoints[j].id == id && flowPoints[j].start(); ++j) {
                hasStart = true;
                if (from < 0) from = enclosing(flowPoints[j]);
            }
            for (; j < flowPoints.size() && flowPoints[j].id == id; ++j) {
                if (!hasStart) {
                    ++t.orphanFlowEnds;
                    continue;
                }
                const int32_t to = enclosing(flowPoints[j]);
                if (from >= 0 && to >= 0) t.flowEvents.push_back({from, to});
            }
            i = j;
        }
        // A canonical order, independent of the ids: by the bound end, then the start.
        std::sort(t.flowEvents.begin(), t.flowEvents.end(), [](const auto& x, const auto& y) {
            return x.second != y.second ? x.second < y.second : x.first < y.first;
        });
        flowPoints = {};
    }
    std::unordered_map<int64_t, json> paramComms;
    std::unordered_map<int32_t, int64_t> pendingExternal;  // collective event -> External id
    std::unordered_map<int64_t, EventClass> classCache;    // (name id, category id) -> class
    int64_t legacyAllocated = 0;
    std::string lastCategory;
    int64_t* lastCategoryCount = nullptr;               // into t.eventsByCategory (node-stable)
    std::unordered_map<int64_t, int32_t> numericLanes;  // (pid << 32 | tid) -> lane

    static std::string key(const json& e) {
        return std::to_string(number(e.value("pid", json(0)))) + "/" +
               tidString(e.value("tid", json(0)));
    }

    int32_t lane(const json& e, bool gpu) {
        // Integer pid and tid (nearly every event): a numeric key, no string built.
        const auto pit = e.find("pid"), tit = e.find("tid");
        const bool numeric = pit != e.end() && tit != e.end() && pit->is_number_integer() &&
                             tit->is_number_integer();
        int64_t nk = 0;
        if (numeric) {
            nk = static_cast<int64_t>(static_cast<uint64_t>(pit->get<int64_t>()) << 32 ^
                                      static_cast<uint32_t>(tit->get<int64_t>()));
            const auto it = numericLanes.find(nk);
            if (it != numericLanes.end()) return it->second;
        }
        const int32_t id = laneByName(e, gpu);
        if (numeric) numericLanes.emplace(nk, id);
        return id;
    }

    int32_t laneByName(const json& e, bool gpu) {
        const std::string k = key(e);
        auto it = laneIndex.find(k);
        if (it != laneIndex.end()) return it->second;
        Lane l;
        l.rank = static_cast<int32_t>(t.rank);
        l.kind = gpu ? LaneKind::DeviceStream : LaneKind::HostThread;
        l.pid = number(e.value("pid", json(0)));
        l.tid = tidString(e.value("tid", json(0)));
        t.lanes.push_back(l);
        const auto id = static_cast<int32_t>(t.lanes.size() - 1);
        laneIndex.emplace(k, id);
        return id;
    }

    static bool isNcclKernel(const std::string& name) { return name.rfind("nccl", 0) == 0; }

    static void fill(Collective& c, const json& args) {
        if (args.contains("Collective name") && args["Collective name"].is_string())
            c.name = args["Collective name"].get<std::string>();
        const int64_t n = args.contains("In msg nelems")    ? number(args["In msg nelems"])
                          : args.contains("Out msg nelems") ? number(args["Out msg nelems"])
                                                            : 0;
        if (args.contains("dtype") && args["dtype"].is_string())
            c.dtype = args["dtype"].get<std::string>();
        const int64_t sz = args.contains("dtype") && args["dtype"].is_string()
                               ? dtypeBytes(args["dtype"].get<std::string>())
                               : 0;
        c.bytes = n * sz;
        const int64_t in = args.contains("In msg nelems") ? number(args["In msg nelems"]) : 0;
        const int64_t out = args.contains("Out msg nelems") ? number(args["Out msg nelems"]) : 0;
        c.fullBytes = std::max(in, out) * sz;
        if (args.contains("Group size"))
            c.groupSize = static_cast<int32_t>(number(args["Group size"]));
    }

    void collective(int32_t idx, const std::string& name, const json& args) {
        Collective c;
        c.event = idx;
        // ncclKernel_AllReduce_RING_LL_Sum_float(...) / ncclDevKernel_AllGather_RING_LL(...)
        const size_t us = name.find('_');
        if (us != std::string::npos) {
            const size_t end = name.find('_', us + 1);
            c.name =
                name.substr(us + 1, end == std::string::npos ? std::string::npos : end - us - 1);
            if (const size_t paren = c.name.find('('); paren != std::string::npos)
                c.name.resize(paren);
        }
        fill(c, args);
        if (c.bytes == 0 && args.contains("External id"))
            pendingExternal[idx] = number(args["External id"]);
        t.collectives.push_back(std::move(c));
    }

    void memory(const json& e) {
        const json& args = e.contains("args") && e["args"].is_object() ? e["args"] : empty;
        // Device Type 1 is CUDA (0 is CPU); legacy files carry only Bytes.
        const int64_t device = args.contains("Device Type") ? number(args["Device Type"]) : 1;
        if (device == 0) {  // the CPU allocator
            MemoryCounter m;
            m.ts = usToNs(e.value("ts", json(0)));
            m.allocated = args.contains("Total Allocated") ? number(args["Total Allocated"]) : 0;
            m.reserved = args.contains("Total Reserved") ? number(args["Total Reserved"]) : 0;
            t.hostMemory.push_back(m);
            return;
        }
        if (device != 1) return;
        MemoryCounter m;
        m.ts = usToNs(e.value("ts", json(0)));
        if (args.contains("Total Allocated")) {
            m.allocated = number(args["Total Allocated"]);
            m.reserved = args.contains("Total Reserved") ? number(args["Total Reserved"]) : 0;
        } else {
            sawLegacy = true;
            legacyAllocated += args.contains("Bytes") ? number(args["Bytes"]) : 0;
            m.allocated = legacyAllocated;
        }
        t.memory.push_back(m);
    }
};

// Cuts the file into events without building it whole: the elements of "traceEvents" (or
// of a top-level array) are captured one at a time, parsed by parseJsonSpan and handed to
// the importer; other top-level values go to Importer::topLevel.
class Splitter {
public:
    Splitter(GzReader& r, Importer& imp) : r(r), imp(imp) {}
    std::string error;
    bool sawEvents = false;  // a traceEvents array (or a top-level array of events)

    bool run() {
        r.skipWs();
        if (!r.more()) return fail("a JSON object or array");
        if (r.peek() == '[') {
            r.next();
            sawEvents = true;
            return events();
        }
        if (r.peek() != '{') return fail("'{' or '['");
        r.next();
        r.skipWs();
        if (r.more() && r.peek() == '}') return true;
        std::string key;
        while (true) {
            r.skipWs();
            if (!r.more() || r.peek() != '"') return fail("a key");
            raw.clear();
            if (!r.capture(raw) || !parse(raw)) return fail("a key");
            key = value.is_string() ? value.get<std::string>() : std::string();
            r.skipWs();
            if (!r.more() || r.peek() != ':') return fail("':'");
            r.next();
            r.skipWs();
            if (key == "traceEvents") {
                if (!r.more() || r.peek() != '[') {
                    error = "byte " + std::to_string(r.offset()) +
                            ": traceEvents: expected an array of events";
                    return false;
                }
                r.next();
                sawEvents = true;
                if (!events()) return false;
            } else {
                raw.clear();
                if (!r.capture(raw)) return fail("a value");
                if (!parse(raw)) return false;
                imp.topLevel(key, value);
            }
            r.skipWs();
            if (!r.more()) return fail("',' or '}'");
            const char c = r.peek();
            r.next();
            if (c == '}') return true;
            if (c != ',') return fail("',' or '}'");
        }
    }

private:
    GzReader& r;
    Importer& imp;
    std::string raw;
    json value;

    bool fail(const char* expected) {
        if (error.empty()) error = "byte " + std::to_string(r.offset()) + ": expected " + expected;
        return false;
    }
    bool parse(const std::string& text) {
        std::string why;
        if (parseJsonSpan(text, value, why)) return true;
        error =
            "byte " + std::to_string(r.offset() - static_cast<int64_t>(text.size())) + ": " + why;
        return false;
    }
    // After the array's '['.
    bool events() {
        r.skipWs();
        if (r.more() && r.peek() == ']') {
            r.next();
            return true;
        }
        while (true) {
            r.skipWs();
            raw.clear();
            if (!r.capture(raw)) return fail("an event");
            if (!parse(raw)) return false;
            imp.consume(value);
            r.skipWs();
            if (!r.more()) return fail("',' or ']'");
            const char c = r.peek();
            r.next();
            if (c == ']') return true;
            if (c != ',') return fail("',' or ']'");
        }
    }
};

}  // namespace

EventClass classifyDeviceEvent(const std::string& name, const std::string& cat) {
    static const std::regex comm("^nccl.*|^hip.*|^hccl.*|.*ncclKernel.*");
    static const std::regex mem("^(hip)?Memcpy.*|^(hip)?Memset.*|^dma.*");
    static const std::regex nonCompute(
        "^nccl.*|.*Memcpy.*|.*Memset.*|.*dma.*|^.*Sync.*|^Stream Wait "
        "Event.*|.*cuda.*LaunchKernel.*|^hip.*");
    if (std::regex_match(name, comm)) return EventClass::Communication;
    if (std::regex_match(name, mem) || cat == "gpu_memcpy" || cat == "gpu_memset" ||
        cat == "Memcpy" || cat == "Memset")
        return EventClass::Memory;
    if (!std::regex_match(name, nonCompute)) return EventClass::Computation;
    return EventClass::Other;
}

Expected<Trace> importKinetoFile(const std::string& path, const KinetoImportOptions& o) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        return Error{path +
                     ": a folder, where one trace file is expected (`trace summary`, "
                     "`trace overlap`, `plan recover`, `trace diff` and `calibrate` take "
                     "a folder of per-rank traces)"};
    GzReader reader(path, o);
    if (!reader.ok()) return Error{path + ": cannot open file"};
    Trace t;
    Importer imp(t, o);
    Splitter split(reader, imp);
    const bool ok = split.run();
    if (reader.cancelled()) return Error{path + ": cancelled"};
    if (!ok)
        return Error{path + ": not a valid Chrome/Kineto trace JSON: " +
                     (split.error.empty() ? "parse error" : split.error)};
    if (!split.sawEvents)
        return Error{path +
                     ": not a Chrome/Kineto trace: no traceEvents array (a PyTorch "
                     "profiler trace is an object with \"traceEvents\": [...])"};
    imp.finish();
    const bool legacy = t.eventsByCategory.count("Kernel") || t.eventsByCategory.count("Operator");
    t.dialect = legacy         ? "legacy 2021 categories"
                : imp.baseTime ? "modern (relative ts, baseTimeNanoseconds)"
                               : "absolute microseconds";
    return t;
}

}  // namespace shardscope
