// SPDX-License-Identifier: Apache-2.0
#include "profiler/trace/trace.h"

namespace shardscope {

int32_t StringTable::intern(std::string_view s) {
    auto it = m_index.find(std::string(s));
    if (it != m_index.end()) return it->second;
    const auto id = static_cast<int32_t>(m_strings.size());
    m_strings.emplace_back(s);
    m_index.emplace(m_strings.back(), id);
    return id;
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
