// SPDX-License-Identifier: Apache-2.0
#include "plans/core/json_reader.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "plans/core/strings.h"

namespace shardscope {

namespace {

// Line and column of a byte offset, for syntax errors.
std::pair<size_t, size_t> lineCol(std::string_view text, size_t offset) {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < offset && i < text.size(); ++i) {
        if (text[i] == '\n') {
            ++line;
            col = 1;
        } else {
            ++col;
        }
    }
    return {line, col};
}

// Depth of [ and { nesting outside strings. nlohmann's parser is iterative, but our own
// walkers recurse over model trees, so depth is bounded up front.
size_t maxNesting(std::string_view text, size_t limit) {
    size_t depth = 0, maxDepth = 0;
    bool inString = false, escaped = false;
    for (char c : text) {
        if (inString) {
            if (escaped)
                escaped = false;
            else if (c == '\\')
                escaped = true;
            else if (c == '"')
                inString = false;
            continue;
        }
        if (c == '"') {
            inString = true;
        } else if (c == '[' || c == '{') {
            maxDepth = std::max(maxDepth, ++depth);
            if (maxDepth > limit) return maxDepth;
        } else if ((c == ']' || c == '}') && depth > 0) {
            --depth;
        }
    }
    return maxDepth;
}

}  // namespace

Expected<nlohmann::json> parseJsonText(std::string_view text, const std::string& label,
                                       int maxDepth) {
    if (maxNesting(text, static_cast<size_t>(maxDepth)) > static_cast<size_t>(maxDepth))
        return Error{label + ": JSON nested deeper than " + std::to_string(maxDepth) +
                     " levels; refusing to read it"};
    try {
        return nlohmann::json::parse(text.begin(), text.end());
    } catch (const nlohmann::json::out_of_range& e) {
        // A number beyond double's range (e.g. 1e999): nlohmann reports no position, so
        // name the first such literal ourselves.
        std::string what = e.what();
        const size_t quote = what.find('\'');
        const std::string literal = quote == std::string::npos
                                        ? std::string()
                                        : what.substr(quote + 1, what.rfind('\'') - quote - 1);
        const size_t at = literal.empty() ? std::string_view::npos : text.find(literal);
        const auto [line, col] = lineCol(text, at == std::string_view::npos ? 0 : at);
        return Error{label + ":" + std::to_string(line) + ":" + std::to_string(col) +
                     ": number out of range" + (literal.empty() ? "" : " (" + literal + ")") +
                     ": expected a finite number within +-1.8e308"};
    } catch (const nlohmann::json::parse_error& e) {
        const auto [line, col] = lineCol(text, e.byte > 0 ? e.byte - 1 : 0);
        std::string what = e.what();
        // nlohmann prefixes "[json.exception.parse_error.101] parse error at line L, column C: ".
        const size_t colon = what.find(": ", what.find("parse error"));
        if (colon != std::string::npos) what = what.substr(colon + 2);
        return Error{label + ":" + std::to_string(line) + ":" + std::to_string(col) +
                     ": invalid JSON: " + what};
    }
}

Expected<nlohmann::json> readJsonFile(const std::string& path, int maxDepth) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        return Error{path + ": is a folder; expected a JSON file"};
    std::ifstream in(path, std::ios::binary);
    if (!in) return Error{path + ": cannot open file"};
    // Read in chunks, so a device (/dev/zero), a pipe or a checkpoint given by mistake is
    // refused from its first bytes or at the size limit, never read whole.
    std::string text;
    char chunk[1 << 16];
    bool sniffed = false;
    while (in) {
        in.read(chunk, sizeof chunk);
        const std::streamsize got = in.gcount();
        if (got <= 0) break;
        text.append(chunk, static_cast<size_t>(got));
        if (!sniffed) {
            size_t i = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;  // UTF-8 BOM
            while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i])))
                ++i;
            if (i < text.size()) {
                sniffed = true;
                const unsigned char c = static_cast<unsigned char>(text[i]);
                if (c != '{' && c != '[') {
                    char hex[8];
                    std::snprintf(hex, sizeof hex, "0x%02x", c);
                    return Error{path + ": not a JSON file: it starts with " +
                                 (std::isprint(c) ? "'" + std::string(1, static_cast<char>(c)) + "'"
                                                  : std::string("byte ") + hex) +
                                 " where a JSON document starts with '{' (a checkpoint or "
                                 "binary file given by mistake?)"};
                }
            } else if (text.size() > kMaxJsonFileBytes) {
                break;
            }
        }
        if (text.size() > kMaxJsonFileBytes)
            return Error{path + ": larger than " + std::to_string(kMaxJsonFileBytes >> 20) +
                         " MiB; a model, plan or cluster JSON is at most a few MB, so this is "
                         "not one"};
    }
    if (in.bad()) return Error{path + ": read error"};
    return parseJsonText(text, path, maxDepth);
}

std::string jsonTypeName(const nlohmann::json& j) {
    switch (j.type()) {
        case nlohmann::json::value_t::null:
            return "null";
        case nlohmann::json::value_t::object:
            return "an object";
        case nlohmann::json::value_t::array:
            return "an array";
        case nlohmann::json::value_t::string:
            return "a string";
        case nlohmann::json::value_t::boolean:
            return "a bool";
        case nlohmann::json::value_t::number_integer:
        case nlohmann::json::value_t::number_unsigned:
            return "an integer";
        case nlohmann::json::value_t::number_float:
            return "a number";
        default:
            return "a value";
    }
}

std::string describeJson(const nlohmann::json& j) {
    if (j.is_object()) return "an object";
    if (j.is_array()) return "an array";
    std::string s = j.dump();
    if (s.size() > 60) s = s.substr(0, 57) + "...";
    return s;
}

