// SPDX-License-Identifier: Apache-2.0
#include "profiler/import/event_stream.h"

#include <simdjson.h>
#include <zlib.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <vector>

#include "profiler/import/json_span.h"

namespace shardscope::trace_stream {

namespace {

using json = nlohmann::ordered_json;

// Bytes that leave the splitter's state unchanged: inside a string all but '"' and '\\',
// outside all but '"' and the brackets.
constexpr auto kPlainInString = [] {
    std::array<bool, 256> t{};
    for (int c = 0; c < 256; ++c)
        t[static_cast<size_t>(c)] = c != '"' && c != '\\';
    return t;
}();
constexpr auto kPlainOutside = [] {
    std::array<bool, 256> t{};
    for (int c = 0; c < 256; ++c)
        t[static_cast<size_t>(c)] = c != '"' && c != '{' && c != '}' && c != '[' && c != ']';
    return t;
}();

// The first '"' or '\\' in [p, e): 16 bytes at a time where SSE2 is there (every x86-64;
// kernel names run to hundreds of bytes), then byte by byte. Outside strings the runs are a
// few bytes, where the table loop is faster.
inline const char* skipInString(const char* p, const char* e) {
#if defined(__SSE2__)
    const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
    while (e - p >= 16) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        const int m =
            _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
        if (m != 0) return p + __builtin_ctz(static_cast<unsigned>(m));
        p += 16;
    }
#endif
    while (p < e && kPlainInString[static_cast<uint8_t>(*p)])
        ++p;
    return p;
}

#if defined(__SSE2__)
// A 64-byte block's bytes of interest as bit masks (bit i: byte i), for the splitter's
// block scan: quotes, backslashes, opening and closing brackets.
struct BlockMasks {
    uint64_t quote, backslash, open, close;
};
inline BlockMasks classifyBlock(const char* p) {
    BlockMasks m{};
    for (int q = 0; q < 4; ++q) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * q));
        auto bits = [&](__m128i eq) {
            return static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(eq))) << (16 * q);
        };
        m.quote |= bits(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')));
        m.backslash |= bits(_mm_cmpeq_epi8(v, _mm_set1_epi8('\\')));
        // '{' = 0x7b, '[' = 0x5b; '}' = 0x7d, ']' = 0x5d: they differ only in bit 5.
        const __m128i folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
        m.open |= bits(_mm_cmpeq_epi8(folded, _mm_set1_epi8('{')));
        m.close |= bits(_mm_cmpeq_epi8(folded, _mm_set1_epi8('}')));
    }
    return m;
}
// Bit i of the result: the XOR of bits 0..i of x (a quote mask becomes "inside a string").
inline uint64_t prefixXor(uint64_t x) {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    return x;
}
#endif

// Where a scan of an object or array stands, carried from one chunk to the next.
struct ScanState {
    int depth = 0;
    bool inString = false, escape = false;
    bool backslash = false;  // a backslash was seen (its strings may need unescaping)
};
#if defined(__SSE2__)
// Scans [p, e) of an object or array begun at or before p: 64 bytes at a time, as bit
// masks. Quotes not escaped delimit strings (their prefix XOR), and the brackets outside
// strings are counted. True when its closing bracket is found (p just after it); false with
// p == e when the bytes end first. Reads up to 63 bytes past e (the chunk's padding); those
// are masked off.
inline bool scanBlocks(const char*& p, const char* e, ScanState& s) {
    while (p < e) {
        const auto n = static_cast<int>(std::min<ptrdiff_t>(64, e - p));
        const uint64_t valid = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
        const BlockMasks m = classifyBlock(p);
        uint64_t escaped = s.escape ? 1 : 0;
        s.escape = false;
        if ((m.backslash & valid) != 0) s.backslash = true;
        for (uint64_t b = m.backslash & valid; b != 0; b &= b - 1) {
            const int i = __builtin_ctzll(b);
            if ((escaped >> i) & 1) continue;  // itself escaped
            if (i == n - 1)
                s.escape = true;  // escapes the next block's first byte
            else
                escaped |= uint64_t{1} << (i + 1);
        }
        const uint64_t strings =
            prefixXor(m.quote & ~escaped & valid) ^ (s.inString ? ~uint64_t{0} : 0);
        for (uint64_t b = (m.open | m.close) & ~strings & valid; b != 0; b &= b - 1) {
            const int i = __builtin_ctzll(b);
            if ((m.open >> i) & 1) {
                ++s.depth;
            } else if (--s.depth == 0) {
                p += i + 1;
                return true;
            }
        }
        s.inString = (strings >> (n - 1)) & 1;
        p += n;
    }
    return false;
}
#endif

// The file (gzip or plain) in 256 KiB chunks; the splitter below walks the buffer.
class GzReader {
public:
    GzReader(const std::string& path, const KinetoImportOptions& o)
        : m_file(gzopen(path.c_str(), "rb")), m_o(o), m_path(path) {
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
        while (more() && isJsonSpace(*m_pos))
            ++m_pos;
    }
    [[nodiscard]] int64_t offset() const { return m_consumed + (m_pos - m_buf.data()); }

