// SPDX-License-Identifier: Apache-2.0
#include "profiler/import/kineto_import.h"

#include "profiler/import/event_stream.h"
#include "profiler/import/json_span.h"

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

namespace shardscope {

namespace {

using json = nlohmann::ordered_json;  // vector-backed objects: cheaper to build per event

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
    if (d == "unsigned char" || d == "signed char" || d == "bool") return 1;
    if (d == "short int" || d == "short") return 2;
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

using trace_stream::isJsonSpace;

class Importer final : public trace_stream::EventConsumer {
public:
    Importer(Trace& t, const KinetoImportOptions& o) : t(t), o(o) {}

    // One event's top-level fields, read by simdjson On-Demand straight from its bytes;
    // "args" stays raw JSON, parsed (parseJsonSpan) only for the events that need it.
    struct Fields {
        std::string_view ph, cat, name;
        bool hasPid = false, pidInt = false, pidString = false;
        bool hasTid = false, tidInt = false, tidString = false;
        int64_t pid = 0, tid = 0;
        std::string_view pidText, tidText;  // a string's content, or a number's raw JSON
        double pidDouble = 0;
        bool hasTs = false, hasDur = false;
        int64_t tsNs = 0, durNs = 0;
        bool hasId = false;
        std::string_view id;  // raw JSON
        bool hasArgs = false;
        std::string_view args;  // raw JSON
        size_t argsPadded = 0;  // bytes readable from args.data() (simdjson's padding)

        [[nodiscard]] int64_t pidNumber() const {
            if (pidInt) return pid;
            if (pidString) {
                int64_t v = 0;
                const auto r = std::from_chars(pidText.data(), pidText.data() + pidText.size(), v);
                return r.ec == std::errc() ? v : 0;
            }
            return hasPid ? static_cast<int64_t>(std::llround(pidDouble)) : 0;
        }
        [[nodiscard]] std::string tidStr() const {
            if (tidInt) return std::to_string(tid);
            return hasTid ? std::string(tidText) : std::string("0");
        }
        [[nodiscard]] std::string key() const {
            return std::to_string(pidNumber()) + "/" + tidStr();
        }
    };

    // Microseconds (integer or fractional) to nanoseconds.
    enum class UsRead { Ok, NotANumber, OutOfRange };
    // A value's raw JSON token without the whitespace simdjson leaves after it.
    static std::string_view trimmedToken(simdjson::ondemand::value& v) {
        std::string_view tok = v.raw_json_token();
        while (!tok.empty() && isJsonSpace(tok.back()))
            tok.remove_suffix(1);
        return tok;
    }
    // Kineto's microseconds as it writes them, an integer or up to three decimals
    // ("ts": 5615036874217.012), to nanoseconds exactly, from the digits: no floating point
    // (whose division was the importer's costliest instruction) and no rounding. False for
    // anything else (an exponent, more decimals, a leading zero, beyond 9.2e12 us): the
    // caller reads those through simdjson.
    // An optional '-' and the digits after it from tok[i] on, at most `maxDigits` and without
    // a leading zero (JSON's integer part); i is left after them. False otherwise.
    static bool leadingInteger(std::string_view tok, size_t& i, size_t maxDigits, int64_t& out) {
        const bool negative = i < tok.size() && tok[i] == '-';
        if (negative) ++i;
        const size_t start = i;
        int64_t v = 0;
        while (i < tok.size() && tok[i] >= '0' && tok[i] <= '9') {
            if (i - start == maxDigits) return false;
            v = v * 10 + (tok[i++] - '0');
        }
        if (i == start || (tok[start] == '0' && i - start > 1)) return false;
        out = negative ? -v : v;
        return true;
    }
    static bool exactUs(std::string_view tok, int64_t& ns) {
        size_t i = 0;
        int64_t whole = 0;
        if (!leadingInteger(tok, i, 13, whole) || whole > 9'200'000'000'000 ||
            whole < -9'200'000'000'000)
            return false;
        int64_t frac = 0;
        int digits = 0;
        if (i < tok.size() && tok[i] == '.') {
            ++i;
            while (i < tok.size() && tok[i] >= '0' && tok[i] <= '9') {
                if (++digits > 3) return false;
                frac = frac * 10 + (tok[i++] - '0');
            }
            if (digits == 0) return false;
        }
        if (i != tok.size()) return false;
        for (int d = digits; d < 3; ++d)
            frac *= 10;
        ns = whole * 1000 + (tok[0] == '-' ? -frac : frac);
        return true;
    }
    // An integer pid or tid from its digits (at most 18, no leading zero); false for
    // anything else, which simdjson reads.
    static bool exactInt(std::string_view tok, int64_t& out) {
        size_t i = 0;
        return leadingInteger(tok, i, 18, out) && i == tok.size();
    }
    static UsRead readUs(simdjson::ondemand::value& v, int64_t& ns) {
        simdjson::ondemand::json_type jt;
        if (v.type().get(jt) || jt != simdjson::ondemand::json_type::number)
            return UsRead::NotANumber;
        if (exactUs(trimmedToken(v), ns)) return UsRead::Ok;
        // A number whose nanoseconds do not fit int64 (beyond about 106 days of
        // microseconds, or beyond double's range) cannot be placed on the timeline.
        simdjson::ondemand::number_type nt;
        if (v.get_number_type().get(nt)) return UsRead::OutOfRange;
        if (nt == simdjson::ondemand::number_type::floating_point_number) {
            double d = 0;
            if (v.get_double().get(d) || !std::isfinite(d) || std::abs(d) > 9.2e12)
                return UsRead::OutOfRange;
            ns = static_cast<int64_t>(std::llround(d * 1000.0));
            return UsRead::Ok;
        }
        int64_t i = 0;
        if (v.get_int64().get(i) || i > INT64_MAX / 1000 || i < INT64_MIN / 1000)
            return UsRead::OutOfRange;
        ns = i * 1000;
        return UsRead::Ok;
    }
    // pid / tid: an integer, a string, or (rarely) another number.
    static bool readId(simdjson::ondemand::value& v, bool& isInt, bool& isString, int64_t& i,
                       std::string_view& text, double* asDouble) {
        simdjson::ondemand::json_type jt;
        if (v.type().get(jt)) return false;
        if (jt == simdjson::ondemand::json_type::string) {
            isString = true;
            return !v.get_string().get(text);
        }
        if (jt != simdjson::ondemand::json_type::number) return false;
        if (exactInt(trimmedToken(v), i)) {
            isInt = true;
            return true;
        }
        simdjson::ondemand::number_type nt;
        if (v.get_number_type().get(nt)) return false;
        if (nt == simdjson::ondemand::number_type::signed_integer) {
            isInt = true;
            return !v.get_int64().get(i);
        }
        text = trimmedToken(v);
        double d = 0;
        if (v.get_double().get(d)) return false;
        if (asDouble) *asDouble = d;
        return true;
    }

