// SPDX-License-Identifier: Apache-2.0
#pragma once
// Memory under the timeline, on the same time axis: allocated bytes stacked by category,
// the reserved line, the device-memory line, and the peak marked. Follows the timeline's
// viewport (TimelineWidget::viewportChanged).
#include <QWidget>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/sim/simulator.h"

namespace shardscope::gui {

// One rank's allocated bytes over time, drawn as a line over the chart.
struct MemorySeries {
    std::string name;                                 // "rank 1"
    std::vector<std::pair<int64_t, int64_t>> points;  // (time ns, allocated bytes), by time
};

class MemoryChart : public QWidget {
    Q_OBJECT
public:
    explicit MemoryChart(QWidget* parent = nullptr);
    // `points` from SimResult::timeline; `deviceBytes` draws the capacity line (0: none).
    void setData(std::shared_ptr<const SimResult> sim, int64_t deviceBytes);
    // Every rank's counter of a multi-rank trace, a line each (empty: none).
    void setSeries(std::vector<MemorySeries> series);
    void setRange(int64_t startNs, int64_t endNs);
    [[nodiscard]] int64_t peakShown() const { return m_peak; }
    [[nodiscard]] const std::vector<MemorySeries>& series() const { return m_series; }
    // What the hover shows at x (widget pixels): the time, and allocated (and reserved) at
    // that time, per rank when there are several; empty left of the plot.
    [[nodiscard]] QString readoutAt(double x) const;

protected:
    void paintEvent(QPaintEvent*) override;
    void mouseMoveEvent(QMouseEvent* e) override;

private:
    [[nodiscard]] int64_t timeAt(double x) const;
    std::vector<MemorySeries> m_series;
    std::shared_ptr<const SimResult> m_sim;
    // Samples come in CPU issue order, whose GPU start times are not monotonic across
    // streams; drawn as a step function they must be sorted by time.
    std::vector<MemoryPoint> m_points;
    int64_t m_device = 0, m_start = 0, m_end = 1, m_peak = 0;
};

}  // namespace shardscope::gui