    // Appends one JSON value's bytes (at the current position) to `out`: balanced braces
    // and brackets outside strings, a string, or a scalar up to its delimiter. False when
    // the file ends first.
    // Like capture, for an event: `view` is its bytes in place when they lie in one chunk
    // (readable padding follows them), else a copy in `spill` (with padding capacity).
    bool captureEvent(std::string& spill, std::string_view& view, size_t& padded) {
        if (!more()) return false;
        const char* begin = m_pos;
        const int64_t refills = m_refills;
        spill.clear();
        m_inPlace = true;
        m_captureRefills = refills;
        m_escapes = false;
        const bool ok = capture(spill);
        m_inPlace = false;
        if (!ok) return false;
        if (m_refills == refills && spill.empty()) {
            view = std::string_view(begin, static_cast<size_t>(m_pos - begin));
            padded = static_cast<size_t>(m_buf.data() + m_buf.size() - begin);
            return true;
        }
        if (spill.capacity() < spill.size() + simdjson::SIMDJSON_PADDING)
            spill.reserve(spill.size() + simdjson::SIMDJSON_PADDING);
        view = spill;
        padded = spill.capacity();
        return true;
    }

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
#if defined(__SSE2__)
        ScanState scan;
#endif
        while (true) {
            const char* p = m_pos;
            const char* const e = m_end;
            bool done = false;
#if defined(__SSE2__)
            // An object or array: the 64-byte block scan, its state carried across chunks.
            if (first != '"') {
                done = scanBlocks(p, e, scan);
                if (scan.backslash) m_escapes = true;
                m_pos = p;
                if (done) break;
                out.append(run, m_pos);
                if (!refill()) return false;
                run = m_pos;
                continue;
            }
#endif
            // A lone string (a key), or no SSE2: runs of bytes that cannot change the
            // state are skipped by table lookup, and the chunk's end is checked once per
            // run.
            while (p < e) {
                if (inString) {
                    if (escape) {
                        escape = false;
                        ++p;
                        continue;
                    }
                    p = skipInString(p, e);
                    if (p == e) break;
                    if (*p++ == '\\') {
                        escape = true;
                        m_escapes = true;
                        continue;
                    }
                    inString = false;
                    if (depth == 0) {  // a lone string
                        done = true;
                        break;
                    }
                    continue;
                }
                while (p < e && kPlainOutside[static_cast<uint8_t>(*p)])
                    ++p;
                if (p == e) break;
                const char c = *p++;
                if (c == '"') {
                    inString = true;
                } else if (c == '{' || c == '[') {
                    ++depth;
                } else if (--depth == 0) {  // '}' or ']'
                    done = true;
                    break;
                }
            }
            m_pos = p;
            if (done) break;
            out.append(run, m_pos);
            if (!refill()) return false;
            run = m_pos;
        }
        if (!m_inPlace || m_refills != m_captureRefills) out.append(run, m_pos);
        return true;
    }

    // Whether the value captureEvent last captured had a backslash inside a string; when it
    // had none, its strings need no unescaping.
    [[nodiscard]] bool lastEscapes() const {
        return m_escapes;
    }
    // The chunk at hand, for the splitter's batches: the bytes left in it, the first byte
    // of the chunk's buffer, the end of its readable padding, and a position's offset in
    // the file. setPos moves within the chunk.
    [[nodiscard]] char* pos() {
        return m_buf.data() + (m_pos - m_buf.data());
    }
    [[nodiscard]] const char* end() const {
        return m_end;
    }
    [[nodiscard]] const char* bufferBegin() const {
        return m_buf.data();
    }
    [[nodiscard]] const char* paddedEnd() const {
        return m_buf.data() + m_buf.size();
    }
    [[nodiscard]] int64_t offsetOf(const char* p) const {
        return m_consumed + (p - m_buf.data());
    }
    void setPos(const char* p) {
        m_pos = p;
    }
    [[nodiscard]] bool cancelled() const {
        return m_cancelled;
    }
    // Reads to the end after the JSON value: only whitespace may follow, and a gzip must
    // end cleanly (its trailer checked). False when something else follows.
    bool drain() {
        while (more()) {
            if (!isJsonSpace(peek())) return false;
            next();
        }
        return true;
    }
    // Why reading stopped early ("gzip: unexpected end of file"); empty at a clean end.
    [[nodiscard]] const std::string& ioError() const {
        return m_ioError;
    }

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
        ++m_refills;
        m_consumed += m_end - m_buf.data();
        const int n = gzread(m_file, m_buf.data(), static_cast<unsigned>(kChunk));
        m_pos = m_buf.data();
        m_end = m_pos + std::max(0, n);
        if (n <= 0 && m_ioError.empty()) {
            // A truncated or corrupt gzip (no trailer, a bad CRC) is not a clean end.
            int err = Z_OK;
            const char* msg = gzerror(m_file, &err);
            if (err != Z_OK && err != Z_STREAM_END) {
                std::string why = msg ? msg : "unknown error";
                if (why.rfind(m_path + ": ", 0) == 0) why.erase(0, m_path.size() + 2);
                m_ioError = (gzdirect(m_file) ? "read error: " : "gzip: ") + why;
            }
        }
        return n > 0;
    }
    gzFile m_file;
    const KinetoImportOptions& m_o;
    std::string m_path;
    int64_t m_fileBytes = 0;
    bool m_cancelled = false;
    // A chunk and simdjson's padding after it: an event inside the chunk is parsed in place.
    static constexpr size_t kChunk = 256 << 10;
    static_assert(simdjson::SIMDJSON_PADDING >= 64,
                  "the block scan reads 64 bytes past a chunk's last byte");
    std::vector<char> m_buf = std::vector<char>(kChunk + simdjson::SIMDJSON_PADDING);
    const char* m_pos = m_buf.data();
    const char* m_end = m_buf.data();
    int64_t m_consumed = 0;
    int64_t m_refills = 0;
    std::string m_ioError;
    bool m_escapes = true;         // the last capture saw a backslash (or was not tracked)
    bool m_inPlace = false;        // capture leaves a one-chunk value in place
    int64_t m_captureRefills = 0;  // m_refills when that capture began
};

