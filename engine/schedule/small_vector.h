// SPDX-License-Identifier: Apache-2.0
#pragma once
// A vector with N elements stored inline: step-program ops carry a few dependencies and
// buffers each, and building an 80-block program must not cost thousands of mallocs
// (shardscope bench simulate). Spills to the heap beyond N.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

namespace shardscope {

template <typename T, size_t N>
class SmallVector {
    static_assert(std::is_trivially_copyable_v<T>, "SmallVector holds ids and plain values");

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
    SmallVector(SmallVector&& o) noexcept { *this = std::move(o); }
    SmallVector& operator=(const SmallVector& o) {
        if (this == &o) return *this;
        clear();
        if (o.m_size <= N) {  // the common case: a fixed-size copy the compiler unrolls
            for (size_t i = 0; i < N; ++i)
                m_inline[i] = o.m_inline[i];
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
        for (size_t i = 0; i < N; ++i)
            m_inline[i] = o.m_inline[i];
        m_size = o.m_size;
        m_capacity = o.m_capacity;
        m_heap = o.m_heap;
        o.m_heap = nullptr;
        o.m_size = 0;
        o.m_capacity = 0;
        return *this;
    }
    ~SmallVector() { release(); }

    void push_back(const T& v) {
        if (m_size < N) {
            m_inline[m_size++] = v;
            return;
        }
        if (m_size == m_capacity || m_heap == nullptr) grow();
        m_heap[m_size++] = v;
    }
    [[nodiscard]] size_t size() const { return m_size; }
    [[nodiscard]] bool empty() const { return m_size == 0; }
    const T* begin() const { return m_size <= N ? m_inline : m_heap; }
    const T* end() const { return begin() + m_size; }
    const T& operator[](size_t i) const { return begin()[i]; }
    const T& back() const { return begin()[m_size - 1]; }
    void clear() {
        release();
        m_size = 0;
    }

private:
    // Beyond N the elements live on the heap, all of them (begin() stays one pointer).
    void grow() {
        const uint32_t cap = m_capacity == 0 ? static_cast<uint32_t>(2 * N) : 2 * m_capacity;
        T* heap = new T[cap];
        std::copy(begin(), begin() + m_size, heap);
        delete[] m_heap;
        m_heap = heap;
        m_capacity = cap;
    }
    void release() {
        delete[] m_heap;
        m_heap = nullptr;
        m_capacity = 0;
    }

    T m_inline[N]{};
    uint32_t m_size = 0;
    uint32_t m_capacity = 0;  // of m_heap
    T* m_heap = nullptr;
};

}  // namespace shardscope