std::string escapePointerToken(std::string_view token) {
    std::string out;
    for (char c : token) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else
            out.push_back(c);
    }
    return out;
}

std::string JsonReader::where() const {
    return m_file + ":" + (m_ptr.empty() ? "/" : m_ptr);
}

void JsonReader::fail(const std::string& message) const {
    throw JsonError(where() + ": " + message);
}

void JsonReader::failExpected(const std::string& expected) const {
    fail("expected " + expected + ", got " + describeJson(*m_j));
}

void JsonReader::requireObject() const {
    if (!m_j->is_object()) failExpected("an object");
}

bool JsonReader::has(std::string_view key) const {
    return m_j->is_object() && m_j->find(key) != m_j->end();
}

bool JsonReader::hasNonNull(std::string_view key) const {
    if (!m_j->is_object()) return false;
    auto it = m_j->find(key);
    return it != m_j->end() && !it->is_null();
}

JsonReader JsonReader::at(std::string_view key) const {
    requireObject();
    auto it = m_j->find(key);
    if (it == m_j->end()) fail("missing required field \"" + std::string(key) + "\"");
    return JsonReader(*it, m_file, m_ptr + "/" + escapePointerToken(key));
}

std::optional<JsonReader> JsonReader::find(std::string_view key) const {
    requireObject();
    auto it = m_j->find(key);
    if (it == m_j->end()) return std::nullopt;
    return JsonReader(*it, m_file, m_ptr + "/" + escapePointerToken(key));
}

void JsonReader::allowOnly(std::initializer_list<std::string_view> allowed) const {
    requireObject();
    std::vector<std::string> names(allowed.begin(), allowed.end());
    for (auto it = m_j->begin(); it != m_j->end(); ++it) {
        bool known = false;
        for (auto a : allowed)
            known = known || a == it.key();
        if (!known) {
            JsonReader child(it.value(), m_file, m_ptr + "/" + escapePointerToken(it.key()));
            child.fail("unknown field \"" + it.key() + "\"" + didYouMean(it.key(), names));
        }
    }
}

std::vector<std::string> JsonReader::keys() const {
    requireObject();
    std::vector<std::string> out;
    for (auto it = m_j->begin(); it != m_j->end(); ++it)
        out.push_back(it.key());
    return out;
}

void JsonReader::requireArray() const {
    if (!m_j->is_array()) failExpected("an array");
}

size_t JsonReader::size() const {
    requireArray();
    return m_j->size();
}

JsonReader JsonReader::operator[](size_t i) const {
    requireArray();
    return JsonReader((*m_j)[i], m_file, m_ptr + "/" + std::to_string(i));
}

std::string JsonReader::asString() const {
    if (!m_j->is_string()) failExpected("a string");
    return m_j->get<std::string>();
}

bool JsonReader::asBool() const {
    if (!m_j->is_boolean()) failExpected("a bool");
    return m_j->get<bool>();
}

int64_t JsonReader::asInt() const {
    if (m_j->is_number_integer()) return m_j->get<int64_t>();
    if (m_j->is_number_unsigned()) {
        const uint64_t u = m_j->get<uint64_t>();
        if (u > static_cast<uint64_t>(INT64_MAX)) fail("integer " + m_j->dump() + " is too large");
        return static_cast<int64_t>(u);
    }
    if (m_j->is_number_float()) {
        const double d = m_j->get<double>();
        // 1e8 is how people write min_num_params; accept integral floats in int64 range.
        if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18)
            return static_cast<int64_t>(d);
    }
    failExpected("an integer");
}

int64_t JsonReader::asIntAtLeast(int64_t minimum) const {
    const int64_t v = asInt();
    if (v < minimum)
        fail("expected an integer >= " + std::to_string(minimum) + ", got " + m_j->dump());
    return v;
}

double JsonReader::asNumber() const {
    if (!m_j->is_number()) failExpected("a number");
    const double d = m_j->get<double>();
    if (!std::isfinite(d)) failExpected("a finite number");
    return d;
}

double JsonReader::asPositiveNumber() const {
    const double d = asNumber();
    if (!(d > 0)) fail("expected a positive number, got " + m_j->dump());
    return d;
}

std::vector<std::string> JsonReader::asStringList() const {
    requireArray();
    std::vector<std::string> out;
    for (size_t i = 0; i < m_j->size(); ++i)
        out.push_back((*this)[i].asString());
    return out;
}

std::optional<std::string> JsonReader::optString(std::string_view key) const {
    if (!hasNonNull(key)) return std::nullopt;
    return at(key).asString();
}
std::optional<int64_t> JsonReader::optInt(std::string_view key) const {
    if (!hasNonNull(key)) return std::nullopt;
    return at(key).asInt();
}
std::optional<double> JsonReader::optNumber(std::string_view key) const {
    if (!hasNonNull(key)) return std::nullopt;
    return at(key).asNumber();
}
std::optional<bool> JsonReader::optBool(std::string_view key) const {
    if (!hasNonNull(key)) return std::nullopt;
    return at(key).asBool();
}

int JsonReader::checkFormat(std::string_view format, int maxVersion) const {
    requireObject();
    const std::string f = at("format").asString();
    if (f != format)
        at("format").fail("expected \"" + std::string(format) + "\", got \"" + f + "\"");
    const int64_t v = at("version").asInt();
    if (v < 1 || v > maxVersion)
        at("version").fail("unsupported version " + std::to_string(v) + " (this build reads 1.." +
                           std::to_string(maxVersion) + ")");
    return static_cast<int>(v);
}

}  // namespace shardscope