    // A string value's content without copying it: the bytes between its quotes, in place,
    // when it has no escape (almost every name and category); else simdjson unescapes it.
    // False when the value is not a string.
    bool eventEscapes = true;  // whether the event being read has a backslash (in a string)
    bool readString(simdjson::ondemand::value& v, std::string_view& out) const {
        std::string_view tok = trimmedToken(v);
        if (tok.size() < 2 || tok.front() != '"' || tok.back() != '"') return false;
        tok = tok.substr(1, tok.size() - 2);
        if (!eventEscapes || std::memchr(tok.data(), '\\', tok.size()) == nullptr) {
            out = tok;
            return true;
        }
        return !v.get_string().get(out);
    }

    enum class Key : uint8_t { Ph, Cat, Name, Pid, Tid, Ts, Dur, Id, Args, Other };
    // A key from its raw bytes (after the opening quote; the event's bytes and their padding
    // follow, so five are readable): the keys we read have no escapes and at most four
    // characters. Unknown when a backslash comes first: the caller unescapes it.
    enum class RawKey : uint8_t { Known, Escaped };
    static RawKey rawKeyOf(const char* r, Key& key) {
        for (size_t i = 0; i < 5; ++i) {
            if (r[i] == '\\') return RawKey::Escaped;
            if (r[i] == '"') {
                key = keyOf(std::string_view(r, i));
                return RawKey::Known;
            }
        }
        key = Key::Other;  // five characters or more, none escaped: not one of ours
        return RawKey::Known;
    }
    static inline Key keyOf(std::string_view k) {
        switch (k.size()) {
            case 2:
                if (k[0] == 'p' && k[1] == 'h') return Key::Ph;
                if (k[0] == 't' && k[1] == 's') return Key::Ts;
                if (k[0] == 'i' && k[1] == 'd') return Key::Id;
                return Key::Other;
            case 3:
                if (k[0] == 'c' && k[1] == 'a' && k[2] == 't') return Key::Cat;
                if (k[0] == 'p' && k[1] == 'i' && k[2] == 'd') return Key::Pid;
                if (k[0] == 't' && k[1] == 'i' && k[2] == 'd') return Key::Tid;
                if (k[0] == 'd' && k[1] == 'u' && k[2] == 'r') return Key::Dur;
                return Key::Other;
            case 4:  // by character: a comparison with a literal calls memcmp
                if (k[0] == 'n' && k[1] == 'a' && k[2] == 'm' && k[3] == 'e') return Key::Name;
                if (k[0] == 'a' && k[1] == 'r' && k[2] == 'g' && k[3] == 's') return Key::Args;
                return Key::Other;
            default:
                return Key::Other;
        }
    }

    // Parses one event: its bytes, readable for `padded` bytes (SIMDJSON_PADDING past them).
    // False on a JSON syntax error (`error` says what); a field of an unexpected type drops
    // the event, counted.
    bool consumeRaw(std::string_view raw, size_t padded, bool escapes,
                    std::string& error) override {
        eventEscapes = escapes;
        simdjson::ondemand::document doc;
        if (auto err = parser.iterate(raw.data(), raw.size(), padded).get(doc)) {
            error = simdjson::error_message(err);
            return false;
        }
        simdjson::ondemand::json_type jt;
        if (auto err = doc.type().get(jt)) {
            error = simdjson::error_message(err);
            return false;
        }
        if (jt != simdjson::ondemand::json_type::object) {
            ++t.skippedBadFields;  // an event that is not an object
            return true;
        }
        simdjson::ondemand::object obj;
        if (auto err = doc.get_object().get(obj)) {
            error = simdjson::error_message(err);
            return false;
        }
        return consumeObject(obj, raw.data() + padded, error);
    }

