// SPDX-License-Identifier: Apache-2.0
#include "profiler/import/json_span.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace shardscope {

namespace {

using json = nlohmann::ordered_json;

class Parser {
public:
    explicit Parser(std::string_view s)
        : m_begin(s.data()), m_p(s.data()), m_end(s.data() + s.size()) {}

    bool document(json& out) {
        ws();
        if (!value(out, 0)) return false;
        ws();
        return m_p == m_end || fail("end of input");
    }
    std::string error;

private:
    const char* m_begin;
    const char* m_p;
    const char* m_end;

    bool fail(const char* expected) {
        if (error.empty())
            error =
                std::string("expected ") + expected + " at byte " + std::to_string(m_p - m_begin);
        return false;
    }
    void ws() {
        while (m_p < m_end && (*m_p == ' ' || *m_p == '\n' || *m_p == '\r' || *m_p == '\t'))
            ++m_p;
    }
    bool literal(std::string_view word) {
        if (static_cast<size_t>(m_end - m_p) < word.size() ||
            std::string_view(m_p, word.size()) != word)
            return fail("a value");
        m_p += word.size();
        return true;
    }

    bool value(json& out, int depth) {
        if (depth > 512) return fail("less nesting");
        if (m_p >= m_end) return fail("a value");
        switch (*m_p) {
            case '{': {
                ++m_p;
                out = json::object();
                ws();
                if (m_p < m_end && *m_p == '}') {
                    ++m_p;
                    return true;
                }
                std::string key;
                while (true) {
                    ws();
                    if (m_p >= m_end || *m_p != '"') return fail("a key");
                    if (!string(key)) return false;
                    ws();
                    if (m_p >= m_end || *m_p != ':') return fail("':'");
                    ++m_p;
                    ws();
                    json v;
                    if (!value(v, depth + 1)) return false;
                    out[key] = std::move(v);  // a repeated key: the last wins, as nlohmann
                    ws();
                    if (m_p < m_end && *m_p == ',') {
                        ++m_p;
                        continue;
                    }
                    if (m_p < m_end && *m_p == '}') {
                        ++m_p;
                        return true;
                    }
                    return fail("',' or '}'");
                }
            }
            case '[': {
                ++m_p;
                out = json::array();
                ws();
                if (m_p < m_end && *m_p == ']') {
                    ++m_p;
                    return true;
                }
                while (true) {
                    ws();
                    json v;
                    if (!value(v, depth + 1)) return false;
                    out.push_back(std::move(v));
                    ws();
                    if (m_p < m_end && *m_p == ',') {
                        ++m_p;
                        continue;
                    }
                    if (m_p < m_end && *m_p == ']') {
                        ++m_p;
                        return true;
                    }
                    return fail("',' or ']'");
                }
            }
            case '"': {
                std::string s;
                if (!string(s)) return false;
                out = std::move(s);
                return true;
            }
            case 't':
                out = true;
                return literal("true");
            case 'f':
                out = false;
                return literal("false");
            case 'n':
                out = nullptr;
                return literal("null");
            default:
                return number(out);
        }
    }

    static void utf8(std::string& out, uint32_t cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    bool hex4(uint32_t& v) {
        if (m_end - m_p < 4) return fail("four hex digits");
        v = 0;
        for (int i = 0; i < 4; ++i) {
            const char c = *m_p++;
            v <<= 4;
            if (c >= '0' && c <= '9')
                v |= static_cast<uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f')
                v |= static_cast<uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                v |= static_cast<uint32_t>(c - 'A' + 10);
            else
                return fail("four hex digits");
        }
        return true;
    }

    // At the opening quote.
    bool string(std::string& out) {
        ++m_p;
        out.clear();
        while (true) {
            const char* run = m_p;
            while (m_p < m_end && *m_p != '"' && *m_p != '\\' &&
                   static_cast<unsigned char>(*m_p) >= 0x20)
                ++m_p;
            out.append(run, m_p);
            if (m_p >= m_end) return fail("'\"'");
            if (*m_p == '"') {
                ++m_p;
                return true;
            }
            if (static_cast<unsigned char>(*m_p) < 0x20)
                return fail("no control character in a string");
            ++m_p;  // backslash
            if (m_p >= m_end) return fail("an escape");
            const char c = *m_p++;
            switch (c) {
                case '"':
                    out += '"';
                    break;
                case '\\':
                    out += '\\';
                    break;
                case '/':
                    out += '/';
                    break;
                case 'b':
                    out += '\b';
                    break;
                case 'f':
                    out += '\f';
                    break;
                case 'n':
                    out += '\n';
                    break;
                case 'r':
                    out += '\r';
                    break;
                case 't':
                    out += '\t';
                    break;
                case 'u': {
                    uint32_t cp = 0;
                    if (!hex4(cp)) return false;
                    if (cp >= 0xD800 && cp <= 0xDBFF) {  // a surrogate pair
                        uint32_t lo = 0;
                        if (m_end - m_p < 6 || m_p[0] != '\\' || m_p[1] != 'u')
                            return fail("a low surrogate");
                        m_p += 2;
                        if (!hex4(lo)) return false;
                        if (lo < 0xDC00 || lo > 0xDFFF) return fail("a low surrogate");
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                        return fail("a high surrogate first");
                    }
                    utf8(out, cp);
                    break;
                }
                default:
                    return fail("a valid escape");
            }
        }
    }

    bool number(json& out) {
        const char* start = m_p;
        if (m_p < m_end && *m_p == '-') ++m_p;
        if (m_p >= m_end || *m_p < '0' || *m_p > '9') return fail("a value");
        if (*m_p == '0') {
            ++m_p;
        } else {
            while (m_p < m_end && *m_p >= '0' && *m_p <= '9')
                ++m_p;
        }
        bool integer = true;
        if (m_p < m_end && *m_p == '.') {
            integer = false;
            ++m_p;
            if (m_p >= m_end || *m_p < '0' || *m_p > '9') return fail("a digit after '.'");
            while (m_p < m_end && *m_p >= '0' && *m_p <= '9')
                ++m_p;
        }
        if (m_p < m_end && (*m_p == 'e' || *m_p == 'E')) {
            integer = false;
            ++m_p;
            if (m_p < m_end && (*m_p == '+' || *m_p == '-')) ++m_p;
            if (m_p >= m_end || *m_p < '0' || *m_p > '9') return fail("an exponent");
            while (m_p < m_end && *m_p >= '0' && *m_p <= '9')
                ++m_p;
        }
        if (integer) {
            // As nlohmann: signed when negative, unsigned otherwise; too large: a double.
            if (*start == '-') {
                int64_t v = 0;
                if (std::from_chars(start, m_p, v).ec == std::errc()) {
                    out = v;
                    return true;
                }
            } else {
                uint64_t v = 0;
                if (std::from_chars(start, m_p, v).ec == std::errc()) {
                    out = v;
                    return true;
                }
            }
        }
        double d = 0;
        const auto r = std::from_chars(start, m_p, d);
        if (r.ec == std::errc::result_out_of_range) {
            // As nlohmann: an underflow is a tiny or zero double, an overflow an error.
            d = std::strtod(std::string(start, m_p).c_str(), nullptr);
            if (!std::isfinite(d)) return fail("a number in the range of a double");
        } else if (r.ec != std::errc()) {
            return fail("a number");
        }
        out = d;
        return true;
    }
};

}  // namespace

bool parseJsonSpan(std::string_view text, nlohmann::ordered_json& out, std::string& error) {
    Parser p(text);
    if (p.document(out)) return true;
    error = p.error;
    return false;
}

}  // namespace shardscope
