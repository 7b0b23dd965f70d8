// SPDX-License-Identifier: Apache-2.0
#pragma once
// One row per stream, events coloured by kind (compute, all-gather, reduce-scatter,
// all-reduce, copies), unit names where wide enough. Wheel or W/S zooms around the cursor,
// dragging or A/D pans, F fits the step; hovering shows the op. paintEvent replays the draw
// list buildDrawList() made for the current viewport.
#include <QWidget>

#include <memory>

#include "gui/timeline/draw_list.h"

namespace shardscope::gui {

struct TimelineData {
    std::vector<TimelineRow> rows;
    int64_t endNs = 0;
};

class TimelineWidget : public QWidget {
    Q_OBJECT
public:
    explicit TimelineWidget(QWidget* parent = nullptr);
    void setData(std::shared_ptr<const TimelineData> data);
    void fit();
    [[nodiscard]] const std::vector<DrawRect>& lastDrawList() const { return m_drawList; }
    [[nodiscard]] Viewport viewport() const;
    static constexpr int kLabelWidth = 150;  // fits "rank 0 · reduce_scatter"

signals:
    void viewportChanged(int64_t startNs, int64_t endNs);

public:
    static constexpr int kRowHeight = 22;

protected:
    void paintEvent(QPaintEvent*) override;
    void wheelEvent(QWheelEvent* e) override;
    void mousePressEvent(QMouseEvent* e) override;
    void mouseMoveEvent(QMouseEvent* e) override;
    void keyPressEvent(QKeyEvent* e) override;
    QSize sizeHint() const override;

private:
    void zoom(double factor, double atX);
    void pan(double px);

    std::shared_ptr<const TimelineData> m_data;
    int64_t m_start = 0, m_end = 1;
    std::vector<DrawRect> m_drawList;
    int m_dragX = -1;
};

}  // namespace shardscope::gui