    // Parses a run of whole events, [first, last) of the chunk: the bytes just before and
    // just after it are made '[' and ']' (and put back), so that simdjson indexes the run
    // once, as one array, instead of once per event. Returns how many events it consumed;
    // fewer than `count` when it stopped at one it could not parse, which the caller then
    // parses alone (for that event's own error message).
    size_t consumeBatch(char* first, char* last, size_t count, const char* readableEnd,
                        bool escapes) override {
        eventEscapes = escapes;
        const char before = first[-1], after = *last;
        first[-1] = '[';
        *last = ']';
        size_t done = 0;
        std::string ignored;
        simdjson::ondemand::document doc;
        simdjson::ondemand::array arr;
        if (!parser
                 .iterate(first - 1, static_cast<size_t>(last + 1 - (first - 1)),
                          static_cast<size_t>(readableEnd - (first - 1)))
                 .get(doc) &&
            !doc.get_array().get(arr)) {
            for (auto elementResult : arr) {
                if (elementResult.error()) break;
                simdjson::ondemand::value& element = elementResult.value_unsafe();
                simdjson::ondemand::json_type jt;
                if (element.type().get(jt)) break;
                if (jt != simdjson::ondemand::json_type::object) {
                    ++t.skippedBadFields;  // an event that is not an object
                    ++done;
                    continue;
                }
                simdjson::ondemand::object obj;
                if (element.get_object().get(obj) || !consumeObject(obj, readableEnd, ignored))
                    break;
                if (++done == count) break;
            }
        }
        first[-1] = before;
        *last = after;
        return done;
    }

    // One event's fields; `readableEnd`: the end of the bytes readable after them (simdjson's
    // padding included).
    bool consumeObject(simdjson::ondemand::object& obj, const char* readableEnd,
                       std::string& error) {
        Fields f;
        bool bad = false, outOfRange = false;
        for (auto fieldResult : obj) {
            if (auto err = fieldResult.error()) {
                error = simdjson::error_message(err);
                return false;
            }
            // The field and its value by reference: copying simdjson's result wrappers cost
            // a stalled 16-byte load per field (a fifth of the import, measured by perf).
            simdjson::ondemand::field& field = fieldResult.value_unsafe();
            // Keys by length and first letter from their raw bytes: no unescaping and no
            // string comparison for the common ones.
            Key key = Key::Other;
            if (rawKeyOf(field.key().raw(), key) == RawKey::Escaped) {
                std::string_view k;
                if (auto err = field.unescaped_key().get(k)) {
                    error = simdjson::error_message(err);
                    return false;
                }
                key = keyOf(k);
            }
            simdjson::ondemand::value& v = field.value();
            if (key == Key::Other) continue;  // skipped unread
            if (key == Key::Ph || key == Key::Cat || key == Key::Name) {
                std::string_view sv;
                if (!readString(v, sv)) {
                    bad = true;
                    continue;
                }
                (key == Key::Ph ? f.ph : key == Key::Cat ? f.cat : f.name) = sv;
            } else if (key == Key::Ts || key == Key::Dur) {
                int64_t ns = 0;
                const UsRead got = readUs(v, ns);
                if (got != UsRead::Ok) {
                    (got == UsRead::OutOfRange ? outOfRange : bad) = true;
                    continue;
                }
                if (key == Key::Ts) {
                    f.hasTs = true;
                    f.tsNs = ns;
                } else {
                    f.hasDur = true;
                    f.durNs = ns;
                }
            } else if (key == Key::Pid) {
                f.hasPid = readId(v, f.pidInt, f.pidString, f.pid, f.pidText, &f.pidDouble);
                bad = bad || !f.hasPid;
            } else if (key == Key::Tid) {
                f.hasTid = readId(v, f.tidInt, f.tidString, f.tid, f.tidText, nullptr);
                bad = bad || !f.hasTid;
            } else if (key == Key::Id) {
                simdjson::ondemand::json_type it;
                if (v.type().get(it)) {
                    error = "a bad id";
                    return false;
                }
                if (it == simdjson::ondemand::json_type::object ||
                    it == simdjson::ondemand::json_type::array) {
                    bad = true;  // flow ids are numbers or strings
                    continue;
                }
                f.id = trimmedToken(v);
                f.hasId = true;
            } else if (key == Key::Args) {
                simdjson::ondemand::object ao;
                if (v.get_object().get(ao)) continue;  // args that are not an object: none
                if (auto err = ao.raw_json().get(f.args)) {
                    error = simdjson::error_message(err);
                    return false;
                }
                f.hasArgs = true;
                f.argsPadded = static_cast<size_t>(readableEnd - f.args.data());
            }
        }
        if (bad) {
            ++t.skippedBadFields;
            return true;
        }
        if (outOfRange) {
            ++t.skippedOutOfRange;
            return true;
        }
        // A negative duration (or a time before the trace's epoch) has no interval to draw
        // or sum: the event is skipped and counted, never folded into a breakdown.
        if ((f.hasDur && f.durNs < 0) || (f.hasTs && f.tsNs < 0)) {
            ++t.skippedNegativeTime;
            return true;
        }
        consume(f);
        return true;
    }

    // The event's args as JSON (an empty object when absent or not an object).
    const json& argsOf(const Fields& f) {
        argsJson = json::object();
        if (!f.hasArgs) return argsJson;
        std::string why;
        if (!parseJsonSpan(f.args, argsJson, why) || !argsJson.is_object())
            argsJson = json::object();
        return argsJson;
    }
    static bool argsMention(const Fields& f, std::string_view quotedKey) {
        // memmem: string_view::find would compare at every '"' of the args.
        return f.hasArgs && ::memmem(f.args.data(), f.args.size(), quotedKey.data(),
                                     quotedKey.size()) != nullptr;
    }
    // Kineto's own categories: a ShardScope op (args.op_id) never has one of them.
    static bool kinetoCategory(std::string_view cat) {
        static constexpr std::string_view known[] = {"kernel",          "cpu_op",
                                                     "cuda_runtime",    "cuda_driver",
                                                     "gpu_memcpy",      "gpu_memset",
                                                     "user_annotation", "gpu_user_annotation",
                                                     "python_function", "cpu_instant_event",
                                                     "overhead",        "Operator",
                                                     "Runtime",         "Kernel",
                                                     "Memcpy",          "Memset",
                                                     "cuda_sync",       "ac2g",
                                                     "fwdbwd"};
        for (const auto k : known)
            if (cat == k) return true;
        return false;
    }

