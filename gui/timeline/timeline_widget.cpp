// SPDX-License-Identifier: Apache-2.0
#include "gui/timeline/timeline_widget.h"

#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>

#include <algorithm>
#include <cmath>

namespace shardscope::gui {

namespace {
QColor colorOf(EventKind k) {
    switch (k) {
        case EventKind::Compute:
            return QColor(0x4c, 0x8b, 0xd6);
        case EventKind::AllGather:
            return QColor(0x3a, 0xa8, 0x5a);
        case EventKind::ReduceScatter:
            return QColor(0xe0, 0x8a, 0x2c);
        case EventKind::AllReduce:
            return QColor(0xb0, 0x4c, 0xc9);
        case EventKind::Copy:
            return QColor(0x9a, 0x9a, 0x9a);
        case EventKind::Other:
            return QColor(0x70, 0x70, 0x70);
    }
    return Qt::gray;
}
}  // namespace

TimelineWidget::TimelineWidget(QWidget* parent) : QWidget(parent) {
    setMouseTracking(true);
    setFocusPolicy(Qt::StrongFocus);
    setMinimumHeight(80);
}

QSize TimelineWidget::sizeHint() const {
    const int rows = m_data ? static_cast<int>(m_data->rows.size()) : 4;
    return {800, 24 + rows * kRowHeight};
}

void TimelineWidget::setData(std::shared_ptr<const TimelineData> data) {
    m_data = std::move(data);
    setMinimumHeight(24 + (m_data ? static_cast<int>(m_data->rows.size()) : 1) * kRowHeight + 6);
    fit();
    updateGeometry();
}

void TimelineWidget::fit() {
    m_start = 0;
    m_end = m_data && m_data->endNs > 0 ? m_data->endNs : 1;
    update();
}

Viewport TimelineWidget::viewport() const {
    Viewport v;
    v.startNs = m_start;
    v.endNs = m_end;
    v.widthPx = std::max(1, width() - kLabelWidth);
    return v;
}

void TimelineWidget::paintEvent(QPaintEvent*) {
    emit viewportChanged(m_start, m_end);
    QPainter p(this);
    p.fillRect(rect(), palette().base());
    if (!m_data) {
        p.drawText(rect(), Qt::AlignCenter,
                   "Open a model, a plan and a cluster to see the simulated step");
        return;
    }
    const Viewport v = viewport();
    m_drawList = buildDrawList(m_data->rows, v);
    const int top = 20;
    // Time axis: a tick every power-of-ten-ish step.
    const double span = static_cast<double>(m_end - m_start);
    const double rawStep = span / 8.0;
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(rawStep, 1.0))));
    const double step = rawStep / mag < 2 ? 2 * mag : rawStep / mag < 5 ? 5 * mag : 10 * mag;
    p.setPen(palette().text().color());
    for (double t = std::ceil(m_start / step) * step; t < m_end; t += step) {
        const double x = kLabelWidth + timeToPixel(static_cast<int64_t>(t), v);
        p.drawLine(QPointF(x, top - 4), QPointF(x, top));
        p.drawText(QPointF(x + 2, top - 6),
                   QString::number(t * 1e-6, 'f', t * 1e-6 < 10 ? 2 : 0) + " ms");
    }
    for (size_t r = 0; r < m_data->rows.size(); ++r) {
        const int y = top + static_cast<int>(r) * kRowHeight;
        p.setPen(palette().text().color());
        p.drawText(QRect(4, y, kLabelWidth - 8, kRowHeight), Qt::AlignVCenter | Qt::AlignLeft,
                   QString::fromStdString(m_data->rows[r].name));
        p.setPen(QColor(0xdd, 0xdd, 0xdd));
        p.drawLine(kLabelWidth, y + kRowHeight, width(), y + kRowHeight);
    }
    for (const DrawRect& d : m_drawList) {
        const QRectF box(kLabelWidth + d.x0, top + d.row * kRowHeight + 3, d.x1 - d.x0,
                         kRowHeight - 6);
        p.fillRect(box, d.folded > 1 ? colorOf(d.kind).darker(130) : colorOf(d.kind));
        if (!d.label.empty()) {
            p.setPen(Qt::white);
            p.drawText(
                box.adjusted(3, 0, -2, 0), Qt::AlignVCenter | Qt::AlignLeft,
                QFontMetrics(font()).elidedText(QString::fromStdString(d.label), Qt::ElideRight,
                                                static_cast<int>(box.width()) - 5));
        }
    }
}

void TimelineWidget::zoom(double factor, double atX) {
    const Viewport v = viewport();
    const int64_t pivot = pixelToTime(atX - kLabelWidth, v);
    const double newSpan = std::max(1000.0, static_cast<double>(m_end - m_start) * factor);
    const double frac = static_cast<double>(pivot - m_start) / static_cast<double>(m_end - m_start);
    m_start = pivot - static_cast<int64_t>(frac * newSpan);
    m_end = m_start + static_cast<int64_t>(newSpan);
    update();
}

void TimelineWidget::pan(double px) {
    const Viewport v = viewport();
    const int64_t dt = pixelToTime(px, v) - v.startNs;
    m_start += dt;
    m_end += dt;
    update();
}

void TimelineWidget::wheelEvent(QWheelEvent* e) {
    zoom(e->angleDelta().y() > 0 ? 0.8 : 1.25, e->position().x());
}

void TimelineWidget::mousePressEvent(QMouseEvent* e) {
    m_dragX = static_cast<int>(e->position().x());
}

void TimelineWidget::mouseMoveEvent(QMouseEvent* e) {
    const double x = e->position().x();
    if (e->buttons() & Qt::LeftButton && m_dragX >= 0) {
        pan(m_dragX - x);
        m_dragX = static_cast<int>(x);
        return;
    }
    const int row = (static_cast<int>(e->position().y()) - 20) / kRowHeight;
    for (const DrawRect& d : m_drawList)
        if (d.row == row && x - kLabelWidth >= d.x0 && x - kLabelWidth <= d.x1 && m_data) {
            QString tip;
            if (d.folded > 1) {
                tip = QString("%1 short ops folded; zoom in to see them").arg(d.folded);
            } else {
                for (const auto& ev : m_data->rows[static_cast<size_t>(row)].events)
                    if (ev.op == d.op) {
                        tip = QString("%1\n%2 ms  (op %3)")
                                  .arg(QString::fromStdString(ev.label))
                                  .arg(static_cast<double>(ev.end - ev.start) * 1e-6, 0, 'f', 3)
                                  .arg(ev.op);
                        break;
                    }
            }
            QToolTip::showText(e->globalPosition().toPoint(), tip, this);
            return;
        }
    QToolTip::hideText();
}

void TimelineWidget::keyPressEvent(QKeyEvent* e) {
    const double mid = kLabelWidth + viewport().widthPx / 2.0;
    switch (e->key()) {
        case Qt::Key_W:
            zoom(0.8, mid);
            break;
        case Qt::Key_S:
            zoom(1.25, mid);
            break;
        case Qt::Key_A:
            pan(-viewport().widthPx / 10.0);
            break;
        case Qt::Key_D:
            pan(viewport().widthPx / 10.0);
            break;
        case Qt::Key_F:
            fit();
            break;
        default:
            QWidget::keyPressEvent(e);
    }
}

}  // namespace shardscope::gui
