// SPDX-License-Identifier: Apache-2.0
#include "gui/timeline/timeline_widget.h"

#include "gui/timeline/step_stats.h"

#include <QCursor>
#include <QKeyEvent>
#include <QMouseEvent>
#include <QPainter>
#include <QPen>
#include <QToolTip>
#include <QWheelEvent>

#include <algorithm>
#include <cmath>
#include <map>
#include <unordered_map>

#include "plans/core/intervals.h"

namespace shardscope::gui {

namespace {
// A line from `from` to `to` with a filled head of `size` px at `to` (the painter's pen and
// brush).
void drawArrow(QPainter& p, QPointF from, QPointF to, double size) {
    p.drawLine(from, to);
    const QPointF d = to - from;
    const double len = std::max(1.0, std::hypot(d.x(), d.y()));
    const QPointF u(d.x() / len, d.y() / len), n(-u.y(), u.x());
    const QPointF head[3] = {to, to - size * u + size / 2 * n, to - size * u - size / 2 * n};
    p.drawPolygon(head, 3);
}

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

void markExposedCommunication(TimelineData& d) {
    d.exposed.clear();
    const auto isComm = [](EventKind k) {
        return k == EventKind::AllGather || k == EventKind::ReduceScatter ||
               k == EventKind::AllReduce;
    };
    std::map<std::string, std::vector<Interval>> compute;  // per rank group
    for (const auto& r : d.rows)
        if (!r.host)
            for (const auto& e : r.events)
                if (e.kind == EventKind::Compute) compute[r.group].push_back({e.start, e.end});
    std::map<std::string, std::vector<Interval>> busy;
    for (auto& [g, v] : compute)
        busy[g] = mergeIntervals(std::move(v));
    for (const auto& r : d.rows) {
        if (r.host) continue;
        const std::vector<Interval>& u = busy[r.group];
        for (const auto& e : r.events) {
            if (!isComm(e.kind) || e.op < 0 || e.end <= e.start) continue;
            // [e.start, e.end) minus the union: the gaps between the compute it overlaps.
            std::vector<std::pair<int64_t, int64_t>> gaps;
            int64_t at = e.start;
            auto it =
                std::lower_bound(u.begin(), u.end(), e.start,
                                 [](const Interval& iv, int64_t t) { return iv.second <= t; });
            for (; it != u.end() && it->first < e.end; ++it) {
                if (it->first > at) gaps.push_back({at, it->first});
                at = std::max(at, it->second);
            }
            if (at < e.end) gaps.push_back({at, e.end});
            if (!gaps.empty()) d.exposed[e.op] = std::move(gaps);
        }
    }
}

TimelineWidget::TimelineWidget(QWidget* parent) : QWidget(parent) {
    setMouseTracking(true);
    setFocusPolicy(Qt::StrongFocus);
    setMinimumHeight(80);
}

QSize TimelineWidget::sizeHint() const {
    const int rows = m_visible.empty() ? 4 : static_cast<int>(m_visible.size());
    return {800, kTop + 4 + rows * kRowHeight};
}

QString elideLabel(const QString& label, const QFontMetrics& fm, int widthPx) {
    return fm.elidedText(label, Qt::ElideMiddle, widthPx);
}

void TimelineWidget::setData(std::shared_ptr<const TimelineData> data, bool keepView) {
    const bool had = m_data != nullptr;
    m_data = std::move(data);
    m_selectedOp = -1;
    m_range.reset();
    m_matches.clear();  // their indices were into the old data
    m_match = -1;
    // Pinned tracks stay pinned across a re-simulation of the same step (same rows), not
    // across new data.
    if (!keepView || !m_data) m_pinned.clear();
    std::erase_if(m_pinned,
                  [&](int r) { return !m_data || static_cast<size_t>(r) >= m_data->rows.size(); });
    rebuildVisible();
    if (keepView && had && m_data && m_start < m_data->endNs && m_end > 0) {
        update();
        emit viewportChanged(m_start, m_end);  // the memory chart follows the new data
        return;
    }
    fit();
}

void TimelineWidget::rebuildVisible() {
    m_visible.clear();
    m_headerGroup.clear();
    if (m_data) {
        std::vector<std::string> groups;
        for (const auto& r : m_data->rows)
            if (std::find(groups.begin(), groups.end(), r.group) == groups.end())
                groups.push_back(r.group);
        const bool headers = groups.size() > 1;
        for (const auto& g : groups) {
            if (headers) {
                m_visible.push_back(nullptr);
                m_headerGroup.push_back(g);
                if (m_collapsed.count(g)) continue;
            }
            for (const auto& r : m_data->rows)
                if (r.group == g && (!r.host || m_showFlows)) {
                    m_visible.push_back(&r);
                    m_headerGroup.emplace_back();
                }
        }
    }
    m_visibleIndex.assign(m_data ? m_data->rows.size() : 0, -1);
    for (size_t v = 0; v < m_visible.size(); ++v)
        if (m_visible[v])
            m_visibleIndex[static_cast<size_t>(m_visible[v] - m_data->rows.data())] =
                static_cast<int>(v);
    setMinimumHeight(kTop + pinBand() + 6 +
                     std::max<int>(1, static_cast<int>(m_visible.size())) * kRowHeight);
    updateGeometry();
    update();
}

void TimelineWidget::setShowFlows(bool on) {
    m_showFlows = on;
    rebuildVisible();
}

void TimelineWidget::setCollapsed(const std::string& group, bool collapsed) {
    if (collapsed)
        m_collapsed.insert(group);
    else
        m_collapsed.erase(group);
    rebuildVisible();
}

std::string TimelineWidget::groupOfHeader(int visibleRow) const {
    if (visibleRow < 0 || static_cast<size_t>(visibleRow) >= m_visible.size() ||
        m_visible[static_cast<size_t>(visibleRow)] != nullptr)
        return {};
    return m_headerGroup[static_cast<size_t>(visibleRow)];
}

void TimelineWidget::fit() {
    setViewport(0, m_data && m_data->endNs > 0 ? m_data->endNs : 1);
    emit viewportChanged(m_start, m_end);  // even when unchanged: new data under it
}

void TimelineWidget::setViewport(int64_t startNs, int64_t endNs) {
    endNs = std::max(endNs, startNs + 1);
    if (startNs == m_start && endNs == m_end) return;
    m_start = startNs;
    m_end = endNs;
    update();
    emit viewportChanged(m_start, m_end);
}

Viewport TimelineWidget::viewport() const {
    Viewport v;
    v.startNs = m_start;
    v.endNs = m_end;
    v.widthPx = std::max(1, width() - kLabelWidth);
    return v;
}

void TimelineWidget::paintEvent(QPaintEvent*) {
    QPainter p(this);
    p.fillRect(rect(), palette().base());
    if (!m_data) {
        p.drawText(rect(), Qt::AlignCenter,
                   "Open a model, a plan and a cluster to see the simulated step");
        return;
    }
    const Viewport v = viewport();
    // The rows start below the axis and the pinned band (drawn last, where the tracks are
    // scrolled to, so that both stay on screen).
    const int top = kTop + pinBand();
    // Virtualised: only the rows the scroll area shows are laid out and drawn (thousands of
    // rank x stream rows cost what the screen shows, not what the trace holds).
    const QRect shown = visibleRegion().boundingRect();
    const auto firstShown = static_cast<size_t>(std::clamp<int64_t>(
        (shown.top() - top) / kRowHeight, 0, static_cast<int64_t>(m_visible.size())));
    const auto endShown = static_cast<size_t>(std::clamp<int64_t>(
        (shown.bottom() - top) / kRowHeight + 1, 0, static_cast<int64_t>(m_visible.size())));
    {
        std::vector<const TimelineRow*> rows(m_visible.size(), nullptr);
        for (size_t r = firstShown; r < endShown; ++r)
            rows[r] = m_visible[r];
        m_drawList = buildDrawList(rows, v);
    }
    for (size_t r = firstShown; r < endShown; ++r) {
        const int y = top + static_cast<int>(r) * kRowHeight;
        if (!m_visible[r]) {  // a rank's header: click to collapse or expand its rows
            const std::string& g = m_headerGroup[r];
            p.fillRect(QRect(0, y, width(), kRowHeight), palette().alternateBase());
            p.setPen(palette().text().color());
            QFont bold = font();
            bold.setBold(true);
            p.setFont(bold);
            p.drawText(QRect(4, y, kLabelWidth - 8, kRowHeight), Qt::AlignVCenter | Qt::AlignLeft,
                       QString::fromUtf8(m_collapsed.count(g) ? "\u25b8 " : "\u25be ") +
                           QString::fromStdString(g));
            p.setFont(font());
            continue;
        }
        p.setPen(palette().text().color());
        p.drawText(QRect(14, y, kLabelWidth - 18, kRowHeight), Qt::AlignVCenter | Qt::AlignLeft,
                   m_visible[r]->depth > 0  // a nested level of the track above: "└ 2"
                       ? QString::fromUtf8("\u2514 %1").arg(m_visible[r]->depth)
                       : QString::fromStdString(m_visible[r]->name));
        p.setPen(QColor(0xdd, 0xdd, 0xdd));
        p.drawLine(kLabelWidth, y + kRowHeight, width(), y + kRowHeight);
    }
    paintRects(p, m_drawList, top, v);
    m_lastDependencyCount = 0;
    if (m_selectedOp >= 0) {
        if (const auto it = m_data->waits.find(m_selectedOp); it != m_data->waits.end()) {
            // Arrows from the end of each op the selected one waited on to its start.
            struct At {
                int row = -1;
                int64_t start = 0, end = 0;
            };
            std::unordered_map<int32_t, At> at;
            for (int32_t w : it->second)
                at.emplace(w, At{});
            at.emplace(m_selectedOp, At{});
            for (size_t r = 0; r < m_visible.size(); ++r)
                if (m_visible[r])
                    for (const auto& e : m_visible[r]->events)
                        if (const auto a = at.find(e.op); a != at.end())
                            a->second = {static_cast<int>(r), e.start, e.end};
            const At& to = at[m_selectedOp];
            if (to.row >= 0) {
                p.setRenderHint(QPainter::Antialiasing);
                const QColor c(0xc0, 0x30, 0x30);
                p.setPen(QPen(c, 1.5));
                p.setBrush(c);
                const QPointF end(kLabelWidth + timeToPixel(to.start, v),
                                  top + to.row * kRowHeight + kRowHeight / 2.0);
                for (int32_t w : it->second) {
                    const At& from = at[w];
                    if (from.row < 0) continue;
                    const QPointF start(kLabelWidth + timeToPixel(from.end, v),
                                        top + from.row * kRowHeight + kRowHeight / 2.0);
                    drawArrow(p, start, end, 7);
                    ++m_lastDependencyCount;
                }
                p.setRenderHint(QPainter::Antialiasing, false);
                p.setBrush(Qt::NoBrush);
            }
        }
    }
    m_lastFlowCount = 0;
    if (m_showFlows && !m_data->flows.empty()) {
        // Arrows from launch to kernel; one per pixel column of their start at most.
        p.setRenderHint(QPainter::Antialiasing);
        p.setPen(QPen(QColor(0x60, 0x60, 0x60, 170), 1));
        p.setBrush(QColor(0x60, 0x60, 0x60, 170));
        int lastX = -1;
        for (const auto& f : m_data->flows) {
            if (f.toTime < m_start || f.fromTime > m_end) continue;
            const int a = m_visibleIndex[static_cast<size_t>(f.fromRow)];
            const int b = m_visibleIndex[static_cast<size_t>(f.toRow)];
            if (a < 0 || b < 0) continue;
            const double x0 = kLabelWidth + timeToPixel(f.fromTime, v);
            const double x1 = kLabelWidth + timeToPixel(f.toTime, v);
            if (static_cast<int>(x0) == lastX) continue;
            lastX = static_cast<int>(x0);
            const QPointF from(x0, top + a * kRowHeight + kRowHeight / 2.0);
            const QPointF to(x1, top + b * kRowHeight + kRowHeight / 2.0);
            drawArrow(p, from, to, 6);
            ++m_lastFlowCount;
        }
        p.setRenderHint(QPainter::Antialiasing, false);
    }
    paintPinnedAndAxis(p, v);
    if (m_range) {
        const double x0 = kLabelWidth + std::max(0.0, timeToPixel(m_range->first, v));
        const double x1 =
            kLabelWidth + std::min<double>(v.widthPx, timeToPixel(m_range->second, v));
        if (x1 > x0) {
            const QRectF band(x0, top, x1 - x0, height() - top);
            p.fillRect(band, QColor(0x30, 0x60, 0xc0, 40));
            p.setPen(QColor(0x30, 0x60, 0xc0));
            p.drawLine(QPointF(x0, top), QPointF(x0, height()));
            p.drawLine(QPointF(x1, top), QPointF(x1, height()));
            p.drawText(
                QPointF(x0 + 3, top + 12),
                QString("%1 ms").arg(static_cast<double>(m_range->second - m_range->first) * 1e-6,
                                     0, 'f', 3));
        }
    }
}

void TimelineWidget::paintRects(QPainter& p, const std::vector<DrawRect>& rects, int y0,
                                const Viewport& v) const {
    for (const DrawRect& d : rects) {
        const QRectF box(kLabelWidth + d.x0, y0 + d.row * kRowHeight + 3, d.x1 - d.x0,
                         kRowHeight - 6);
        p.fillRect(box, d.folded > 1 ? colorOf(d.kind).darker(130) : colorOf(d.kind));
        if (d.op >= 0 && d.folded == 1) {
            // The collective's exposed parts: hatched, so that prefetching and overlap show
            // as the hatching shrinks.
            if (const auto it = m_data->exposed.find(d.op); it != m_data->exposed.end())
                for (const auto& [a, b] : it->second) {
                    const double xa = std::max(d.x0, timeToPixel(a, v));
                    const double xb = std::min(d.x1, timeToPixel(b, v));
                    if (xb > xa)
                        p.fillRect(QRectF(kLabelWidth + xa, box.top(), xb - xa, box.height()),
                                   QBrush(QColor(0x80, 0x10, 0x10, 200), Qt::BDiagPattern));
                }
        }
        if (!d.label.empty()) {
            p.setPen(Qt::white);
            p.drawText(box.adjusted(3, 0, -2, 0), Qt::AlignVCenter | Qt::AlignLeft,
                       elideLabel(QString::fromStdString(d.label), QFontMetrics(font()),
                                  static_cast<int>(box.width()) - 5));
        }
        if (m_selectedOp >= 0 && d.op == m_selectedOp) {
            p.setPen(QPen(palette().text().color(), 2));
            p.drawRect(box.adjusted(-1, -1, 1, 1));
        }
    }
}

int TimelineWidget::stickyTop() const {
    // Inside a scroll area: the first visible pixel row of the widget.
    return std::max(0, visibleRegion().boundingRect().top());
}

void TimelineWidget::setPinned(int dataRow, bool pinned) {
    const auto it = std::find(m_pinned.begin(), m_pinned.end(), dataRow);
    if (pinned && it == m_pinned.end() && m_data && dataRow >= 0 &&
        static_cast<size_t>(dataRow) < m_data->rows.size())
        m_pinned.push_back(dataRow);
    if (!pinned && it != m_pinned.end()) m_pinned.erase(it);
    rebuildVisible();
}

int TimelineWidget::pinnedAt(double y) const {
    const double y0 = stickyTop() + kTop;
    if (y < y0 || y >= y0 + pinBand()) return -1;
    return static_cast<int>((y - y0) / kRowHeight);
}

void TimelineWidget::paintPinnedAndAxis(QPainter& p, const Viewport& v) {
    const int st = stickyTop();
    if (!m_pinned.empty()) {
        std::vector<const TimelineRow*> rows;
        for (int r : m_pinned)
            rows.push_back(&m_data->rows[static_cast<size_t>(r)]);
        m_pinnedDrawList = buildDrawList(rows, v);
        const int y0 = st + kTop;
        p.fillRect(QRect(0, y0, width(), pinBand()), palette().alternateBase());
        for (size_t k = 0; k < rows.size(); ++k) {
            const int y = y0 + static_cast<int>(k) * kRowHeight;
            p.setPen(palette().text().color());
            const TimelineRow& r = *rows[k];
            p.drawText(QRect(4, y, kLabelWidth - 8, kRowHeight), Qt::AlignVCenter | Qt::AlignLeft,
                       QString::fromUtf8("\u2191 ") + QString::fromStdString(trackName(r)));
        }
        paintRects(p, m_pinnedDrawList, y0, v);
        p.setPen(QPen(palette().mid().color(), 2));
        p.drawLine(0, y0 + pinBand(), width(), y0 + pinBand());
    } else {
        m_pinnedDrawList.clear();
    }
    // Time axis, where the tracks are scrolled to: a tick every power-of-ten-ish step.
    p.fillRect(QRect(0, st, width(), kTop), palette().base());
    const double span = static_cast<double>(m_end - m_start);
    const double rawStep = span / 8.0;
    const double mag = std::pow(10.0, std::floor(std::log10(std::max(rawStep, 1.0))));
    const double step = rawStep / mag < 2 ? 2 * mag : rawStep / mag < 5 ? 5 * mag : 10 * mag;
    p.setPen(palette().text().color());
    for (double t = std::ceil(m_start / step) * step; t < m_end; t += step) {
        const double x = kLabelWidth + timeToPixel(static_cast<int64_t>(t), v);
        p.drawLine(QPointF(x, st + kTop - 4), QPointF(x, st + kTop));
        p.drawText(QPointF(x + 2, st + kTop - 6),
                   QString::number(t * 1e-6, 'f', std::abs(step) * 1e-6 < 1 ? 3 : 1) + " ms");
    }
}

void TimelineWidget::zoom(double factor, double atX) {
    const Viewport v = viewport();
    const int64_t pivot = pixelToTime(atX - kLabelWidth, v);
    const double newSpan = std::max(1000.0, static_cast<double>(m_end - m_start) * factor);
    const double frac = static_cast<double>(pivot - m_start) / static_cast<double>(m_end - m_start);
    const int64_t start = pivot - static_cast<int64_t>(frac * newSpan);
    setViewport(start, start + static_cast<int64_t>(newSpan));
}

void TimelineWidget::pan(double px) {
    const Viewport v = viewport();
    const int64_t dt = pixelToTime(px, v) - v.startNs;
    setViewport(m_start + dt, m_end + dt);
}

void TimelineWidget::wheelEvent(QWheelEvent* e) {
    // A sideways scroll (trackpad, tilt wheel) or Shift+wheel pans, a tenth of the view per
    // notch; the wheel zooms at the cursor. A sideways scroll used to zoom out.
    const QPoint a = e->angleDelta();
    const bool sideways = a.x() != 0 && std::abs(a.x()) >= std::abs(a.y());
    if (sideways || (e->modifiers() & Qt::ShiftModifier)) {
        const int notches = sideways ? a.x() : a.y();
        const auto dt = static_cast<int64_t>(std::llround(
            -static_cast<double>(notches) / 120.0 * 0.1 * static_cast<double>(m_end - m_start)));
        setViewport(m_start + dt, m_end + dt);
        e->accept();
        return;
    }
    if (a.y() == 0) {
        e->ignore();
        return;
    }
    zoom(a.y() > 0 ? 0.8 : 1.25, e->position().x());
    e->accept();
}

int TimelineWidget::rowAt(double y) const {
    // The axis and the pinned band sit over whatever rows are scrolled under them.
    if (y < stickyTop() + kTop + pinBand()) return -1;
    const int row = (static_cast<int>(y) - kTop - pinBand()) / kRowHeight;
    return row < static_cast<int>(m_visible.size()) ? row : -1;
}

const DrawRect* TimelineWidget::rectAt(double x, double y) const {
    if (const int k = pinnedAt(y); k >= 0) {
        for (const DrawRect& d : m_pinnedDrawList)
            if (d.row == k && x - kLabelWidth >= d.x0 && x - kLabelWidth <= d.x1) return &d;
        return nullptr;
    }
    const int row = rowAt(y);
    for (const DrawRect& d : m_drawList)
        if (d.row == row && x - kLabelWidth >= d.x0 && x - kLabelWidth <= d.x1) return &d;
    return nullptr;
}

void TimelineWidget::selectRange(int64_t startNs, int64_t endNs) {
    if (endNs < startNs) std::swap(startNs, endNs);
    m_range = std::make_pair(startNs, endNs);
    update();
    emit rangeSelected(startNs, endNs);
}

void TimelineWidget::selectOp(int32_t op) {
    m_selectedOp = op;
    update();
    emit eventSelected(op);
}

int TimelineWidget::setSearch(const std::string& query) {
    m_matches.clear();
    m_match = -1;
    if (m_data)
        for (const EventRef& e : findEvents(*m_data, query))
            m_matches.push_back({e.row, e.index});
    return searchMatches();
}

int TimelineWidget::findNext(bool backward) {
    if (m_matches.empty() || !m_data) return -1;
    const int n = searchMatches();
    if (m_match < 0) {
        // From the view: the first match starting in it (the last before its end, backward).
        const auto startOf = [&](int k) {
            const auto& [row, i] = m_matches[static_cast<size_t>(k)];
            return m_data->rows[static_cast<size_t>(row)].events[static_cast<size_t>(i)].start;
        };
        int k = 0;
        while (k < n && startOf(k) < m_start)
            ++k;
        if (backward) {
            k = 0;
            while (k < n && startOf(k) < m_end)
                ++k;
            --k;
        }
        m_match = ((k % n) + n) % n;
    } else {
        m_match = ((m_match + (backward ? -1 : 1)) % n + n) % n;
    }
    const auto& [row, i] = m_matches[static_cast<size_t>(m_match)];
    const TimelineRow& r = m_data->rows[static_cast<size_t>(row)];
    const TimelineEvent& e = r.events[static_cast<size_t>(i)];
    if (!r.group.empty() && isCollapsed(r.group)) setCollapsed(r.group, false);
    const int64_t span = m_end - m_start, dur = e.end - e.start;
    if (dur > span * 8 / 10) {
        setViewport(e.start - dur / 10, e.end + dur / 10);
    } else {
        const int64_t mid = e.start + dur / 2;
        setViewport(mid - span / 2, mid - span / 2 + span);
    }
    selectOp(e.op);
    return m_match;
}

void TimelineWidget::clearSelection() {
    m_range.reset();
    m_selectedOp = -1;
    update();
    emit selectionCleared();
}

void TimelineWidget::mousePressEvent(QMouseEvent* e) {
    const double x = e->position().x();
    const int row = rowAt(e->position().y());
    if (x < kLabelWidth && row >= 0 && !m_visible[static_cast<size_t>(row)]) {
        const std::string g = groupOfHeader(row);
        setCollapsed(g, !isCollapsed(g));
        return;
    }
    if (x < kLabelWidth && e->button() == Qt::LeftButton) {  // a track's name: pin or unpin it
        if (const int k = pinnedAt(e->position().y()); k >= 0) {
            setPinned(m_pinned[static_cast<size_t>(k)], false);
            return;
        }
        if (row >= 0) {
            const int dataRow =
                static_cast<int>(m_visible[static_cast<size_t>(row)] - m_data->rows.data());
            setPinned(dataRow,
                      std::find(m_pinned.begin(), m_pinned.end(), dataRow) == m_pinned.end());
            return;
        }
    }
    if (e->modifiers() & Qt::ShiftModifier && x >= kLabelWidth) {
        m_selectingRange = true;
        m_rangeAnchor = pixelToTime(x - kLabelWidth, viewport());
        m_range = std::make_pair(m_rangeAnchor, m_rangeAnchor);
        update();
        return;
    }
    m_dragX = static_cast<int>(x);
    m_pressX = m_dragX;
}

void TimelineWidget::mouseReleaseEvent(QMouseEvent* e) {
    const double x = e->position().x();
    if (m_selectingRange) {
        m_selectingRange = false;
        const int64_t t = pixelToTime(std::max(0.0, x - kLabelWidth), viewport());
        if (t == m_rangeAnchor)
            clearSelection();
        else
            selectRange(m_rangeAnchor, t);
        return;
    }
    const bool click = m_pressX >= 0 && std::abs(x - m_pressX) < 4;
    m_dragX = m_pressX = -1;
    if (!click) return;
    const DrawRect* d = rectAt(x, e->position().y());
    if (d && d->folded == 1 && d->op >= 0) {
        selectOp(d->op);
    } else if (d && d->folded > 1) {
        // A folded block: zoom to it, so its ops can be told apart.
        const Viewport v = viewport();
        setViewport(pixelToTime(d->x0 - 10, v), pixelToTime(d->x1 + 10, v));
    } else if (m_selectedOp >= 0 || m_range) {
        clearSelection();
    }
}

void TimelineWidget::mouseMoveEvent(QMouseEvent* e) {
    const double x = e->position().x();
    if (m_selectingRange) {
        m_range =
            std::minmax(m_rangeAnchor, pixelToTime(std::max(0.0, x - kLabelWidth), viewport()));
        update();
        return;
    }
    if (e->buttons() & Qt::LeftButton && m_dragX >= 0) {
        pan(m_dragX - x);
        m_dragX = static_cast<int>(x);
        return;
    }
    if (const QString tip = tooltipAt(e->position()); !tip.isEmpty()) {
        QToolTip::showText(e->globalPosition().toPoint(), tip, this);
        return;
    }
    QToolTip::hideText();
}

QString TimelineWidget::tooltipAt(QPointF pos) const {
    const int pinnedRow = pinnedAt(pos.y());
    const int row = rowAt(pos.y());
    if (m_data && pos.x() < kLabelWidth) {
        if (pinnedRow >= 0) return "Pinned track: click to unpin it";
        if (row >= 0 && m_visible[static_cast<size_t>(row)])
            return "Click to pin this track: it then stays under the time axis while the tracks "
                   "scroll";
        return {};
    }
    const DrawRect* d = rectAt(pos.x(), pos.y());
    const TimelineRow* rp =
        pinnedRow >= 0
            ? &m_data->rows[static_cast<size_t>(m_pinned[static_cast<size_t>(pinnedRow)])]
        : row >= 0 ? m_visible[static_cast<size_t>(row)]
                   : nullptr;
    if (!d || !m_data || !rp) return {};
    if (d->folded > 1)
        return QString("%1 short ops folded; click or zoom in to see them").arg(d->folded);
    const TimelineRow& r = *rp;
    for (const auto& ev : r.events) {
        if (ev.op == d->op) {
            QString exposed;
            if (const auto it = m_data->exposed.find(ev.op); it != m_data->exposed.end()) {
                int64_t ns = 0;
                for (const auto& [a, b] : it->second)
                    ns += b - a;
                exposed = QString("\nexposed %1 ms (hatched: no compute of the rank ran)")
                              .arg(static_cast<double>(ns) * 1e-6, 0, 'f', 3);
            }
            return QString("%1\n%2%3\nstart %4 ms, duration %5 ms%6  (click for details)")
                .arg(QString::fromStdString(ev.label))
                .arg(QString::fromStdString(r.name))
                .arg(r.group.empty() ? QString() : " \u00b7 " + QString::fromStdString(r.group))
                .arg(static_cast<double>(ev.start) * 1e-6, 0, 'f', 3)
                .arg(static_cast<double>(ev.end - ev.start) * 1e-6, 0, 'f', 3)
                .arg(exposed);
        }
    }
    return {};
}

void TimelineWidget::fitSelection() {
    if (m_range && m_range->second > m_range->first) {
        const int64_t pad = (m_range->second - m_range->first) / 20;
        setViewport(m_range->first - pad, m_range->second + pad);
        return;
    }
    if (m_selectedOp >= 0 && m_data)
        for (const auto& row : m_data->rows)
            for (const auto& ev : row.events)
                if (ev.op == m_selectedOp) {
                    const int64_t pad = std::max<int64_t>(1000, (ev.end - ev.start) / 5);
                    setViewport(ev.start - pad, ev.end + pad);
                    return;
                }
    fit();
}

void TimelineWidget::keyPressEvent(QKeyEvent* e) {
    const double mid = kLabelWidth + viewport().widthPx / 2.0;
    switch (e->key()) {
        case Qt::Key_W:
        case Qt::Key_S: {
            // At the mouse when it is over the events (Perfetto's WASD), else the middle.
            const QPoint at = mapFromGlobal(QCursor::pos());
            const bool over = rect().contains(at) && at.x() > kLabelWidth;
            zoom(e->key() == Qt::Key_W ? 0.8 : 1.25, over ? at.x() : mid);
            break;
        }
        case Qt::Key_A:
            pan(-viewport().widthPx / 10.0);
            break;
        case Qt::Key_D:
            pan(viewport().widthPx / 10.0);
            break;
        case Qt::Key_F:
            fitSelection();
            break;
        case Qt::Key_Escape:
            clearSelection();
            break;
        default:
            QWidget::keyPressEvent(e);
    }
}

}  // namespace shardscope::gui