    // Names and categories repeat by the thousand, and kernel names run to hundreds of bytes:
    // a direct-mapped cache of string ids, hashed from the length and the first and last
    // eight bytes (which are the whole string up to 16 bytes: no comparison then), answers
    // most lookups; a miss (or a collision) asks the string table, whose index hashes the
    // whole string.
    struct InternSlot {
        uint64_t head = 0, tail = 0;
        size_t size = 0;
        int32_t id = -1;
    };
    std::vector<InternSlot> internCache = std::vector<InternSlot>(size_t{1} << 12);
    int32_t internCached(std::string_view s) {
        uint64_t head = 0, tail = 0;
        if (!s.empty()) std::memcpy(&head, s.data(), std::min<size_t>(8, s.size()));
        if (s.size() > 8) std::memcpy(&tail, s.data() + s.size() - 8, 8);
        const uint64_t h = (head * 0x9E3779B97F4A7C15ULL) ^ (tail * 0xC2B2AE3D27D4EB4FULL) ^
                           (s.size() * 0x165667B19E3779F9ULL);
        InternSlot& slot = internCache[static_cast<size_t>((h ^ (h >> 29)) >> 52)];
        if (slot.id >= 0 && slot.size == s.size() && slot.head == head && slot.tail == tail &&
            (s.size() <= 16 ||
             std::memcmp(t.strings.at(slot.id).data() + 8, s.data() + 8, s.size() - 16) == 0))
            return slot.id;
        slot = {head, tail, s.size(), t.strings.intern(s)};
        return slot.id;
    }

    // What the importer needs to know of a category or a name, worked out once per string.
    struct CatInfo {
        bool hostOp = false, device = false, kineto = false, pythonFunction = false,
             cudaSync = false;
    };
    struct NameInfo {
        bool gloo = false, keepInputs = false, recordParamComms = false, nccl = false;
        int32_t classCategory = -2;  // the category deviceClass was worked out with
        EventClass deviceClass = EventClass::Other;
    };
    std::vector<int8_t> catKnown, nameKnown;  // by string id: info computed
    std::vector<CatInfo> catInfo;
    std::vector<NameInfo> nameInfo;
    std::vector<int64_t> countByCat;  // events per category string id
    int64_t uncategorised[4] = {};    // events without a category, by ph: X, M, i, other
    std::unordered_map<std::string, int64_t> uncategorisedOther;

    const CatInfo& catInfoOf(int32_t id, std::string_view cat) {
        const auto i = static_cast<size_t>(id);
        if (i >= catKnown.size()) {
            catKnown.resize(i + 1, 0);
            catInfo.resize(i + 1);
        }
        if (!catKnown[i]) {
            catKnown[i] = 1;
            CatInfo& c = catInfo[i];
            c.hostOp = cat == "cpu_op" || cat == "Operator";
            c.device = cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset" ||
                       cat == "Kernel" || cat == "Memcpy" || cat == "Memset";
            c.kineto = kinetoCategory(cat);
            c.pythonFunction = cat == "python_function";
            c.cudaSync = cat == "cuda_sync";
        }
        return catInfo[i];
    }
    const NameInfo& nameInfoOf(int32_t id, std::string_view name) {
        const auto i = static_cast<size_t>(id);
        if (i >= nameKnown.size()) {
            nameKnown.resize(i + 1, 0);
            nameInfo.resize(i + 1);
        }
        if (!nameKnown[i]) {
            nameKnown[i] = 1;
            NameInfo& n = nameInfo[i];
            n.gloo = name.substr(0, 5) == "gloo:";
            // aten::copy_ and fsdp::chunk_cat: their dtypes show FSDP2's parameter and
            // reduce dtypes where one rank gathers and reduces nothing.
            n.keepInputs = n.gloo || name.substr(0, 6) == "c10d::" || name == "aten::embedding" ||
                           name == "aten::copy_" || name == "fsdp::chunk_cat";
            n.recordParamComms = name == "record_param_comms";
            n.nccl = name.substr(0, 4) == "nccl";
        }
        return nameInfo[i];
    }

    // Metadata, counters, flows and memory events: not complete events. True when `f` is one.
    bool consumeMarker(const Fields& f) {
        const std::string_view ph = f.ph, cat = f.cat, name = f.name;
        if (ph == "M") {
            const json& a = argsOf(f);
            if (name == "thread_name" && f.hasArgs)
                threadNames[f.key()] = a.contains("name") && a["name"].is_string()
                                           ? a["name"].get<std::string>()
                                           : std::string();
            if (name == "process_name" && a.contains("name") && a["name"].is_string())
                processNames[f.pidNumber()] = a["name"].get<std::string>();
            return true;
        }
        // ShardScope's own traces (`simulate --trace`, `run --trace`): the memory counter of
        // the first rank (the lowest pid; kept per pid until the end).
        if (ph == "C" && name == "memory (bytes)" && f.hasArgs) {
            const json& a = argsOf(f);
            MemoryCounter m;
            m.ts = f.tsNs;
            m.allocated = a.contains("allocated") ? number(a["allocated"]) : 0;
            m.reserved = a.contains("reserved") ? number(a["reserved"]) : 0;
            t.counterPeakAllocated = std::max(t.counterPeakAllocated, m.allocated);
            ourMemory[f.pidNumber()].push_back(m);
            return true;
        }
        if (ph == "s" || ph == "f") {
            if (ph == "s") ++t.flows;
            if (f.hasId) {
                const uint64_t lh = laneHash(f.key());
                flowPoints.push_back({flowId(f.id, cat),
                                      ph == "s" ? lh | FlowPoint::kStart : lh & ~FlowPoint::kStart,
                                      f.tsNs});
            }
            return true;
        }
        if ((ph == "i" || ph == "I") && name == "[memory]") {
            memory(f, argsOf(f));
            return true;
        }
        return false;
    }

