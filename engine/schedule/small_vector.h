// SPDX-License-Identifier: Apache-2.0
#pragma once
// A vector with N elements stored inline: step-program ops carry a few dependencies and
// buffers each, and building an 80-block program must not cost thousands of mallocs
// (shardscope bench simulate). Spills to the heap beyond N.
#include <cstddef>
#include <vector>

namespace shardscope {

template <typename T, size_t N>
class SmallVector {
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
    void push_back(const T& v) {
        if (m_size < N) {
            m_inline[m_size] = v;
        } else {
            if (m_heap.empty()) m_heap.assign(m_inline, m_inline + N);
            m_heap.push_back(v);
        }
        ++m_size;
    }
    [[nodiscard]] size_t size() const { return m_size; }
    [[nodiscard]] bool empty() const { return m_size == 0; }
    const T* begin() const { return m_size <= N ? m_inline : m_heap.data(); }
    const T* end() const { return begin() + m_size; }
    const T& operator[](size_t i) const { return begin()[i]; }
    const T& back() const { return begin()[m_size - 1]; }
    void clear() {
        m_size = 0;
        m_heap.clear();
    }

private:
    T m_inline[N]{};
    size_t m_size = 0;
    std::vector<T> m_heap;
};

}  // namespace shardscope
