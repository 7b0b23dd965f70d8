// SPDX-License-Identifier: Apache-2.0
#pragma once
// Memory under the timeline, on the same time axis: allocated bytes stacked by category,
// the reserved line, the device-memory line, and the peak marked. Follows the timeline's
// viewport (TimelineWidget::viewportChanged).
#include <QWidget>

#include <memory>

#include "engine/sim/simulator.h"

namespace shardscope::gui {

class MemoryChart : public QWidget {
    Q_OBJECT
public:
    explicit MemoryChart(QWidget* parent = nullptr);
    // `points` from SimResult::timeline; `deviceBytes` draws the capacity line (0: none).
    void setData(std::shared_ptr<const SimResult> sim, int64_t deviceBytes);
    void setRange(int64_t startNs, int64_t endNs);
    [[nodiscard]] int64_t peakShown() const { return m_peak; }

protected:
    void paintEvent(QPaintEvent*) override;

private:
    std::shared_ptr<const SimResult> m_sim;
    // Samples come in CPU issue order, whose GPU start times are not monotonic across
    // streams; drawn as a step function they must be sorted by time.
    std::vector<MemoryPoint> m_points;
    int64_t m_device = 0, m_start = 0, m_end = 1, m_peak = 0;
};

}  // namespace shardscope::gui
