// SPDX-License-Identifier: Apache-2.0
#include "profiler/trace/trace.h"

namespace shardscope {

int64_t checkedProduct(int64_t a, int64_t b) {
    int64_t r = 0;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) return 0;
    return r;
}

int64_t shapeElements(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) {
        if (d < 0) return 0;
        n = checkedProduct(n, d);
        if (n == 0) return 0;
    }
    return n;
}

namespace {

size_t stringBytes(const std::string& s) {
    // Beyond the small-string buffer the characters live on the heap.
    return sizeof(std::string) + (s.capacity() > 15 ? s.capacity() + 1 : 0);
}

template <typename T>
size_t vectorBytes(const std::vector<T>& v) {
    return v.capacity() * sizeof(T);
}

// An unordered_map node: the value, the next pointer and the cached hash; plus buckets.
template <typename Map>
size_t mapBytes(const Map& m) {
    return m.size() * (sizeof(typename Map::value_type) + 2 * sizeof(void*)) +
           m.bucket_count() * sizeof(void*);
}

}  // namespace

int32_t StringTable::intern(std::string_view s) {
    auto it = m_index.find(s);
    if (it != m_index.end()) return it->second;
    const auto id = static_cast<int32_t>(m_strings.size());
    m_strings.emplace_back(s);
    m_index.emplace(m_strings.back(), id);
    return id;
}

size_t StringTable::memoryBytes() const {
    size_t b = vectorBytes(m_strings) - m_strings.size() * sizeof(std::string);
    for (const auto& str : m_strings)
        b += stringBytes(str);
    b += mapBytes(m_index);
    for (const auto& [key, _] : m_index)
        b += stringBytes(key) - sizeof(std::string);
    return b;
}

size_t Trace::memoryBytes() const {
    size_t b = strings.memoryBytes();
    for (const auto& l : lanes)
        b += sizeof(Lane) + stringBytes(l.tid) + stringBytes(l.name) - 2 * sizeof(std::string);
    b += vectorBytes(lanes) - lanes.size() * sizeof(Lane);
    b += vectorBytes(start) + vectorBytes(dur) + vectorBytes(lane) + vectorBytes(name) +
         vectorBytes(category) + vectorBytes(cls) + vectorBytes(opId) + vectorBytes(unit) +
         vectorBytes(phase);
    b += vectorBytes(collectives);
    for (const auto& c : collectives)
        b += stringBytes(c.name) + stringBytes(c.dtype) - 2 * sizeof(std::string);
    b += mapBytes(opInputs) + mapBytes(opStep) + stringBytes(metadata) - sizeof(std::string);
    for (const auto& [_, in] : opInputs) {
        b += vectorBytes(in.dims) + vectorBytes(in.types);
        for (const auto& d : in.dims)
            b += vectorBytes(d);
        for (const auto& ty : in.types)
            b += stringBytes(ty) - sizeof(std::string);
    }
    b += vectorBytes(flowEvents) + vectorBytes(memory) + vectorBytes(hostMemory) +
         vectorBytes(hostOpsWithStream);
    b += mapBytes(eventsByCategory);
    for (const auto& [key, _] : eventsByCategory)
        b += stringBytes(key) - sizeof(std::string);
    return b;
}

const char* eventClassName(EventClass c) {
    switch (c) {
        case EventClass::Computation:
            return "computation";
        case EventClass::Communication:
            return "communication";
        case EventClass::Memory:
            return "memory";
        case EventClass::Cpu:
            return "cpu";
        case EventClass::Other:
            return "other";
    }
    return "?";
}

}  // namespace shardscope
