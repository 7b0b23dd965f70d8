// SPDX-License-Identifier: Apache-2.0
#pragma once
// Figures of a timeline, over a time range or the whole step, per rank: busy time, compute,
// communication and the part of it no compute overlaps (exposed), as the simulator and
// `shardscope trace overlap` count them: unions of intervals, so work on several streams at
// once counts once. The range selection, the Compare table and its per-unit differences
// read them.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gui/timeline/timeline_widget.h"

namespace shardscope::gui {

struct RangeStats {
    std::string group;  // the rank ("" when the data has one)
    int64_t startNs = 0, endNs = 0;
    int64_t busyNs = 0;     // any stream busy
    int64_t computeNs = 0;  // compute busy
    int64_t commNs = 0;     // all-gather, reduce-scatter or all-reduce busy
    int64_t exposedCommNs = 0;
    int32_t events = 0;  // events that intersect the range
    [[nodiscard]] double overlapPercent() const {
        return commNs > 0 ? 100.0 * static_cast<double>(commNs - exposedCommNs) /
                                static_cast<double>(commNs)
                          : 0.0;
    }
};

// One entry per rank (row group), in row order; events clipped to [startNs, endNs).
[[nodiscard]] std::vector<RangeStats> rangeStats(const TimelineData& d, int64_t startNs,
                                                 int64_t endNs);

struct StepStats {
    // The first rank's: over its measured steps, averaged (steps counts them), else from
    // the first event's start to the last one's end.
    RangeStats total;
    int32_t steps = 0;
    int64_t stepNs = 0;  // mean step span
    // Per unit name: communication time no compute overlaps (first rank).
    std::map<std::string, int64_t> exposedCommByUnit;
    std::map<std::string, int64_t> commByUnit;
};

[[nodiscard]] StepStats stepStats(const TimelineData& d);

// A selection aggregated by event name, as Perfetto's slice table does: events that
// intersect [startNs, endNs) on every row (host launch rows left out), per label without
// its unit ("model.layers.3 all-gather" counts as "all-gather").
struct NameStats {
    std::string name;
    int32_t count = 0;
    int64_t inRangeNs = 0;  // summed, each event clipped to the range
    int64_t totalNs = 0;    // summed whole durations
    int64_t maxNs = 0;
    [[nodiscard]] int64_t meanNs() const { return count > 0 ? totalNs / count : 0; }
};
// Largest in-range time first (ties by name).
[[nodiscard]] std::vector<NameStats> statsByName(const TimelineData& d, int64_t startNs,
                                                 int64_t endNs);

// Events whose label contains `query` (case-insensitive), by start time then row: the
// search's matches, as (row index into TimelineData::rows, event index in that row).
struct EventRef {
    int32_t row = 0;
    int32_t index = 0;
};
[[nodiscard]] std::vector<EventRef> findEvents(const TimelineData& d, const std::string& query);

}  // namespace shardscope::gui
