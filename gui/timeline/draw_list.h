// SPDX-License-Identifier: Apache-2.0
#pragma once
// Timeline drawing, split as Tracy and Orbit do: a pure buildDrawList(track data,
// viewport) that tests can count, and a widget whose paintEvent only replays the list.
// Never more than about one primitive per pixel: events narrower than minWidthPx are
// folded into one block with their neighbours (Tracy's MinVisSize), and the visible range
// is found by binary search in start-sorted storage (Qt Creator's firstIndex).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace shardscope::gui {

enum class EventKind : uint8_t { Compute, AllGather, ReduceScatter, AllReduce, Copy, Other };
inline constexpr size_t kEventKinds = 6;

struct TimelineEvent {
    int64_t start = 0;  // ns
    int64_t end = 0;
    EventKind kind = EventKind::Other;
    int32_t op = -1;    // step-program op id (simulation) or event index (trace)
    std::string label;  // "model.layers.3 all-gather"
    int32_t unit = -1;  // index into TimelineData::units; -1 when unknown
};

struct TimelineRow {
    std::string name;                   // "compute", "all_gather", ...
    std::vector<TimelineEvent> events;  // sorted by start, non-overlapping within a stream
    std::string group;                  // "rank 1" when the data holds several ranks
    bool host = false;  // a host thread's kernel launches: shown with the flows only
    // Nesting depth inside its track (splitNestedRows): 0 the track's outermost slices,
    // k those k levels inside them, drawn in the row below depth k - 1.
    int depth = 0;
    // Time per kind of events[0..i), for i in 0..events.size() (sortEventsByStart fills it):
    // a folded block is coloured by the kind that covers most of its events' time. Empty:
    // a block of mixed kinds is drawn as Other.
    std::vector<std::array<int64_t, kEventKinds>> kindNs;
};

// "rank 1 · compute", or the row's name when it has no group: what a track is called in the
// pinned band and by --pin.
[[nodiscard]] inline std::string trackName(const TimelineRow& r) {
    return r.group.empty() ? r.name : r.group + " \u00b7 " + r.name;
}

struct Viewport {
    int64_t startNs = 0;
    int64_t endNs = 1;
    int widthPx = 1000;
    double minWidthPx = 3.0;  // narrower events are folded
    int minLabelPx = 60;      // wider blocks get a label
};

struct DrawRect {
    int row = 0;
    double x0 = 0, x1 = 0;
    EventKind kind = EventKind::Other;
    int32_t op = -1;     // -1 for a folded block
    int32_t folded = 1;  // events it stands for
    std::string label;   // empty when too narrow
};

// Pixel coordinates of a time; edge cases: times before the viewport map below 0, after
// it beyond widthPx; a zero-length viewport maps everything to 0.
[[nodiscard]] double timeToPixel(int64_t t, const Viewport& v);
[[nodiscard]] int64_t pixelToTime(double x, const Viewport& v);

// Establishes TimelineRow's order invariant once the events are in (by start, per row) and
// fills TimelineRow::kindNs.
void sortEventsByStart(std::vector<TimelineRow>& rows);

// A track whose slices nest (a CPU thread: ProfilerStep > FSDP::pre_forward > aten::mm)
// becomes one row per depth, as Perfetto draws them, so that no row holds overlapping events
// (buildDrawList's binary search needs that, and a parent stays visible when zoomed into its
// child). A slice's depth is the number of open slices it starts inside; the rows of one
// track follow each other, depth 0 first, with the track's name and group. Call before
// sortEventsByStart; rows without overlap are left as they are.
void splitNestedRows(std::vector<TimelineRow>& rows);

[[nodiscard]] std::vector<DrawRect> buildDrawList(const std::vector<TimelineRow>& rows,
                                                  const Viewport& v);
// The rows shown (collapsed ranks left out); DrawRect::row indexes `rows`, null entries
// (group headers) draw nothing.
[[nodiscard]] std::vector<DrawRect> buildDrawList(const std::vector<const TimelineRow*>& rows,
                                                  const Viewport& v);

}  // namespace shardscope::gui
