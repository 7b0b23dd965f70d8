// SPDX-License-Identifier: Apache-2.0
#include "gui/timeline/memory_chart.h"

#include <QMouseEvent>
#include <QPainter>
#include <QPainterPath>
#include <QToolTip>

#include <algorithm>

#include "gui/timeline/timeline_widget.h"
#include "plans/core/strings.h"

namespace shardscope::gui {

namespace {
const QColor kRankColors[] = {QColor(0x1f, 0x3a, 0x93), QColor(0xd9, 0x4f, 0x1e),
                              QColor(0x2e, 0x8b, 0x57), QColor(0x8e, 0x44, 0xad),
                              QColor(0xb0, 0x8d, 0x00), QColor(0x00, 0x8b, 0x8b),
                              QColor(0xc7, 0x15, 0x85), QColor(0x55, 0x55, 0x55)};
// The value of a step function (points by time) at t: the last point at or before t.
template <typename P, typename F>
int64_t valueAt(const std::vector<P>& pts, int64_t t, F timeOf, int64_t (*valueOf)(const P&)) {
    auto it = std::upper_bound(pts.begin(), pts.end(), t,
                               [&](int64_t x, const P& p) { return x < timeOf(p); });
    return it == pts.begin() ? 0 : valueOf(*std::prev(it));
}
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
    setMouseTracking(m_sim != nullptr);
    update();
}

void MemoryChart::setSeries(std::vector<MemorySeries> series) {
    m_series = std::move(series);
    setMouseTracking(!m_series.empty() || m_sim);
    update();
}

int64_t MemoryChart::timeAt(double x) const {
    const int left = TimelineWidget::kLabelWidth;
    const int w = std::max(1, width() - left);
    return m_start + static_cast<int64_t>((x - left) * static_cast<double>(m_end - m_start) / w);
}

QString MemoryChart::readoutAt(double x) const {
    if (x < TimelineWidget::kLabelWidth || (!m_sim && m_series.empty())) return {};
    const int64_t t = timeAt(x);
    QString s = QString("%1 ms").arg(static_cast<double>(t) * 1e-6, 0, 'f', 3);
    if (!m_series.empty()) {
        for (const auto& r : m_series) {
            const int64_t v = valueAt(
                r.points, t, [](const auto& p) { return p.first; },
                +[](const std::pair<int64_t, int64_t>& p) { return p.second; });
            s += QString("\n%1: %2")
                     .arg(QString::fromStdString(r.name), QString::fromStdString(formatBytes(v)));
        }
        return s;
    }
    const int64_t a = valueAt(
        m_points, t, [](const MemoryPoint& p) { return p.timeNs; },
        +[](const MemoryPoint& p) { return p.allocated; });
    const int64_t r = valueAt(
        m_points, t, [](const MemoryPoint& p) { return p.timeNs; },
        +[](const MemoryPoint& p) { return p.reserved; });
    s += QString("\nallocated %1").arg(QString::fromStdString(formatBytes(a)));
    if (r > 0) s += QString("\nreserved %1").arg(QString::fromStdString(formatBytes(r)));
    return s;
}

void MemoryChart::mouseMoveEvent(QMouseEvent* e) {
    const QString s = readoutAt(e->position().x());
    if (s.isEmpty())
        QToolTip::hideText();
    else
        QToolTip::showText(e->globalPosition().toPoint(), s, this);
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
    int64_t seriesPeak = 0;
    for (const auto& r : m_series)
        for (const auto& pt : r.points)
            seriesPeak = std::max(seriesPeak, pt.second);
    const double maxBytes = static_cast<double>(std::max({m_sim->peakReserved, m_sim->peakAllocated,
                                                          m_device, seriesPeak, int64_t{1}})) *
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
    // Everything on the time axis stays in the plot: zoomed in, the data before the view
    // would otherwise be drawn over the label column (and the legend).
    p.setClipRect(QRect(left, 0, w, top + h + 1));
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
    // Every rank's allocated bytes, a step line each, over the first rank's area.
    for (size_t k = 0; k < m_series.size(); ++k) {
        const auto& r = m_series[k];
        if (r.points.empty()) continue;
        QPainterPath line;
        line.moveTo(x(r.points.front().first), y(static_cast<double>(r.points.front().second)));
        for (const auto& [ts, v] : r.points) {
            line.lineTo(x(ts), line.currentPosition().y());
            line.lineTo(x(ts), y(static_cast<double>(v)));
        }
        line.lineTo(x(m_end), line.currentPosition().y());
        p.setPen(QPen(kRankColors[k % std::size(kRankColors)], 1.3));
        p.drawPath(line);
    }
    // The bytes axis: ticks at a quarter, half and three quarters of the scale, labelled
    // inside the plot (the label column holds the peak).
    p.setPen(QColor(0x50, 0x50, 0x50));
    for (int q = 1; q <= 3; ++q) {
        const double b = maxBytes * q / 4.0;
        const double yy = y(b);
        p.drawLine(QPointF(left, yy), QPointF(left + 4, yy));
        const QString label = QString::fromStdString(formatBytes(static_cast<int64_t>(b)));
        const QFontMetrics fm(font());
        const QRectF box(left + 6, yy - fm.height() / 2.0, fm.horizontalAdvance(label) + 4,
                         fm.height());
        p.fillRect(box, QColor(255, 255, 255, 190));  // readable over the areas
        p.drawText(box, Qt::AlignCenter, label);
    }
    // The peak of allocated memory, marked where it first occurs.
    auto peakIt = std::max_element(
        pts.begin(), pts.end(),
        [](const MemoryPoint& a, const MemoryPoint& b) { return a.allocated < b.allocated; });
    p.setPen(QPen(Qt::black, 1));
    const QPointF peak(x(peakIt->timeNs), y(static_cast<double>(peakIt->allocated)));
    p.drawEllipse(peak, 3, 3);
    p.setClipping(false);
    p.setPen(palette().text().color());
    p.drawText(QRect(4, top, left - 8, h), Qt::AlignLeft | Qt::AlignTop,
               QString("memory\npeak %1\nreserved %2")
                   .arg(QString::fromStdString(formatBytes(m_sim->peakAllocated)),
                        QString::fromStdString(formatBytes(m_sim->peakReserved))));
    int lx = left + 4;
    if (!m_series.empty()) {
        for (size_t k = 0; k < m_series.size(); ++k) {
            const QString name = QString::fromStdString(m_series[k].name);
            p.fillRect(QRect(lx, height() - 10, 10, 3), kRankColors[k % std::size(kRankColors)]);
            p.drawText(QPoint(lx + 13, height() - 5), name);
            lx += 22 + QFontMetrics(font()).horizontalAdvance(name);
        }
    }
    if (measured) {
        p.fillRect(QRect(lx, height() - 14, 10, 10), QColor(0x4a, 0x78, 0xb0));
        p.drawText(QPoint(lx + 13, height() - 5),
                   m_series.empty()
                       ? QString("allocated (measured: the allocator's total, no categories)")
                       : QString("allocated, %1 (measured: the allocator's total)")
                             .arg(QString::fromStdString(m_series.front().name)));
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
