// SPDX-License-Identifier: Apache-2.0
#pragma once
// One row per stream, events coloured by kind (compute, all-gather, reduce-scatter,
// all-reduce, copies), unit names where wide enough. Several ranks get a header row each
// that collapses them (click it). Wheel or W/S zooms around the cursor, dragging or A/D
// pans, F fits the selection (the selected op or range; the step when nothing is
// selected, as Perfetto's F); hovering shows the op, clicking selects it (eventSelected),
// shift-dragging selects a time range (rangeSelected), Esc clears both. paintEvent replays
// the draw list buildDrawList() made for the current viewport.
#include <QFontMetrics>
#include <QWidget>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <unordered_map>

#include "gui/timeline/draw_list.h"

class QPainter;

namespace shardscope::gui {

struct TimelineData {
    std::vector<TimelineRow> rows;
    int64_t endNs = 0;
    std::vector<std::string> units;  // TimelineEvent::unit names ("" for the root)
    // Training steps of a measured trace (ShardScope's step spans, or Kineto's
    // ProfilerStep#N), per rank group; empty for a simulated step.
    struct Step {
        std::string group;
        int64_t start = 0, end = 0;
    };
    std::vector<Step> steps;
    // Launch-to-kernel flows: from a host row's launch to a device row's kernel (row
    // indices into `rows`), sorted by fromTime.
    struct Flow {
        int32_t fromRow = 0;
        int64_t fromTime = 0;
        int32_t toRow = 0;
        int64_t toTime = 0;
    };
    std::vector<Flow> flows;
    // The details panel's text for an event (by TimelineEvent::op): unit, phase, bytes,
    // duration, achieved bandwidth, what it waited on. Null: the label only.
    std::function<std::string(int32_t op)> describe;
    // Each collective's exposed parts (no compute of its rank ran meanwhile), by
    // TimelineEvent::op; drawn hatched over the collective (markExposedCommunication).
    std::unordered_map<int32_t, std::vector<std::pair<int64_t, int64_t>>> exposed;
    // What each op waited on before it could start (by TimelineEvent::op: the step
    // program's cross-stream events); the selected op's are drawn as arrows.
    std::unordered_map<int32_t, std::vector<int32_t>> waits;
};

// Fills TimelineData::exposed: per rank group, the union of its compute events; each
// all-gather, reduce-scatter and all-reduce of that group, minus that union. Collectives
// with nothing exposed get no entry.
void markExposedCommunication(TimelineData& d);

// An event's label in a box of widthPx: elided in the middle, so that both a unit's name and
// the op's kind ("model.la…26 forward"), or a kernel name's start and end, stay readable;
// the full name is in the tooltip.
[[nodiscard]] QString elideLabel(const QString& label, const QFontMetrics& fm, int widthPx);

class TimelineWidget : public QWidget {
    Q_OBJECT
public:
    explicit TimelineWidget(QWidget* parent = nullptr);
    // New data; `keepView`: the same step again after an edit, so the zoom stays where the
    // user put it (when it still overlaps the step), else the view fits the data.
    void setData(std::shared_ptr<const TimelineData> data, bool keepView = false);
    [[nodiscard]] const std::shared_ptr<const TimelineData>& data() const { return m_data; }
    void fit();
    void fitSelection();  // F: the selected op (with a margin) or range, else the step
    // The hover text at a point of the widget: the op's name, stream and rank, start and
    // duration; empty over nothing.
    [[nodiscard]] QString tooltipAt(QPointF pos) const;
    void setViewport(int64_t startNs, int64_t endNs);  // another timeline's, for Compare
    [[nodiscard]] const std::vector<DrawRect>& lastDrawList() const { return m_drawList; }
    [[nodiscard]] Viewport viewport() const;
    static constexpr int kLabelWidth = 150;  // fits "rank 0 · reduce_scatter"
    static constexpr int kRowHeight = 22;
    static constexpr int kTop = 20;  // the time axis above the rows