    // The class of a complete event: ShardScope's op kinds, Gloo's ranges, a device kernel
    // by its name and category (each pair classified once); a host event otherwise.
    EventClass eventClass(int32_t idx, int32_t nameId, std::string_view name, std::string_view cat,
                          const json& args, bool ours, bool onHost, bool gloo, bool gpu) {
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
            // Kernel names repeat by the thousand: classify each (name, category) once. A
            // name nearly always comes with one category: the last one is kept by the name.
            NameInfo& n = nameInfo[static_cast<size_t>(nameId)];
            const int32_t catKey = t.category.back();
            if (n.classCategory == catKey) {
                cls = n.deviceClass;
            } else {
                const int64_t key =
                    (static_cast<int64_t>(nameId) << 32) | static_cast<uint32_t>(catKey);
                auto it = classCache.find(key);
                cls = it != classCache.end()
                          ? it->second
                          : classCache
                                .emplace(key,
                                         classifyDeviceEvent(std::string(name), std::string(cat)))
                                .first->second;
                n.classCategory = catKey;
                n.deviceClass = cls;
            }
        }
        return cls;
    }

    // A GPU op of a `shardscope run --device cuda` trace names the FSDP op that launched it
    // (fsdp_op_id, fsdp_unit, fsdp_phase): it joins the op's unit and phase.
    void labelEvent(int32_t idx, const json& args, bool ours, bool gpu) {
        const char* idKey = ours ? "op_id" : "fsdp_op_id";
        const char* unitKey = ours ? "unit" : "fsdp_unit";
        const char* phaseKey = ours ? "phase" : "fsdp_phase";
        const bool labelled = ours || (gpu && args.contains("fsdp_op_id"));
        t.opId.push_back(labelled && args.contains(idKey) && args[idKey].is_number_integer()
                             ? static_cast<int32_t>(
                                   std::clamp<int64_t>(args[idKey].get<int64_t>(), -1, INT32_MAX))
                             : -1);
        t.unit.push_back(labelled && args.contains(unitKey) && args[unitKey].is_string()
                             ? t.strings.intern(args[unitKey].get<std::string>())
                             : -1);
        t.phase.push_back(labelled && args.contains(phaseKey) && args[phaseKey].is_string()
                              ? t.strings.intern(args[phaseKey].get<std::string>())
                              : -1);
        const char* stepKey = ours ? "step" : "fsdp_step";
        if (labelled && args.contains(stepKey) && args[stepKey].is_number_integer())
            t.opStep.emplace(idx, static_cast<int32_t>(std::clamp<int64_t>(
                                      args[stepKey].get<int64_t>(), INT32_MIN, INT32_MAX)));
    }

