// SPDX-License-Identifier: Apache-2.0
#pragma once
// Writes a trace (any that the importer reads) as Chrome trace JSON that Perfetto UI loads
// as meant (tests/python/perfetto_rules.py): a process per rank and lane kind, pid >= 1,
// tids unique across processes, lane names as thread names; events with their category and
// the args the importer reads back (ShardScope's op id, unit, phase and kind; collectives'
// name, sizes and group size); memory counters as [memory] events; launch-to-kernel flows.
// Importing the export gives back the same trace: the event columns, lanes (by name and
// kind), collectives, memory and flows (tests/profiler/test_chrome_export.cpp).
#include <nlohmann/json.hpp>

#include "profiler/trace/trace.h"

namespace shardscope {

[[nodiscard]] nlohmann::json exportChromeTrace(const Trace& t);

}  // namespace shardscope
