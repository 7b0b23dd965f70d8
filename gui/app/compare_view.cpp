// SPDX-License-Identifier: Apache-2.0
#include "gui/app/compare_view.h"

#include <QComboBox>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>

#include <algorithm>
#include <cmath>
#include <set>

#include "gui/timeline/step_stats.h"
#include "gui/timeline/timeline_widget.h"
#include "plans/core/strings.h"

namespace shardscope::gui {

namespace {

QTableWidgetItem* cell(const QString& text, bool right = true) {
    auto* it = new QTableWidgetItem(text);
    it->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
    if (right) it->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    return it;
}

QString ms(double ns) {
    return QString::number(ns * 1e-6, 'f', 3);
}

QString signedMs(double ns) {
    return (ns > 0 ? "+" : "") + QString::number(ns * 1e-6, 'f', 3);
}

QString change(double a, double b) {
    if (a == 0) return b == 0 ? QString("0%") : QString("n/a");
    const double c = 100.0 * (b - a) / std::abs(a);
    return (c > 0 ? "+" : "") + QString::number(c, 'f', 1) + "%";
}

}  // namespace

CompareView::CompareView(QWidget* parent) : QWidget(parent) {
    m_a = new QComboBox;
    m_b = new QComboBox;
    for (QComboBox* c : {m_a, m_b}) {
        c->setSizeAdjustPolicy(QComboBox::AdjustToContents);
        connect(c, &QComboBox::currentIndexChanged, this, [this] { refresh(); });
    }
    auto* pick = new QHBoxLayout;
    pick->addWidget(new QLabel("<b>A</b>"));
    pick->addWidget(m_a);
    pick->addSpacing(16);
    pick->addWidget(new QLabel("<b>B</b>"));
    pick->addWidget(m_b);
    pick->addStretch(1);
    m_hint = new QLabel(
        "Open a model, plan and cluster (a simulated step), edit the what-if settings, or open "
        "traces (e.g. from shardscope run --trace): each becomes a choice for A and B.");
    m_hint->setWordWrap(true);

    m_labelA = new QLabel;
    m_labelB = new QLabel;
    m_timelineA = new TimelineWidget;
    m_timelineB = new TimelineWidget;
    // One time axis: either timeline's zoom and pan moves the other.
    connect(m_timelineA, &TimelineWidget::viewportChanged, m_timelineB,
            &TimelineWidget::setViewport);
    connect(m_timelineB, &TimelineWidget::viewportChanged, m_timelineA,
            &TimelineWidget::setViewport);
    auto* timelines = new QWidget;
    auto* tl = new QVBoxLayout(timelines);
    tl->setContentsMargins(0, 0, 0, 0);
    tl->addWidget(m_labelA);
    tl->addWidget(m_timelineA, 1);
    tl->addWidget(m_labelB);
    tl->addWidget(m_timelineB, 1);

    m_table = new QTableWidget(0, 5);
    m_table->setHorizontalHeaderLabels({"", "A", "B", "B - A", "change"});
    m_units = new QTableWidget(0, 4);
    m_units->setHorizontalHeaderLabels(
        {"unit", "exposed comm A (ms)", "exposed comm B (ms)", "B - A (ms)"});
    for (QTableWidget* t : {m_table, m_units}) {
        t->verticalHeader()->hide();
        t->setEditTriggers(QAbstractItemView::NoEditTriggers);
        t->horizontalHeader()->setStretchLastSection(true);
        t->setAlternatingRowColors(true);
    }
    auto* tables = new QSplitter(Qt::Vertical);
    tables->addWidget(m_table);
    tables->addWidget(m_units);

    auto* split = new QSplitter;
    split->addWidget(timelines);
    split->addWidget(tables);
    split->setStretchFactor(0, 3);
    split->setStretchFactor(1, 2);
    tables->setMinimumWidth(520);

    auto* l = new QVBoxLayout(this);
    l->addLayout(pick);
    l->addWidget(m_hint);
    l->addWidget(split, 1);
}

void CompareView::setSources(std::vector<CompareSource> sources) {
    const QString a = m_a->currentText(), b = m_b->currentText();
    m_sources = std::move(sources);
    for (QComboBox* c : {m_a, m_b}) {
        const QSignalBlocker block(c);
        c->clear();
        for (const auto& s : m_sources)
            c->addItem(s.name);
    }
    // A keeps what it showed; B too unless it showed the same as A or is gone: then the
    // first other source (a new what-if step or trace is what the user wants to compare).
    const QSignalBlocker blockA(m_a), blockB(m_b);
    const int ia = m_a->findText(a);
    m_a->setCurrentIndex(ia >= 0 ? ia : 0);
    int ib = m_b->findText(b);
    if (ib < 0 || ib == m_a->currentIndex()) {
        ib = -1;
        for (int i = 0; i < m_b->count() && ib < 0; ++i)
            if (i != m_a->currentIndex()) ib = i;
    }
    m_b->setCurrentIndex(ib >= 0 ? ib : m_a->currentIndex());
    if (isVisible())
        refresh();
    else
        m_stale = true;
}

void CompareView::showEvent(QShowEvent* e) {
    QWidget::showEvent(e);
    if (m_stale) refresh();
}

void CompareView::refresh() {
    m_stale = false;
    const int ia = m_a->currentIndex(), ib = m_b->currentIndex();
    const CompareSource* sa = ia >= 0 ? &m_sources[static_cast<size_t>(ia)] : nullptr;
    const CompareSource* sb = ib >= 0 ? &m_sources[static_cast<size_t>(ib)] : nullptr;
    m_hint->setVisible(m_sources.size() < 2);
    m_labelA->setText(sa ? "<b>A</b> " + sa->name.toHtmlEscaped() : QString());
    m_labelB->setText(sb ? "<b>B</b> " + sb->name.toHtmlEscaped() : QString());
    // The same two sources again (a plan edit or what-if re-simulated one of them, a trace
    // stays as it was): the shared zoom stays. Other sources: one axis fitted to the longer.
    const QString shown = (sa ? sa->name : QString()) + "\n" + (sb ? sb->name : QString());
    const bool same = shown == m_shownNames;
    m_shownNames = shown;
    const Viewport keep = m_timelineA->viewport();
    m_timelineA->setData(sa ? sa->timeline : nullptr, same);
    m_timelineB->setData(sb ? sb->timeline : nullptr, same);
    const int64_t end = std::max(sa && sa->timeline ? sa->timeline->endNs : 0,
                                 sb && sb->timeline ? sb->timeline->endNs : 0);
    if (same && keep.startNs < end) {
        m_timelineA->setViewport(keep.startNs, keep.endNs);
        m_timelineB->setViewport(keep.startNs, keep.endNs);
    } else {
        m_timelineA->setViewport(0, std::max<int64_t>(end, 1));
        m_timelineB->setViewport(0, std::max<int64_t>(end, 1));
    }

    m_table->setRowCount(0);
    m_units->setRowCount(0);
    if (!sa || !sb || !sa->timeline || !sb->timeline) return;
    const StepStats a = stepStats(*sa->timeline), b = stepStats(*sb->timeline);
    struct Row {
        QString name;
        double a, b;
        bool bytes;
    };
    const std::vector<Row> rows = {
        {a.steps > 1 || b.steps > 1 ? "step time (mean of measured steps)" : "step time",
         double(a.stepNs), double(b.stepNs), false},
        {"compute", double(a.total.computeNs), double(b.total.computeNs), false},
        {"communication", double(a.total.commNs), double(b.total.commNs), false},
        {"exposed communication", double(a.total.exposedCommNs), double(b.total.exposedCommNs),
         false},
        {"overlap (% of communication)", a.total.overlapPercent(), b.total.overlapPercent(), false},
        {"peak allocated", sa->memory ? double(sa->memory->peakAllocated) : -1,
         sb->memory ? double(sb->memory->peakAllocated) : -1, true},
        // A CPU run's trace has no caching allocator, hence no reserved bytes.
        {"peak reserved",
         sa->memory && sa->memory->peakReserved > 0 ? double(sa->memory->peakReserved) : -1,
         sb->memory && sb->memory->peakReserved > 0 ? double(sb->memory->peakReserved) : -1, true},
    };
    for (const Row& r : rows) {
        const int i = m_table->rowCount();
        m_table->insertRow(i);
        m_table->setItem(i, 0, cell(r.name, false));
        const bool percent = r.name.startsWith("overlap");
        auto fmt = [&](double v) {
            if (v < 0) return QString("-");
            if (r.bytes) return QString::fromStdString(formatBytes(static_cast<int64_t>(v)));
            return percent ? QString::number(v, 'f', 1) + "%" : ms(v) + " ms";
        };
        m_table->setItem(i, 1, cell(fmt(r.a)));
        m_table->setItem(i, 2, cell(fmt(r.b)));
        const bool both = r.a >= 0 && r.b >= 0;
        QString diff = "-";
        if (both)
            diff =
                r.bytes
                    ? QString::fromStdString((r.b >= r.a ? "+" : "-") +
                                             formatBytes(static_cast<int64_t>(std::abs(r.b - r.a))))
                : percent ? QString::number(r.b - r.a, 'f', 1) + " pts"
                          : signedMs(r.b - r.a) + " ms";
        m_table->setItem(i, 3, cell(diff));
        m_table->setItem(i, 4, cell(both && !percent ? change(r.a, r.b) : QString("-")));
    }
    m_table->resizeColumnsToContents();

    std::set<std::string> names;
    for (const auto* m : {&a.exposedCommByUnit, &b.exposedCommByUnit})
        for (const auto& [u, _] : *m)
            names.insert(u);
    std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> units;
    for (const auto& u : names) {
        const auto ea = a.exposedCommByUnit.count(u) ? a.exposedCommByUnit.at(u) : 0;
        const auto eb = b.exposedCommByUnit.count(u) ? b.exposedCommByUnit.at(u) : 0;
        units.push_back({u, {ea, eb}});
    }
    std::stable_sort(units.begin(), units.end(), [](const auto& x, const auto& y) {
        return std::abs(x.second.second - x.second.first) >
               std::abs(y.second.second - y.second.first);
    });
    for (const auto& [u, e] : units) {
        const int i = m_units->rowCount();
        m_units->insertRow(i);
        m_units->setItem(i, 0, cell(QString::fromStdString(u), false));
        m_units->setItem(i, 1, cell(ms(double(e.first))));
        m_units->setItem(i, 2, cell(ms(double(e.second))));
        m_units->setItem(i, 3, cell(signedMs(double(e.second - e.first))));
    }
    m_units->resizeColumnsToContents();
}

}  // namespace shardscope::gui