    void consume(const Fields& f) {
        const std::string_view ph = f.ph, cat = f.cat, name = f.name;
        const bool complete = ph.size() == 1 && ph[0] == 'X';
        int32_t catId = -1;
        if (cat.empty()) {
            if (complete)
                ++uncategorised[0];
            else
                ++uncategorisedOther["(" + std::string(ph) + ")"];
        } else {
            catId = internCached(cat);
            if (static_cast<size_t>(catId) >= countByCat.size())
                countByCat.resize(static_cast<size_t>(catId) + 1, 0);
            ++countByCat[static_cast<size_t>(catId)];
        }
        if (consumeMarker(f)) return;
        if (!complete) return;
        static const CatInfo noCategory{};
        const CatInfo& ci = catId >= 0 ? catInfoOf(catId, cat) : noCategory;
        if (ci.pythonFunction && !o.keepPythonFunctions) {
            ++t.skippedPythonFunctions;
            return;
        }
        const int32_t nameId = internCached(name);
        const NameInfo ni = nameInfoOf(nameId, name);
        const bool hostOpCat = ci.hostOp;
        const bool glooName = ni.gloo;
        const bool keepInputs = ni.keepInputs || (o.keepAllOpInputs && hostOpCat);
        const bool deviceCat = ci.device;
        // Only some events need their args parsed: most kernels and ops do not.
        const bool needArgs =
            f.hasArgs && (ci.cudaSync || (hostOpCat && ni.recordParamComms) || keepInputs ||
                          (!ci.kineto && argsMention(f, "\"op_id\"")) ||
                          (deviceCat && argsMention(f, "\"fsdp_op_id\"")) ||
                          (hostOpCat && argsMention(f, "\"stream\"")));
        const json& args = needArgs ? argsOf(f) : empty;
        if (hostOpCat && ni.recordParamComms && args.contains("External id"))
            paramComms[number(args["External id"])] = args;
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
        const bool streamSync = ci.cudaSync && args.contains("stream") &&
                                args.contains("correlation") && number(args["stream"]) >= 0 &&
                                number(args["correlation"]) >= 0;
        const bool gpu = (ours && !onHost) || deviceCat || streamSync;
        // Gloo's collectives (CPU runs): user_annotation ranges on Gloo's worker threads,
        // named "gloo:all_gather", sized by their input (record_shapes).
        const bool gloo = !gpu && glooName;
        const int64_t ts = f.tsNs;
        const int64_t dur = std::max<int64_t>(0, f.durNs);
        minTs = std::min(minTs, ts);
        const int32_t laneId = lane(f, gpu);
        const auto idx = static_cast<int32_t>(t.start.size());
        t.start.push_back(ts);
        t.dur.push_back(dur);
        t.lane.push_back(laneId);
        t.name.push_back(nameId);
        t.category.push_back(catId >= 0 ? catId : t.strings.intern(""));
        const EventClass cls = eventClass(idx, nameId, name, cat, args, ours, onHost, gloo, gpu);
        t.cls.push_back(cls);
        labelEvent(idx, args, ours, gpu);
        if (!ours && gpu && cls == EventClass::Communication && ni.nccl) {
            NcclArgs na;
            if (needArgs)
                na = ncclArgsOf(args);
            else if (f.hasArgs && !ncclArgsOf(f.args, f.argsPadded, na))
                na = ncclArgsOf(argsOf(f));  // simdjson refused the bytes: the slow reader
            collective(idx, name, na);
        }
        if (!gpu && hostOpCat && args.contains("stream") && number(args["stream"]) >= 0)
            t.hostOpsWithStream.push_back(idx);
        if (keepInputs && args.contains("Input Dims")) {
            OpInputs in = inputsOf(args);
            if (gloo) {
                Collective c;
                c.event = idx;
                c.name = std::string(name.substr(5));
                if (!in.dims.empty()) c.elements = shapeElements(in.dims[0]);
                if (!in.types.empty()) c.dtype = in.types[0];
                c.bytes = checkedProduct(c.elements, dtypeBytes(c.dtype));
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
                            std::vector<int64_t> inner;
                            for (const auto& y : x)
                                inner.push_back(y.is_number_integer() ? y.get<int64_t>() : -1);
                            const int64_t n = shapeElements(inner);
                            if (__builtin_add_overflow(total, n, &total)) total = 0;
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
        // "Input Strides": a list per input of integers for a tensor (anything else, a tensor
        // list's nested lists included, is left empty).
        if (args.contains("Input Strides") && args["Input Strides"].is_array())
            for (const auto& st : args["Input Strides"]) {
                std::vector<int64_t> strides;
                if (st.is_array())
                    for (const auto& x : st) {
                        if (!x.is_number_integer()) {
                            strides.clear();
                            break;
                        }
                        strides.push_back(x.get<int64_t>());
                    }
                in.strides.push_back(std::move(strides));
            }
        return in;
    }

    void finish() {
        for (size_t i = 0; i < countByCat.size(); ++i)
            if (countByCat[i] > 0)
                t.eventsByCategory[t.strings.at(static_cast<int32_t>(i))] += countByCat[i];
        if (uncategorised[0] > 0) t.eventsByCategory["(X)"] += uncategorised[0];
        for (const auto& [k, n] : uncategorisedOther)
            t.eventsByCategory[k] += n;
        if (minTs == INT64_MAX) minTs = 0;
        // Every pid's counter (by pid here; by rank once the lanes know their ranks, below).
        if (ourMemory.size() > 1)
            for (const auto& [pid, counters] : ourMemory) {
                std::vector<MemoryCounter> c = counters;
                for (auto& m : c)
                    m.ts -= minTs;
                t.memoryByRank.emplace_back(static_cast<int32_t>(pid), std::move(c));
            }
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
            fill(c, ncclArgsOf(pc->second));
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
        // Each rank's memory counter under the rank of its pid's lanes (pid order otherwise).
        if (!t.memoryByRank.empty()) {
            std::unordered_map<int64_t, int32_t> rankOfPid;
            for (const Lane& l : t.lanes)
                rankOfPid.emplace(l.pid, l.rank);
            int32_t next = 0;
            for (auto& [who, counters] : t.memoryByRank) {
                const auto it = rankOfPid.find(who);
                who = it != rankOfPid.end() ? it->second : next;
                ++next;
            }
            std::stable_sort(t.memoryByRank.begin(), t.memoryByRank.end(),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
        }
    }

    void topLevel(const std::string& key, const json& v) override {
        if (key == "baseTimeNanoseconds") baseTime = true;
        if (key == "metadata") t.metadata = v.dump(-1, ' ', false, json::error_handler_t::replace);
        if (key == "deviceProperties" && v.is_array())
            for (const auto& d : v)
                if (d.is_object() && d.contains("name") && d["name"].is_string())
                    t.deviceNames.push_back(d["name"].get<std::string>());
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

    static uint64_t flowId(std::string_view id, std::string_view cat) {
        std::string k;
        k.reserve(id.size() + 1 + cat.size());
        k.append(id).append("\x1f").append(cat);
        return std::hash<std::string>{}(k);
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
    simdjson::ondemand::parser parser;
    simdjson::ondemand::parser argsParser;  // an event's args, while its fields stay valid
    json argsJson;                          // argsOf's result, reused
    std::unordered_map<int64_t, json> paramComms;
    std::unordered_map<int32_t, int64_t> pendingExternal;  // collective event -> External id
    std::unordered_map<int64_t, EventClass> classCache;    // (name id, category id) -> class
    int64_t legacyAllocated = 0;
    std::unordered_map<int64_t, int32_t> numericLanes;  // (pid << 32 | tid) -> lane
    struct LaneSlot {
        int64_t key = 0;
        int32_t lane = -1;
    };
    std::array<LaneSlot, 64> laneCache{};

    int32_t lane(const Fields& f, bool gpu) {
        // Integer pid and tid (nearly every event): a numeric key, no string built.
        const bool numeric = f.pidInt && f.tidInt;
        int64_t nk = 0;
        LaneSlot* slot = nullptr;
        if (numeric) {
            nk = static_cast<int64_t>(static_cast<uint64_t>(f.pid) << 32 ^
                                      static_cast<uint32_t>(f.tid));
            // A trace has a few dozen lanes: a small direct-mapped cache before the index.
            slot = &laneCache[(static_cast<uint64_t>(nk) * 0x9E3779B97F4A7C15ULL) >> 58];
            if (slot->lane >= 0 && slot->key == nk) return slot->lane;
            const auto it = numericLanes.find(nk);
            if (it != numericLanes.end()) {
                *slot = {nk, it->second};
                return it->second;
            }
        }
        const int32_t id = laneByName(f, gpu);
        if (numeric) {
            numericLanes.emplace(nk, id);
            *slot = {nk, id};
        }
        return id;
    }

    int32_t laneByName(const Fields& f, bool gpu) {
        const std::string k = f.key();
        auto it = laneIndex.find(k);
        if (it != laneIndex.end()) return it->second;
        Lane l;
        l.rank = static_cast<int32_t>(t.rank);
        l.kind = gpu ? LaneKind::DeviceStream : LaneKind::HostThread;
        l.pid = f.pidNumber();
        l.tid = f.tidStr();
        t.lanes.push_back(l);
        const auto id = static_cast<int32_t>(t.lanes.size() - 1);
        laneIndex.emplace(k, id);
        return id;
    }

    static bool isNcclKernel(std::string_view name) { return name.substr(0, 4) == "nccl"; }

    // The args of an NCCL kernel (or its record_param_comms op) that size a collective.
    struct NcclArgs {
        std::string name, dtype;
        bool hasName = false, hasDtype = false, hasIn = false, hasOut = false, hasGroup = false,
             hasExternal = false;
        int64_t in = 0, out = 0, group = 0, external = 0;
    };
    static NcclArgs ncclArgsOf(const json& args) {
        NcclArgs a;
        if (args.contains("Collective name") && args["Collective name"].is_string()) {
            a.hasName = true;
            a.name = args["Collective name"].get<std::string>();
        }
        if (args.contains("dtype") && args["dtype"].is_string()) {
            a.hasDtype = true;
            a.dtype = args["dtype"].get<std::string>();
        }
        if ((a.hasIn = args.contains("In msg nelems"))) a.in = number(args["In msg nelems"]);
        if ((a.hasOut = args.contains("Out msg nelems"))) a.out = number(args["Out msg nelems"]);
        if ((a.hasGroup = args.contains("Group size"))) a.group = number(args["Group size"]);
        if ((a.hasExternal = args.contains("External id")))
            a.external = number(args["External id"]);
        return a;
    }
    // The same from the args' bytes with simdjson (NCCL kernels are many in a big job's trace).
    static int64_t numberOf(simdjson::ondemand::value v) {
        simdjson::ondemand::json_type jt;
        if (v.type().get(jt)) return 0;
        if (jt == simdjson::ondemand::json_type::string) {
            std::string_view sv;
            int64_t x = 0;
            if (v.get_string().get(sv)) return 0;
            const auto r = std::from_chars(sv.data(), sv.data() + sv.size(), x);
            return r.ec == std::errc() ? x : 0;
        }
        if (jt != simdjson::ondemand::json_type::number) return 0;
        simdjson::ondemand::number_type nt;
        if (v.get_number_type().get(nt)) return 0;
        if (nt == simdjson::ondemand::number_type::signed_integer) {
            int64_t x = 0;
            return v.get_int64().get(x) ? 0 : x;
        }
        double d = 0;
        if (v.get_double().get(d) || !std::isfinite(d) || std::abs(d) > 9e18) return 0;
        return static_cast<int64_t>(std::llround(d));
    }
    bool ncclArgsOf(std::string_view raw, size_t padded, NcclArgs& a) {
        simdjson::ondemand::document doc;
        simdjson::ondemand::object obj;
        if (argsParser.iterate(raw.data(), raw.size(), padded).get(doc) ||
            doc.get_object().get(obj))
            return false;
        for (auto field : obj) {
            std::string_view k;
            simdjson::ondemand::value v;
            if (field.unescaped_key().get(k) || field.value().get(v)) return false;
            if (k == "Collective name" || k == "dtype") {
                std::string_view sv;
                if (v.get_string().get(sv)) continue;
                if (k == "dtype") {
                    a.hasDtype = true;
                    a.dtype = std::string(sv);
                } else {
                    a.hasName = true;
                    a.name = std::string(sv);
                }
            } else if (k == "In msg nelems") {
                a.hasIn = true;
                a.in = numberOf(v);
            } else if (k == "Out msg nelems") {
                a.hasOut = true;
                a.out = numberOf(v);
            } else if (k == "Group size") {
                a.hasGroup = true;
                a.group = numberOf(v);
            } else if (k == "External id") {
                a.hasExternal = true;
                a.external = numberOf(v);
            }
        }
        return true;
    }

    static void fill(Collective& c, const NcclArgs& a) {
        if (a.hasName) c.name = a.name;
        const int64_t n = a.hasIn ? a.in : a.hasOut ? a.out : 0;
        if (a.hasDtype) c.dtype = a.dtype;
        const int64_t sz = a.hasDtype ? dtypeBytes(a.dtype) : 0;
        c.bytes = n * sz;
        c.fullBytes = std::max(a.hasIn ? a.in : 0, a.hasOut ? a.out : 0) * sz;
        if (a.hasGroup) c.groupSize = static_cast<int32_t>(a.group);
    }

    void collective(int32_t idx, std::string_view name, const NcclArgs& a) {
        Collective c;
        c.event = idx;
        // ncclKernel_AllReduce_RING_LL_Sum_float(...) / ncclDevKernel_AllGather_RING_LL(...)
        const size_t us = name.find('_');
        if (us != std::string_view::npos) {
            const size_t end = name.find('_', us + 1);
            c.name = std::string(name.substr(
                us + 1, end == std::string_view::npos ? std::string_view::npos : end - us - 1));
            if (const size_t paren = c.name.find('('); paren != std::string::npos)
                c.name.resize(paren);
        }
        fill(c, a);
        if (c.bytes == 0 && a.hasExternal) pendingExternal[idx] = a.external;
        t.collectives.push_back(std::move(c));
    }

    void memory(const Fields& f, const json& args) {
        // Device Type 1 is CUDA (0 is CPU); legacy files carry only Bytes.
        const int64_t device = args.contains("Device Type") ? number(args["Device Type"]) : 1;
        if (device == 0) {  // the CPU allocator
            MemoryCounter m;
            m.ts = f.tsNs;
            m.allocated = args.contains("Total Allocated") ? number(args["Total Allocated"]) : 0;
            m.reserved = args.contains("Total Reserved") ? number(args["Total Reserved"]) : 0;
            t.hostMemory.push_back(m);
            return;
        }
        if (device != 1) return;
        MemoryCounter m;
        m.ts = f.tsNs;
        m.bytes = args.contains("Bytes") ? number(args["Bytes"]) : 0;
        m.addr = args.contains("Addr") ? number(args["Addr"]) : 0;
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

}  // namespace

EventClass classifyDeviceEvent(const std::string& name, const std::string& cat) {
    // HTA's patterns (hta/utils/utils.py), matched without std::regex, whose `.*` recursed
    // once per character and overflowed the stack on kernel names of ~30,000 characters:
    //   communication ^nccl.*|^hip.*|^hccl.*|.*ncclKernel.*
    //   memory        ^(hip)?Memcpy.*|^(hip)?Memset.*|^dma.*
    //   non-compute   ^nccl.*|.*Memcpy.*|.*Memset.*|.*dma.*|^.*Sync.*|^Stream Wait Event.*|
    //                 .*cuda.*LaunchKernel.*|^hip.*
    const std::string_view n = name;
    auto starts = [&](std::string_view p) { return n.substr(0, p.size()) == p; };
    auto has = [&](std::string_view p) { return n.find(p) != std::string_view::npos; };
    if (starts("nccl") || starts("hip") || starts("hccl") || has("ncclKernel"))
        return EventClass::Communication;
    if (starts("Memcpy") || starts("hipMemcpy") || starts("Memset") || starts("hipMemset") ||
        starts("dma") || cat == "gpu_memcpy" || cat == "gpu_memset" || cat == "Memcpy" ||
        cat == "Memset")
        return EventClass::Memory;
    const size_t cuda = n.find("cuda");
    const bool nonCompute = has("Memcpy") || has("Memset") || has("dma") || has("Sync") ||
                            starts("Stream Wait Event") ||
                            (cuda != std::string_view::npos &&
                             n.find("LaunchKernel", cuda + 4) != std::string_view::npos);
    return nonCompute ? EventClass::Other : EventClass::Computation;
}

int64_t traceDtypeBytes(std::string_view recordShapesType) {
    return dtypeBytes(recordShapesType);
}

Expected<Trace> importKinetoFile(const std::string& path, const KinetoImportOptions& o) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        return Error{path +
                     ": a folder, where one trace file is expected (`trace summary`, "
                     "`trace overlap`, `plan recover`, `trace diff` and `calibrate` take "
                     "a folder of per-rank traces)"};
    Trace t;
    Importer imp(t, o);
    const trace_stream::StreamResult s = trace_stream::streamEvents(path, o, imp);
    if (!s.opened) return Error{path + ": cannot open file"};
    if (s.cancelled) return Error{path + ": cancelled"};
    if (!s.ioError.empty())
        return Error{path + ": " + s.ioError + " (a truncated or damaged file)"};
    if (!s.ok)
        return Error{path + ": not a valid Chrome/Kineto trace JSON: " +
                     (s.error.empty() ? "parse error" : s.error)};
    if (s.trailing)
        return Error{path + ": byte " + std::to_string(s.offset) +
                     ": more data after the trace's JSON (two traces in one file?)"};
    if (!s.sawEvents)
        return Error{path +
                     ": not a Chrome/Kineto trace: no traceEvents array (a PyTorch "
                     "profiler trace is an object with \"traceEvents\": [...])"};
    if (t.size() == 0 && t.skippedOutOfRange > 0 && t.eventsByCategory.empty())
        return Error{path + ": no usable event: " + std::to_string(t.skippedOutOfRange) +
                     " had \"ts\" or \"dur\" out of range (more than 9.2e12 microseconds, "
                     "whose nanoseconds do not fit int64)" +
                     (t.skippedBadFields > 0
                          ? ", " + std::to_string(t.skippedBadFields) + " fields of the wrong type"
                          : std::string())};
    if (t.size() == 0 && t.skippedNegativeTime > 0 && t.eventsByCategory.empty())
        return Error{path + ": no usable event: " + std::to_string(t.skippedNegativeTime) +
                     " had a negative \"ts\" or \"dur\""};
    if (t.size() == 0 && t.skippedBadFields > 0 && t.eventsByCategory.empty())
        return Error{path + ": no usable event: all " + std::to_string(t.skippedBadFields) +
                     " were not objects or had fields of the wrong type (\"ph\", \"cat\", "
                     "\"name\" strings; \"ts\", \"dur\" numbers)"};
    imp.finish();
    const bool legacy = t.eventsByCategory.count("Kernel") || t.eventsByCategory.count("Operator");
    t.dialect = legacy         ? "legacy 2021 categories"
                : imp.baseTime ? "modern (relative ts, baseTimeNanoseconds)"
                               : "absolute microseconds";
    return t;
}

}  // namespace shardscope