// Cuts the file into events without building it whole: the elements of "traceEvents" (or
// of a top-level array) are captured one at a time, parsed by parseJsonSpan and handed to
// the consumer; other top-level values go to EventConsumer::topLevel.
class Splitter {
public:
    Splitter(GzReader& r, EventConsumer& imp) : r(r), imp(imp) {}
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
        if (r.more() && r.peek() == '}') {  // {}: an object without traceEvents
            r.next();
            return true;
        }
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
    EventConsumer& imp;
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
#if defined(__SSE2__)
    // The whole events that lie in the chunk at hand, each followed by ',' or the array's
    // ']', parsed as one batch (Importer::consumeBatch); the reader is left after them (and
    // `ended` set when the array's ']' was among them). An event that runs past the chunk,
    // or is not an object, is left to the event-at-a-time path. False on an error.
    struct Span {
        char* begin;
        char* end;
    };
    std::vector<Span> spans;
    bool batch(bool& ended) {
        char* p = r.pos();
        const char* const e = r.end();
        // The byte before the first event becomes the batch's '[': it must be in the buffer.
        if (p == e || p == r.bufferBegin() || *p != '{') return true;
        spans.clear();
        bool escapes = false, sawEnd = false;
        const char* next = p;
        while (p < e && *p == '{') {
            const char* q = p;
            ScanState s;
            if (!scanBlocks(q, e, s)) break;  // runs past the chunk
            const char* sep = q;
            while (sep < e && isJsonSpace(*sep))
                ++sep;
            if (sep == e || (*sep != ',' && *sep != ']')) break;
            spans.push_back({p, const_cast<char*>(q)});
            escapes = escapes || s.backslash;
            if (*sep == ']') {
                sawEnd = true;
                next = sep + 1;
                break;
            }
            const char* n = sep + 1;
            while (n < e && isJsonSpace(*n))
                ++n;
            next = n;
            p = const_cast<char*>(n);
        }
        if (spans.size() < 2) return true;  // one event: the event-at-a-time path
        const size_t done = imp.consumeBatch(spans.front().begin, spans.back().end, spans.size(),
                                             r.paddedEnd(), escapes);
        // An event the batch could not take: each from there on alone, for its own error.
        for (size_t i = done; i < spans.size(); ++i) {
            const Span& sp = spans[i];
            std::string why;
            const std::string_view event(sp.begin, static_cast<size_t>(sp.end - sp.begin));
            if (!imp.consumeRaw(event, static_cast<size_t>(r.paddedEnd() - sp.begin), escapes,
                                why)) {
                error = "byte " + std::to_string(r.offsetOf(sp.begin)) + ": " + why;
                return false;
            }
        }
        r.setPos(next);
        ended = sawEnd;
        return true;
    }
#endif
    // After the array's '['.
    bool events() {
        r.skipWs();
        if (r.more() && r.peek() == ']') {
            r.next();
            return true;
        }
        while (true) {
            r.skipWs();
#if defined(__SSE2__)
            bool ended = false;
            if (!batch(ended)) return false;
            if (ended) return true;
            r.skipWs();
#endif
            std::string_view event;
            size_t padded = 0;
            if (!r.captureEvent(raw, event, padded)) return fail("an event");
            const auto size = static_cast<int64_t>(event.size());
            std::string why;
            if (!imp.consumeRaw(event, padded, r.lastEscapes(), why)) {
                error = "byte " + std::to_string(r.offset() - size) + ": " + why;
                return false;
            }
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

StreamResult streamEvents(const std::string& path, const KinetoImportOptions& o,
                          EventConsumer& consumer) {
    StreamResult res;
    GzReader reader(path, o);
    if (!reader.ok()) return res;
    res.opened = true;
    Splitter split(reader, consumer);
    res.ok = split.run();
    res.trailing = res.ok && !reader.drain();
    res.cancelled = reader.cancelled();
    res.ioError = reader.ioError();
    res.error = split.error;
    res.sawEvents = split.sawEvents;
    res.offset = reader.offset();
    return res;
}

}  // namespace shardscope::trace_stream