    // Rows as drawn: null for a rank's header row.
    [[nodiscard]] const std::vector<const TimelineRow*>& visibleRows() const { return m_visible; }
    void setCollapsed(const std::string& group, bool collapsed);
    [[nodiscard]] bool isCollapsed(const std::string& group) const {
        return m_collapsed.count(group) > 0;
    }
    // The y of a visible row's top, for tests that click like a user.
    [[nodiscard]] int rowY(int visibleRow) const {
        return kTop + pinBand() + visibleRow * kRowHeight;
    }
    // Pinning (Perfetto's): a pinned track is also drawn in a band under the time axis that
    // stays on screen while the tracks scroll; click a row's name to pin or unpin it.
    void setPinned(int dataRow, bool pinned);  // dataRow indexes data()->rows
    [[nodiscard]] const std::vector<int>& pinnedRows() const { return m_pinned; }
    // The pinned row at y (widget coordinates), or -1.
    [[nodiscard]] int pinnedAt(double y) const;
    [[nodiscard]] int32_t selectedOp() const { return m_selectedOp; }
    [[nodiscard]] std::optional<std::pair<int64_t, int64_t>> selectedRange() const {
        return m_range;
    }
    void selectRange(int64_t startNs, int64_t endNs);
    void selectOp(int32_t op);  // highlights it and signals eventSelected, as a click does
    // Launch-to-kernel flows on request: the host rows with the launches, and an arrow per
    // flow (at most one per pixel column); lastFlowCount() is how many the last paint drew.
    void setShowFlows(bool on);
    [[nodiscard]] bool showFlows() const { return m_showFlows; }
    [[nodiscard]] size_t lastFlowCount() const { return m_lastFlowCount; }
    // Arrows the last paint drew from the ops the selected op waited on to it.
    [[nodiscard]] size_t lastDependencyCount() const { return m_lastDependencyCount; }
    void clearSelection();
    // Search: events whose label contains `query` (case-insensitive; host launch rows left
    // out), by start time. findNext selects the match after the current one (before it
    // when `backward`), wrapping around, expands its rank and centres the view on it; it
    // returns the match's position, -1 when nothing matches.
    int setSearch(const std::string& query);  // the number of matches
    int findNext(bool backward = false);
    [[nodiscard]] int searchMatches() const { return static_cast<int>(m_matches.size()); }

signals:
    void viewportChanged(int64_t startNs, int64_t endNs);
    void eventSelected(int32_t op);  // -1: none
    void rangeSelected(int64_t startNs, int64_t endNs);
    void selectionCleared();

protected:
    void paintEvent(QPaintEvent*) override;
    void wheelEvent(QWheelEvent* e) override;
    void mousePressEvent(QMouseEvent* e) override;
    void mouseMoveEvent(QMouseEvent* e) override;
    void mouseReleaseEvent(QMouseEvent* e) override;
    void keyPressEvent(QKeyEvent* e) override;
    QSize sizeHint() const override;

private:
    [[nodiscard]] int pinBand() const { return static_cast<int>(m_pinned.size()) * kRowHeight; }
    [[nodiscard]] int stickyTop() const;
    void paintPinnedAndAxis(QPainter& p, const Viewport& v);
    // Events laid out by buildDrawList, rows from y0: fill, exposed hatching, label,
    // selection (the tracks and the pinned band alike).
    void paintRects(QPainter& p, const std::vector<DrawRect>& rects, int y0,
                    const Viewport& v) const;
    void zoom(double factor, double atX);
    void pan(double px);
    void rebuildVisible();
    [[nodiscard]] int rowAt(double y) const;
    [[nodiscard]] const DrawRect* rectAt(double x, double y) const;
    [[nodiscard]] std::string groupOfHeader(int visibleRow) const;

    std::shared_ptr<const TimelineData> m_data;
    std::vector<const TimelineRow*> m_visible;
    std::vector<std::string> m_headerGroup;  // per visible row: the group of a header row
    std::set<std::string> m_collapsed;
    int64_t m_start = 0, m_end = 1;
    std::vector<DrawRect> m_drawList;
    std::vector<int> m_pinned;  // data rows, in the order they were pinned
    std::vector<DrawRect> m_pinnedDrawList;
    int m_dragX = -1, m_pressX = -1;
    bool m_selectingRange = false;
    int64_t m_rangeAnchor = 0;
    std::optional<std::pair<int64_t, int64_t>> m_range;
    int32_t m_selectedOp = -1;
    bool m_showFlows = false;
    size_t m_lastFlowCount = 0;
    size_t m_lastDependencyCount = 0;
    std::vector<int> m_visibleIndex;                     // per data row: its visible row, or -1
    std::vector<std::pair<int32_t, int32_t>> m_matches;  // (row, event index), by start
    int m_match = -1;                                    // the current match
};

}  // namespace shardscope::gui
