// SPDX-License-Identifier: Apache-2.0
#include "gui/timeline/memory_chart.h"

#include <QPainter>
#include <QPainterPath>

#include <algorithm>

#include "gui/timeline/timeline_widget.h"
#include "plans/core/strings.h"

namespace shardscope::gui {

namespace {
const QColor kCategoryColors[] = {QColor(0x9a, 0xb8, 0xd8), QColor(0x4c, 0x8b, 0xd6),
                                  QColor(0x3a, 0xa8, 0x5a), QColor(0xe0, 0x8a, 0x2c),
                                  QColor(0xd0, 0x5a, 0x4a), QColor(0xb0, 0x4c, 0xc9),
                                  QColor(0x88, 0x88, 0x88), QColor(0xcc, 0xcc, 0x66)};
}  // namespace

MemoryChart::MemoryChart(QWidget* parent) : QWidget(parent) {
    setMinimumHeight(110);
}

void MemoryChart::setData(std::shared_ptr<const SimResult> sim, int64_t deviceBytes) {
    m_sim = std::move(sim);
    m_device = deviceBytes;
    m_points = m_sim ? m_sim->timeline : std::vector<MemoryPoint>{};
    std::stable_sort(
        m_points.begin(), m_points.end(),
        [](const MemoryPoint& a, const MemoryPoint& b) { return a.timeNs < b.timeNs; });
    m_peak = m_sim ? m_sim->peakAllocated : 0;
    update();
}

void MemoryChart::setRange(int64_t startNs, int64_t endNs) {
    m_start = startNs;
    m_end = std::max(endNs, startNs + 1);
    update();
}

void MemoryChart::paintEvent(QPaintEvent*) {
    QPainter p(this);
    p.fillRect(rect(), palette().base());
    if (!m_sim || m_points.empty()) return;
    const int left = TimelineWidget::kLabelWidth, top = 6, h = height() - 22;
    const int w = std::max(1, width() - left);
    const double maxBytes = static_cast<double>(std::max({m_sim->peakReserved, m_sim->peakAllocated,
                                                          m_device, int64_t{1}})) *
                            1.05;
    // A measured trace has the allocator's total, not categories: one area.
    bool measured = true;
    for (const auto& m : m_points)
        for (int64_t b : m.byCategory)
            measured = measured && b == 0;
    auto x = [&](int64_t t) {
        return left + static_cast<double>(t - m_start) * w / static_cast<double>(m_end - m_start);
    };
    auto y = [&](double b) { return top + h - b / maxBytes * h; };
    const auto& pts = m_points;
    // Stacked areas, one per category, drawn bottom-up as step functions.
    const int cats = static_cast<int>(MemCategory::Count);
    if (measured) {
        QPainterPath path;
        path.moveTo(x(pts.front().timeNs), y(0));
        double prevY = y(0);
        for (const auto& m : pts) {
            const double xx = x(m.timeNs);
            path.lineTo(xx, prevY);
            prevY = y(static_cast<double>(m.allocated));
            path.lineTo(xx, prevY);
        }
        path.lineTo(x(m_end), prevY);
        path.lineTo(x(m_end), y(0));
        path.closeSubpath();
        p.fillPath(path, QColor(0x4a, 0x78, 0xb0));
    }
    for (int c = measured ? -1 : cats - 1; c >= 0; --c) {
        QPainterPath path;
        path.moveTo(x(pts.front().timeNs), y(0));
        double prevY = y(0);
        for (const auto& m : pts) {
            double stacked = 0;
            for (int k = 0; k <= c; ++k)
                stacked += static_cast<double>(m.byCategory[static_cast<size_t>(k)]);
            const double xx = x(m.timeNs);
            path.lineTo(xx, prevY);
            prevY = y(stacked);
            path.lineTo(xx, prevY);
        }
        path.lineTo(x(m_end), prevY);
        path.lineTo(x(m_end), y(0));
        path.closeSubpath();
        p.fillPath(path, kCategoryColors[c]);
    }
    // Reserved (caching allocator) and device capacity.
    p.setPen(QPen(QColor(0x30, 0x30, 0x30), 1.2));
    QPainterPath reserved;
    reserved.moveTo(x(pts.front().timeNs), y(static_cast<double>(pts.front().reserved)));
    for (const auto& m : pts) {
        reserved.lineTo(x(m.timeNs), reserved.currentPosition().y());
        reserved.lineTo(x(m.timeNs), y(static_cast<double>(m.reserved)));
    }
    p.drawPath(reserved);
    if (m_device > 0) {
        p.setPen(QPen(QColor(0xc0, 0x20, 0x20), 1, Qt::DashLine));
        p.drawLine(QPointF(left, y(static_cast<double>(m_device))),
                   QPointF(width(), y(static_cast<double>(m_device))));
    }
    // The peak of allocated memory, marked where it first occurs.
    auto peakIt = std::max_element(
        pts.begin(), pts.end(),
        [](const MemoryPoint& a, const MemoryPoint& b) { return a.allocated < b.allocated; });
    p.setPen(QPen(Qt::black, 1));
    const QPointF peak(x(peakIt->timeNs), y(static_cast<double>(peakIt->allocated)));
    p.drawEllipse(peak, 3, 3);
    p.setPen(palette().text().color());
    p.drawText(QRect(4, top, left - 8, h), Qt::AlignLeft | Qt::AlignTop,
               QString("memory\npeak %1\nreserved %2")
                   .arg(QString::fromStdString(formatBytes(m_sim->peakAllocated)),
                        QString::fromStdString(formatBytes(m_sim->peakReserved))));
    int lx = left + 4;
    if (measured) {
        p.fillRect(QRect(lx, height() - 14, 10, 10), QColor(0x4a, 0x78, 0xb0));
        p.drawText(QPoint(lx + 13, height() - 5),
                   "allocated (measured: the allocator's total, no categories)");
    }
    for (int c = 0; c < (measured ? 0 : cats); ++c) {
        const QString name =
            QString(memCategoryName(static_cast<MemCategory>(c))).replace('_', ' ');
        p.fillRect(QRect(lx, height() - 14, 10, 10), kCategoryColors[c]);
        p.drawText(QPoint(lx + 13, height() - 5), name);
        lx += 18 + QFontMetrics(font()).horizontalAdvance(name);
    }
}

}  // namespace shardscope::gui
