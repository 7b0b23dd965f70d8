// SPDX-License-Identifier: Apache-2.0
#include "profiler/import/kineto_import.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <istream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <streambuf>
#include <unordered_set>

namespace shardscope {

namespace {

using json = nlohmann::json;

// std::streambuf over zlib's gzFile, which also reads uncompressed files transparently.
class GzStreamBuf : public std::streambuf {
public:
    explicit GzStreamBuf(const std::string& path) : m_file(gzopen(path.c_str(), "rb")) {
        if (m_file) gzbuffer(m_file, 1 << 20);
    }
    ~GzStreamBuf() override {
        if (m_file) gzclose(m_file);
    }
    [[nodiscard]] bool ok() const { return m_file != nullptr; }
    int64_t bytesRead = 0;

protected:
    int_type underflow() override {
        if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
        const int n = gzread(m_file, m_buf, sizeof m_buf);
        if (n <= 0) return traits_type::eof();
        bytesRead += n;
        setg(m_buf, m_buf, m_buf + n);
        return traits_type::to_int_type(*gptr());
    }

private:
    gzFile m_file;
    char m_buf[1 << 16];
};

int64_t dtypeBytes(const std::string& d) {
    static const std::pair<const char*, int64_t> table[] = {
        {"Float", 4}, {"float", 4}, {"Half", 2}, {"BFloat16", 2}, {"Double", 8}, {"Int", 4},
        {"Long", 8},  {"Byte", 1},  {"Char", 1}, {"Bool", 1},     {"Short", 2},  {"Float8", 1}};
    for (const auto& [name, size] : table)
        if (d.rfind(name, 0) == 0) return size;
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
        const std::string ph = e.value("ph", "");
        const std::string cat =
            e.contains("cat") && e["cat"].is_string() ? e["cat"].get<std::string>() : "";
        const std::string name =
            e.contains("name") && e["name"].is_string() ? e["name"].get<std::string>() : "";
        if (!cat.empty())
            ++t.eventsByCategory[cat];
        else
            ++t.eventsByCategory["(" + ph + ")"];
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
            ourMemory[number(e.value("pid", json(0)))].push_back(m);
            return;
        }
        if (ph == "s") {
            ++t.flows;
            if (e.contains("id")) flowStarts.push_back(e["id"].dump() + cat);
            return;
        }
        if (ph == "f") {
            if (e.contains("id")) flowEnds.push_back(e["id"].dump() + cat);
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
        const bool gpu = ours || cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset" ||
                         cat == "Kernel" || cat == "Memcpy" || cat == "Memset";
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
        if (ours) {
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
                c.groupSize = args.contains("group_size")
                                  ? static_cast<int32_t>(number(args["group_size"]))
                                  : 0;
                t.collectives.push_back(std::move(c));
            }
        } else if (gpu) {
            // Kernel names repeat by the thousand: classify each (name, category) once.
            const int64_t key = (static_cast<int64_t>(t.name.back()) << 32) |
                                static_cast<uint32_t>(t.category.back());
            auto it = classCache.find(key);
            cls = it != classCache.end()
                      ? it->second
                      : classCache.emplace(key, classify(name, cat)).first->second;
        }
        t.cls.push_back(cls);
        t.opId.push_back(ours && args["op_id"].is_number_integer() ? args["op_id"].get<int32_t>()
                                                                   : -1);
        t.unit.push_back(ours && args.contains("unit") && args["unit"].is_string()
                             ? t.strings.intern(args["unit"].get<std::string>())
                             : -1);
        t.phase.push_back(ours && args.contains("phase") && args["phase"].is_string()
                              ? t.strings.intern(args["phase"].get<std::string>())
                              : -1);
        if (!ours && gpu && cls == EventClass::Communication && isNcclKernel(name))
            collective(idx, name, args);
    }

