// SPDX-License-Identifier: Apache-2.0
#include "gui/timeline/draw_list.h"

#include <algorithm>
#include <iterator>

namespace shardscope::gui {

double timeToPixel(int64_t t, const Viewport& v) {
    const int64_t span = v.endNs - v.startNs;
    if (span <= 0) return 0;
    return static_cast<double>(t - v.startNs) * v.widthPx / static_cast<double>(span);
}

int64_t pixelToTime(double x, const Viewport& v) {
    const int64_t span = v.endNs - v.startNs;
    if (v.widthPx <= 0) return v.startNs;
    return v.startNs + static_cast<int64_t>(x * static_cast<double>(span) / v.widthPx);
}

void sortEventsByStart(std::vector<TimelineRow>& rows) {
    const auto byStart = [](const TimelineEvent& a, const TimelineEvent& b) {
        return a.start < b.start;
    };
    for (auto& r : rows) {
        // Rows splitNestedRows made are in order already (enclosing slices first on ties,
        // which an unstable sort could undo).
        if (!std::is_sorted(r.events.begin(), r.events.end(), byStart))
            std::sort(r.events.begin(), r.events.end(), byStart);
        r.kindNs.assign(r.events.size() + 1, {});
        for (size_t i = 0; i < r.events.size(); ++i) {
            r.kindNs[i + 1] = r.kindNs[i];
            r.kindNs[i + 1][static_cast<size_t>(r.events[i].kind)] +=
                std::max<int64_t>(0, r.events[i].end - r.events[i].start);
        }
    }
}

void splitNestedRows(std::vector<TimelineRow>& rows) {
    std::vector<TimelineRow> out;
    out.reserve(rows.size());
    for (auto& r : rows) {
        // Outer slices first: by start, then the longer one (it encloses the other).
        std::stable_sort(r.events.begin(), r.events.end(),
                         [](const TimelineEvent& a, const TimelineEvent& b) {
                             return a.start != b.start ? a.start < b.start : a.end > b.end;
                         });
        std::vector<int64_t> open;  // ends of the slices enclosing the next one
        std::vector<int32_t> depthOf(r.events.size(), 0);
        int32_t deepest = 0;
        for (size_t i = 0; i < r.events.size(); ++i) {
            const TimelineEvent& e = r.events[i];
            while (!open.empty() && open.back() <= e.start)
                open.pop_back();
            // A slice at depth d starts after the last one at d ended: it was popped first.
            depthOf[i] = static_cast<int32_t>(open.size());
            deepest = std::max(deepest, depthOf[i]);
            open.push_back(e.end);
        }
        if (deepest == 0) {
            out.push_back(std::move(r));
            continue;
        }
        const size_t first = out.size();
        for (int32_t k = 0; k <= deepest; ++k) {
            TimelineRow sub;
            sub.name = r.name;
            sub.group = r.group;
            sub.host = r.host;
            sub.depth = r.depth + k;
            out.push_back(std::move(sub));
        }
        for (size_t i = 0; i < r.events.size(); ++i)
            out[first + static_cast<size_t>(depthOf[i])].events.push_back(std::move(r.events[i]));
    }
    rows = std::move(out);
}

namespace {

// The kind covering most of events [first, last) of a row (ties: the lower kind).
EventKind dominantKind(const TimelineRow& row, size_t first, size_t last) {
    size_t best = 0;
    int64_t bestNs = -1;
    for (size_t k = 0; k < kEventKinds; ++k) {
        const int64_t ns = row.kindNs[last][k] - row.kindNs[first][k];
        if (ns > bestNs) {
            best = k;
            bestNs = ns;
        }
    }
    return static_cast<EventKind>(best);
}

}  // namespace

std::vector<DrawRect> buildDrawList(const std::vector<TimelineRow>& rows, const Viewport& v) {
    std::vector<const TimelineRow*> ptrs;
    ptrs.reserve(rows.size());
    for (const auto& r : rows)
        ptrs.push_back(&r);
    return buildDrawList(ptrs, v);
}

std::vector<DrawRect> buildDrawList(const std::vector<const TimelineRow*>& rows,
                                    const Viewport& v) {
    std::vector<DrawRect> out;
    for (size_t r = 0; r < rows.size(); ++r) {
        if (!rows[r]) continue;
        const auto& ev = rows[r]->events;
        const bool indexed = rows[r]->kindNs.size() == ev.size() + 1;
        size_t blockFirst = 0;  // the first event of the last block
        // First event ending after the viewport start: events are sorted and, within one
        // stream, do not overlap, so ends are sorted too.
        auto it = std::lower_bound(ev.begin(), ev.end(), v.startNs,
                                   [](const TimelineEvent& e, int64_t t) { return e.end <= t; });
        for (; it != ev.end() && it->start < v.endNs; ++it) {
            const double x0 = std::max(0.0, timeToPixel(it->start, v));
            const double x1 = std::min<double>(v.widthPx, timeToPixel(it->end, v));
            const bool narrow = x1 - x0 < v.minWidthPx;
            if (narrow && !out.empty() && out.back().row == static_cast<int>(r) &&
                x0 - out.back().x1 < v.minWidthPx &&
                (out.back().folded > 1 || out.back().x1 - out.back().x0 < v.minWidthPx)) {
                // Fold into the previous block.
                DrawRect& b = out.back();
                b.x1 = std::max(b.x1, std::max(x1, x0 + 1.0));
                ++b.folded;
                b.op = -1;
                if (b.kind != it->kind) b.kind = EventKind::Other;
                b.label.clear();
                // Every later event that ends before the block's next minWidthPx folds into
                // it too: skip them by binary search (ends are sorted), so a repaint costs
                // about one step per pixel, not one per event (a million at full zoom-out).
                // Their kinds are not looked at one by one: the row's kind index gives the block's.
                const int64_t limit = pixelToTime(b.x1 + v.minWidthPx, v);
                auto jt =
                    std::lower_bound(std::next(it), ev.end(), limit,
                                     [](const TimelineEvent& e, int64_t t) { return e.end < t; });
                if (jt != std::next(it)) {
                    b.folded += static_cast<int32_t>(jt - std::next(it));
                    b.x1 = std::max(
                        b.x1, std::min<double>(v.widthPx, timeToPixel(std::prev(jt)->end, v)));
                    it = std::prev(jt);
                }
                // With the row's kind index, the block takes the kind that covers most of
                // its events' time, all of them counted (a dense stream of mostly compute
                // with some collectives is drawn as compute, not grey).
                if (indexed)
                    b.kind = dominantKind(*rows[r], blockFirst,
                                          static_cast<size_t>(std::next(it) - ev.begin()));
                continue;
            }
            blockFirst = static_cast<size_t>(it - ev.begin());
            DrawRect d{static_cast<int>(r), x0, std::max(x1, x0 + 1.0), it->kind, it->op, 1, {}};
            if (x1 - x0 >= v.minLabelPx) d.label = it->label;
            out.push_back(std::move(d));
        }
    }
    return out;
}

}  // namespace shardscope::gui
