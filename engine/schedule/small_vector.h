// SPDX-License-Identifier: Apache-2.0
#pragma once
// A vector with N elements stored inline: step-program ops carry a few dependencies and
// buffers each, and building an 80-block program must not cost thousands of mallocs
// (shardscope bench simulate). Spills to the heap beyond N, all elements then on the heap;
// the inline bytes then hold the heap pointer, so an op's three lists take 64 bytes, not 88
// (the simulator walks hundreds of ops per step: their size is cache traffic).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace shardscope {

template <typename T, size_t N>
class SmallVector {
    static_assert(std::is_trivially_copyable_v<T>, "SmallVector holds ids and plain values");
    static_assert(N >= 1);
    // Inline slots: N, or as many as hold the heap pointer.
    static constexpr size_t kSlots = std::max(N, (sizeof(T*) + sizeof(T) - 1) / sizeof(T));

public:
    SmallVector() = default;
    SmallVector(std::initializer_list<T> init) {
        for (const T& v : init)
            push_back(v);
    }
    SmallVector(const std::vector<T>& v) {  // NOLINT: implicit by design
        for (const T& x : v)
            push_back(x);
    }
    SmallVector(const SmallVector& o) { *this = o; }
    SmallVector(SmallVector&& o) noexcept { take(o); }
    SmallVector& operator=(const SmallVector& o) {
        if (this == &o) return *this;
        clear();
        if (o.m_size <= N) {  // the common case: a fixed-size copy
            std::memcpy(static_cast<void*>(m_inline), o.m_inline,
                        sizeof m_inline);  // inlined: a fixed size
            m_size = o.m_size;
        } else {
            for (const T& x : o)
                push_back(x);
        }
        return *this;
    }
    SmallVector& operator=(SmallVector&& o) noexcept {
        if (this == &o) return *this;
        release();
        take(o);
        return *this;
    }
    ~SmallVector() { release(); }

    void push_back(const T& v) {
        if (m_size < N) {
            m_inline[m_size++] = v;
            return;
        }
        if (m_capacity == 0 || m_size == m_capacity) grow();
        heap()[m_size++] = v;
    }
    [[nodiscard]] size_t size() const { return m_size; }
    [[nodiscard]] bool empty() const { return m_size == 0; }
    const T* begin() const { return m_size <= N ? m_inline : heap(); }
    const T* end() const { return begin() + m_size; }
    const T& operator[](size_t i) const { return begin()[i]; }
    const T& back() const { return begin()[m_size - 1]; }
    void clear() {
        release();
        m_size = 0;
    }

private:
    T* heap() const {
        T* h;
        std::memcpy(&h, m_inline, sizeof h);
        return h;
    }
    // Beyond N the elements move to the heap, all of them (begin() stays one pointer).
    void grow() {
        const uint32_t cap = m_capacity == 0 ? static_cast<uint32_t>(2 * N) : 2 * m_capacity;
        T* h = new T[cap];
        std::copy(begin(), begin() + m_size, h);
        if (m_capacity > 0) delete[] heap();
        std::memcpy(static_cast<void*>(m_inline), &h, sizeof h);
        m_capacity = cap;
    }
    void release() {
        if (m_capacity > 0) delete[] heap();
        m_capacity = 0;
    }
    void take(SmallVector& o) {
        std::memcpy(static_cast<void*>(m_inline), o.m_inline,
                    sizeof m_inline);  // inlined: a fixed size
        m_size = o.m_size;
        m_capacity = o.m_capacity;
        o.m_size = 0;
        o.m_capacity = 0;
    }

    uint32_t m_size = 0;
    uint32_t m_capacity = 0;  // of the heap array, 0 while inline
    T m_inline[kSlots];  // the elements, or (spilled) the heap pointer's bytes; unset past size
};

}  // namespace shardscope