    void finish() {
        if (minTs == INT64_MAX) minTs = 0;
        if (!ourMemory.empty()) {
            auto& first = ourMemory.begin()->second;
            t.memory.insert(t.memory.end(), first.begin(), first.end());
        }
        for (auto& s : t.start)
            s -= minTs;
        for (auto& m : t.memory)
            m.ts -= minTs;
        std::unordered_set<std::string> starts(flowStarts.begin(), flowStarts.end());
        for (const auto& f : flowEnds)
            if (!starts.count(f)) ++t.orphanFlowEnds;
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
        if (key == "distributedInfo" && v.is_object()) t.rank = v.value("rank", 0);
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
    std::vector<std::string> flowStarts, flowEnds;
    std::unordered_map<int64_t, json> paramComms;
    std::unordered_map<int32_t, int64_t> pendingExternal;  // collective event -> External id
    std::unordered_map<int64_t, EventClass> classCache;    // (name id, category id) -> class
    int64_t legacyAllocated = 0;

    static std::string key(const json& e) {
        return std::to_string(number(e.value("pid", json(0)))) + "/" +
               tidString(e.value("tid", json(0)));
    }

    int32_t lane(const json& e, bool gpu) {
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

    // HTA's classification (hta/common/types.py, hta/utils/utils.py), by kernel name.
    static EventClass classify(const std::string& name, const std::string& cat) {
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

    static bool isNcclKernel(const std::string& name) { return name.rfind("nccl", 0) == 0; }

    static void fill(Collective& c, const json& args) {
        if (args.contains("Collective name") && args["Collective name"].is_string())
            c.name = args["Collective name"].get<std::string>();
        const int64_t n = args.contains("In msg nelems")    ? number(args["In msg nelems"])
                          : args.contains("Out msg nelems") ? number(args["Out msg nelems"])
                                                            : 0;
        const int64_t sz = args.contains("dtype") && args["dtype"].is_string()
                               ? dtypeBytes(args["dtype"].get<std::string>())
                               : 0;
        c.bytes = n * sz;
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

// SAX handler: top-level keys are kept small; each element of "traceEvents" (or of a
// top-level array) is built as its own JSON value and handed to the importer.
class Sax : public json::json_sax_t {
public:
    explicit Sax(Importer& imp) : imp(imp) {}
    bool null() override { return put(json(nullptr)); }
    bool boolean(bool v) override { return put(json(v)); }
    bool number_integer(number_integer_t v) override { return put(json(v)); }
    bool number_unsigned(number_unsigned_t v) override { return put(json(v)); }
    bool number_float(number_float_t v, const string_t&) override { return put(json(v)); }
    bool string(string_t& v) override { return put(json(v)); }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return open(json::object()); }
    bool end_object() override { return close(); }
    bool start_array(std::size_t) override { return open(json::array()); }
    bool end_array() override { return close(); }
    bool key(string_t& k) override {
        if (depth == 1 && !topArray) topKey = k;
        if (!stack.empty()) pendingKey = k;
        return true;
    }
    bool parse_error(std::size_t pos, const std::string&,
                     const nlohmann::detail::exception& ex) override {
        error = "byte " + std::to_string(pos) + ": " + ex.what();
        return false;
    }
    std::string error;

private:
    Importer& imp;
    int depth = 0;
    bool topArray = false;
    std::string topKey, pendingKey;
    json current;
    std::vector<json*> stack;  // path inside `current`

    // Events live at depth 2 under "traceEvents" (or at depth 1 in a top-level array).
    bool eventLevel() const {
        return (topArray && depth == 1) || (!topArray && depth == 2 && topKey == "traceEvents");
    }
    bool collecting() const { return !stack.empty(); }

    bool open(json v) {
        if (depth == 0 && v.is_array()) topArray = true;
        if (collecting()) {
            json* parent = stack.back();
            json* child = parent->is_array() ? &parent->emplace_back(std::move(v))
                                             : &((*parent)[pendingKey] = std::move(v));
            stack.push_back(child);
        } else if (eventLevel() || (!topArray && depth == 1 && topKey != "traceEvents")) {
            current = std::move(v);
            stack.push_back(&current);
        }
        ++depth;
        return true;
    }
    bool close() {
        --depth;
        if (!collecting()) return true;
        stack.pop_back();
        if (stack.empty()) {
            if (eventLevel())
                imp.consume(current);
            else if (!topArray && depth == 1)
                imp.topLevel(topKey, current);
            current = json();
        }
        return true;
    }
    bool put(json v) {
        if (collecting()) {
            json* parent = stack.back();
            if (parent->is_array())
                parent->push_back(std::move(v));
            else
                (*parent)[pendingKey] = std::move(v);
        } else if (!topArray && depth == 1) {
            imp.topLevel(topKey, v);
        }
        return true;
    }
};

}  // namespace

Expected<Trace> importKinetoFile(const std::string& path, const KinetoImportOptions& o) {
    GzStreamBuf buf(path);
    if (!buf.ok()) return Error{path + ": cannot open file"};
    std::istream in(&buf);
    Trace t;
    Importer imp(t, o);
    Sax sax(imp);
    const bool ok = json::sax_parse(in, &sax, json::input_format_t::json, false);
    if (!ok)
        return Error{path + ": not a valid Chrome/Kineto trace JSON: " +
                     (sax.error.empty() ? "parse error" : sax.error)};
    imp.finish();
    const bool legacy = t.eventsByCategory.count("Kernel") || t.eventsByCategory.count("Operator");
    t.dialect = legacy         ? "legacy 2021 categories"
                : imp.baseTime ? "modern (relative ts, baseTimeNanoseconds)"
                               : "absolute microseconds";
    return t;
}

}  // namespace shardscope
