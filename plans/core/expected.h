// SPDX-License-Identifier: Apache-2.0
#pragma once
// Errors cross layer boundaries as values: a loader returns Expected<T> whose error
// message names the file and the JSON pointer of the bad field, e.g.
//   plan.json:/units/3/reshard_after_forward: expected bool or int, got "yes"
#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace shardscope {

struct Error {
    std::string message;
};

template <typename T>
class [[nodiscard]] Expected {
public:
    Expected(T value) : m_v(std::move(value)) {}
    Expected(Error error) : m_v(std::move(error)) {}

    [[nodiscard]] bool ok() const { return std::holds_alternative<T>(m_v); }
    explicit operator bool() const { return ok(); }

    T& value() & {
        assert(ok());
        return std::get<T>(m_v);
    }
    const T& value() const& {
        assert(ok());
        return std::get<T>(m_v);
    }
    T&& value() && {
        assert(ok());
        return std::get<T>(std::move(m_v));
    }
    T* operator->() { return &value(); }
    const T* operator->() const { return &value(); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }

    [[nodiscard]] const std::string& error() const {
        assert(!ok());
        return std::get<Error>(m_v).message;
    }

private:
    std::variant<T, Error> m_v;
};

// Status for operations without a value.
class [[nodiscard]] Status {
public:
    Status() = default;
    Status(Error e) : m_error(std::move(e.message)), m_failed(true) {}
    [[nodiscard]] bool ok() const { return !m_failed; }
    explicit operator bool() const { return ok(); }
    [[nodiscard]] const std::string& error() const { return m_error; }

private:
    std::string m_error;
    bool m_failed = false;
};

}  // namespace shardscope
