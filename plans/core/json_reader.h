// SPDX-License-Identifier: Apache-2.0
#pragma once
// Typed, pointer-tracking access to a parsed JSON document. Every failure names the file
// and the JSON pointer of the offending field, and says what was expected and what was
// found:  plan.json:/units/3/reshard_after_forward: expected bool or int, got "yes".
//
// Loaders walk a document with JsonReader and throw JsonError internally; the public
// loader functions catch it and return Expected<T>, so no exception crosses a layer.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "plans/core/expected.h"

namespace shardscope {

class JsonError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// Reads and parses a JSON file. Rejects nesting deeper than `maxDepth` before parsing
// (a hostile file must not exhaust the stack) and reports syntax errors as file:line:col.
// Folders, files that do not start like JSON (checked on the first bytes read, so a device
// or a checkpoint is refused at once) and files above kMaxJsonFileBytes are refused.
inline constexpr size_t kMaxJsonFileBytes = size_t{256} << 20;
[[nodiscard]] Expected<nlohmann::json> readJsonFile(const std::string& path, int maxDepth = 256);
[[nodiscard]] Expected<nlohmann::json> parseJsonText(std::string_view text,
                                                     const std::string& label, int maxDepth = 256);

// Short rendering of a value for messages: "yes" → "\"yes\"", objects → "an object".
[[nodiscard]] std::string describeJson(const nlohmann::json& j);
[[nodiscard]] std::string jsonTypeName(const nlohmann::json& j);

class JsonReader {
public:
    JsonReader(const nlohmann::json& j, std::string file, std::string pointer = "")
        : m_j(&j), m_file(std::move(file)), m_ptr(std::move(pointer)) {}

    [[nodiscard]] const nlohmann::json& json() const { return *m_j; }
    [[nodiscard]] const std::string& file() const { return m_file; }
    [[nodiscard]] const std::string& pointer() const { return m_ptr; }
    [[nodiscard]] std::string where() const;  // "file:/pointer"

    [[noreturn]] void fail(const std::string& message) const;
    [[noreturn]] void failExpected(const std::string& expected) const;  // "expected X, got Y"

    // Object access.
    void requireObject() const;
    [[nodiscard]] bool has(std::string_view key) const;
    [[nodiscard]] bool hasNonNull(std::string_view key) const;
    [[nodiscard]] JsonReader at(std::string_view key) const;  // required member
    [[nodiscard]] std::optional<JsonReader> find(std::string_view key) const;
    // Fails on any member not in `allowed`, suggesting the nearest allowed name.
    void allowOnly(std::initializer_list<std::string_view> allowed) const;
    [[nodiscard]] std::vector<std::string> keys() const;

    // Array access.
    void requireArray() const;
    [[nodiscard]] size_t size() const;
    [[nodiscard]] JsonReader operator[](size_t i) const;

    // Scalars of this node.
    [[nodiscard]] std::string asString() const;
    [[nodiscard]] bool asBool() const;
    [[nodiscard]] int64_t asInt() const;  // integral numbers only (2.0 accepted, 2.5 not)
    [[nodiscard]] int64_t asIntAtLeast(int64_t minimum) const;
    [[nodiscard]] double asNumber() const;  // finite
    [[nodiscard]] double asPositiveNumber() const;
    [[nodiscard]] std::vector<std::string> asStringList() const;
    [[nodiscard]] bool isNull() const { return m_j->is_null(); }
    [[nodiscard]] bool isString() const { return m_j->is_string(); }

    // Member shorthands.
    [[nodiscard]] std::string getString(std::string_view key) const { return at(key).asString(); }
    [[nodiscard]] int64_t getInt(std::string_view key) const { return at(key).asInt(); }
    [[nodiscard]] double getNumber(std::string_view key) const { return at(key).asNumber(); }
    [[nodiscard]] bool getBool(std::string_view key) const { return at(key).asBool(); }
    [[nodiscard]] std::optional<std::string> optString(std::string_view key) const;
    [[nodiscard]] std::optional<int64_t> optInt(std::string_view key) const;
    [[nodiscard]] std::optional<double> optNumber(std::string_view key) const;
    [[nodiscard]] std::optional<bool> optBool(std::string_view key) const;

    // Checks "format" and "version" members: the format must equal `format` and the
    // version must be between 1 and `maxVersion`.
    int checkFormat(std::string_view format, int maxVersion) const;

private:
    const nlohmann::json* m_j;
    std::string m_file;
    std::string m_ptr;
};

[[nodiscard]] std::string escapePointerToken(std::string_view token);

// Runs `f` (which may throw JsonError) and converts the outcome into Expected<T>.
template <typename T, typename F>
[[nodiscard]] Expected<T> catchJsonErrors(F&& f) {
    try {
        return Expected<T>(f());
    } catch (const JsonError& e) {
        return Error{e.what()};
    }
}

}  // namespace shardscope
