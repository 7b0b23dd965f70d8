// SPDX-License-Identifier: Apache-2.0
#include "gui/app/recommend_view.h"

#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QComboBox>
#include <QFileDialog>
#include <QFutureWatcher>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineSeries>
#include <QMessageBox>
#include <QProgressBar>
#include <QPushButton>
#include <QScatterSeries>
#include <QSpinBox>
#include <QSplitter>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QValueAxis>
#include <QtConcurrent/QtConcurrent>

#include <cmath>

#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "plans/plan/export.h"
#include "plans/plan/resolve.h"

namespace shardscope::gui {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

QTableWidgetItem* cell(const QString& text, bool right = true) {
    auto* it = new QTableWidgetItem(text);
    it->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable);
    if (right) it->setTextAlignment(Qt::AlignRight | Qt::AlignVCenter);
    return it;
}

QPointF pointOf(const Candidate& c) {
    return {static_cast<double>(c.sim.stepNs) * 1e-6,
            static_cast<double>(c.sim.peakReserved) / kGiB};
}

}  // namespace

RecommendView::RecommendView(QWidget* parent) : QWidget(parent) {
    QHBoxLayout* bar = buildSearchBar();
    buildChart();
    QWidget* right = buildPlanList();
    auto* split = new QSplitter;
    split->addWidget(m_chart);
    split->addWidget(right);
    split->setStretchFactor(0, 1);
    split->setStretchFactor(1, 1);
    split->setSizes({600, 600});

    auto* l = new QVBoxLayout(this);
    l->addLayout(bar);
    l->addWidget(m_status);
    l->addWidget(split, 1);
}

// The search's settings, its buttons and progress.
QHBoxLayout* RecommendView::buildSearchBar() {
    m_seq = new QSpinBox;
    m_seq->setRange(16, 1 << 20);
    m_seq->setValue(8192);
    m_batch = new QSpinBox;
    m_batch->setRange(0, 1 << 24);
    m_batch->setSpecialValueText("4Mi tokens");
    m_fsdp1 = new QCheckBox("only what FSDP1 (and Lightning's FSDPStrategy) express");
    m_search = new QPushButton("Search");
    m_stop = new QPushButton("Cancel");
    m_stop->setEnabled(false);
    m_progress = new QProgressBar;
    m_progress->setRange(0, 1);
    m_progress->setValue(0);
    m_status = new QLabel("Open a model and a cluster, then Search.");
    m_status->setWordWrap(true);
    auto* bar = new QHBoxLayout;
    bar->addWidget(new QLabel("sequence length"));
    bar->addWidget(m_seq);
    bar->addWidget(new QLabel("global batch (sequences)"));
    bar->addWidget(m_batch);
    bar->addWidget(m_fsdp1);
    bar->addWidget(m_search);
    bar->addWidget(m_stop);
    bar->addWidget(m_progress, 1);
    connect(m_search, &QPushButton::clicked, this, &RecommendView::start);
    connect(m_stop, &QPushButton::clicked, this, &RecommendView::cancel);
    return bar;
}

// The Pareto chart; a click selects the nearest plan of the front.
void RecommendView::buildChart() {
    auto* chart = new QChart;
    chart->setTitle("Pareto front: step time against peak reserved memory");
    m_pareto = new QScatterSeries;
    m_pareto->setName("Pareto front: fits");
    m_pareto->setMarkerSize(9);
    m_pareto->setColor(QColor(0x3a, 0xa8, 0x5a));
    m_others = new QScatterSeries;
    m_others->setName("does not fit");
    m_others->setMarkerSize(9);
    m_others->setColor(QColor(0xe0, 0x8a, 0x2c));
    m_baseline = new QScatterSeries;
    m_baseline->setName("default plan (each block a unit, reshard True)");
    m_baseline->setMarkerShape(QScatterSeries::MarkerShapeRectangle);
    m_baseline->setMarkerSize(11);
    m_baseline->setColor(QColor(0x80, 0x80, 0x80));
    m_chosen = new QScatterSeries;
    m_chosen->setName("selected");
    m_chosen->setMarkerSize(15);
    m_chosen->setColor(QColor(0xd0, 0x30, 0x30));
    auto* budget = new QLineSeries;
    budget->setName("memory budget (device minus headroom)");
    budget->setPen(QPen(QColor(0xc0, 0x20, 0x20), 1, Qt::DashLine));
    for (auto* s :
         std::initializer_list<QAbstractSeries*>{budget, m_pareto, m_others, m_baseline, m_chosen})
        chart->addSeries(s);
    auto* x = new QValueAxis;
    x->setTitleText("step time (ms)");
    auto* y = new QValueAxis;
    y->setTitleText("peak reserved (GiB)");
    chart->addAxis(x, Qt::AlignBottom);
    chart->addAxis(y, Qt::AlignLeft);
    for (auto* s : chart->series()) {
        s->attachAxis(x);
        s->attachAxis(y);
    }
    m_chart = new QChartView(chart);
    m_chart->setRenderHint(QPainter::Antialiasing);
    m_chart->setMinimumHeight(260);
    chart->legend()->setAlignment(Qt::AlignBottom);
    auto onClick = [this](const QPointF& p) {
        if (!m_result) return;
        int best = -1;
        double bestD = 1e300;
        const auto& front = m_result->pareto;
        // Nearest in the plot's own scale: each axis normalised by its range.
        double xr = 1, yr = 1;
        if (!front.empty()) {
            xr = std::max(1e-9, pointOf(front.back()).x() - pointOf(front.front()).x());
            yr = std::max(1e-9, std::abs(pointOf(front.front()).y() - pointOf(front.back()).y()));
        }
        for (size_t i = 0; i < front.size(); ++i) {
            const QPointF q = pointOf(front[i]);
            const double d = std::pow((q.x() - p.x()) / xr, 2) + std::pow((q.y() - p.y()) / yr, 2);
            if (d < bestD) {
                bestD = d;
                best = static_cast<int>(i);
            }
        }
        select(best);
    };
    connect(m_pareto, &QScatterSeries::clicked, this, onClick);
    connect(m_others, &QScatterSeries::clicked, this, onClick);
}

// The plans found, the selected one's details, and loading or exporting it.
QWidget* RecommendView::buildPlanList() {
    m_table = new QTableWidget(0, 6);
    m_table->setHorizontalHeaderLabels(
        {"step time", "tokens/s", "MFU", "peak reserved", "fits", "plan"});
    m_table->verticalHeader()->hide();
    m_table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->horizontalHeader()->setStretchLastSection(true);
    connect(m_table, &QTableWidget::currentCellChanged, this, [this](int row, int, int, int) {
        if (row != m_selected) select(row);
    });
    connect(m_table, &QTableWidget::cellDoubleClicked, this, [this](int, int) { m_load->click(); });

    m_details = new QLabel;
    m_details->setWordWrap(true);
    m_details->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_load = new QPushButton("Load in the Plan tab");
    m_format = new QComboBox;
    m_format->addItems({"shardscope", "fsdp2", "fsdp1", "lightning", "lightning-fsdp1"});
    m_export = new QPushButton("Export...");
    for (QPushButton* b : {m_load, m_export})
        b->setEnabled(false);
    connect(m_load, &QPushButton::clicked, this, [this] {
        if (!m_result || m_selected < 0) return;
        emit loadPlanRequested(
            std::make_shared<const Plan>(m_result->pareto[static_cast<size_t>(m_selected)].plan));
    });
    connect(m_export, &QPushButton::clicked, this, [this] {
        const auto fmt = parseExportFormat(m_format->currentText().toStdString());
        if (!fmt) return;
        const QString path = QFileDialog::getSaveFileName(
            this, "Export the selected plan", "plan." + m_format->currentText() + ".json",
            "JSON (*.json)");
        if (path.isEmpty()) return;
        const QString err = exportSelected(path, *fmt);
        if (!err.isEmpty()) QMessageBox::warning(this, "Export failed", err);
    });
    auto* actions = new QHBoxLayout;
    actions->addWidget(m_load);
    actions->addStretch(1);
    actions->addWidget(new QLabel("format"));
    actions->addWidget(m_format);
    actions->addWidget(m_export);

    auto* right = new QWidget;
    auto* rl = new QVBoxLayout(right);
    rl->setContentsMargins(0, 0, 0, 0);
    rl->addWidget(m_table, 1);
    rl->addWidget(m_details);
    rl->addLayout(actions);
    return right;
}

RecommendView::~RecommendView() {
    // Stop a running search and wait for it: its thread must not outlive the window.
    if (m_cancel) m_cancel->store(true);
    m_future.waitForFinished();
}

void RecommendView::setInputs(std::shared_ptr<const ModelGraph> model,
                              std::shared_ptr<const ClusterSpec> cluster, int64_t seqLen) {
    m_model = std::move(model);
    m_cluster = std::move(cluster);
    if (seqLen > 0) m_seq->setValue(static_cast<int>(std::min<int64_t>(seqLen, 1 << 20)));
    m_search->setEnabled(m_model && m_cluster && !m_running);
    if (!m_running)
        m_status->setText(m_model && m_cluster
                              ? QString("Search plans for %1 on %2 (%3 devices).")
                                    .arg(QString::fromStdString(m_model->name).toHtmlEscaped(),
                                         QString::fromStdString(m_cluster->name).toHtmlEscaped())
                                    .arg(m_cluster->worldSize())
                              : QString("Open a model and a cluster, then Search."));
}

void RecommendView::start() {
    if (m_running || !m_model || !m_cluster) return;
    m_running = true;
    m_cancel = std::make_shared<std::atomic<bool>>(false);
    m_search->setEnabled(false);
    m_stop->setEnabled(true);
    m_progress->setRange(0, 0);
    m_status->setText("Searching...");
    SearchOptions o;
    o.seqLen = m_seq->value();
    o.globalBatch = m_batch->value();
    o.fsdp1Compatible = m_fsdp1->isChecked();
    o.cancel = m_cancel.get();
    // Progress arrives on the search's threads: posted to this object's thread, at most one
    // update per percent.
    auto lastPercent = std::make_shared<std::atomic<int>>(-1);
    QPointer<RecommendView> self(this);
    o.progress = [self, lastPercent](size_t done, size_t total) {
        const int pct = total > 0 ? static_cast<int>(100 * done / total) : 0;
        if (lastPercent->exchange(pct) == pct || !self) return;
        QMetaObject::invokeMethod(
            self,
            [self, done, total] {
                if (!self || !self->m_running) return;
                self->m_progress->setRange(0, static_cast<int>(std::min<size_t>(total, INT32_MAX)));
                self->m_progress->setValue(static_cast<int>(std::min(done, total)));
                self->m_status->setText(
                    QString("Searching: %1 of %2 plans...").arg(done).arg(total));
            },
            Qt::QueuedConnection);
    };
    auto model = m_model;
    auto cluster = m_cluster;
    auto cancelFlag = m_cancel;  // kept alive with the search
    auto* watcher = new QFutureWatcher<std::shared_ptr<SearchResult>>(this);
    connect(watcher, &QFutureWatcher<std::shared_ptr<SearchResult>>::finished, this,
            [this, watcher] {
                m_result = watcher->result();
                watcher->deleteLater();
                m_running = false;
                m_search->setEnabled(m_model && m_cluster);
                m_stop->setEnabled(false);
                m_progress->setRange(0, 1);
                m_progress->setValue(1);
                showResult();
                emit finished();
            });
    m_future = QtConcurrent::run([model, cluster, o, cancelFlag] {
        return std::make_shared<SearchResult>(searchPlans(*model, *cluster, o));
    });
    watcher->setFuture(m_future);
}

void RecommendView::cancel() {
    if (m_cancel) m_cancel->store(true);
    m_status->setText("Cancelling: keeping the best plans found so far...");
}

void RecommendView::showResult() {
    m_selected = -1;
    m_table->setRowCount(0);
    for (auto* s : {m_pareto, m_others, m_baseline, m_chosen})
        s->clear();
    auto* chart = m_chart->chart();
    auto* budget = qobject_cast<QLineSeries*>(chart->series().front());
    budget->clear();
    if (!m_result) return;
    const SearchResult& r = *m_result;
    QString head = QString("%1 plans evaluated, %2 simulated%3. ")
                       .arg(r.evaluated)
                       .arg(r.simulated)
                       .arg(r.cancelled ? " (cancelled: the best so far)" : "");
    if (r.best)
        head += QString(
                    "Fastest that fits: %1 ms per step, peak reserved %2 (the default plan: %3 "
                    "ms%4).")
                    .arg(static_cast<double>(r.best->sim.stepNs) * 1e-6, 0, 'f', 1)
                    .arg(QString::fromStdString(formatBytes(r.best->sim.peakReserved)))
                    .arg(static_cast<double>(r.baseline.sim.stepNs) * 1e-6, 0, 'f', 1)
                    .arg(r.baseline.fits ? "" : ", does not fit");
    else
        head += "No plan fits the device memory; the front shows the plans needing least.";
    m_status->setText(head);
    double xmin = 1e300, xmax = 0, ymax = static_cast<double>(r.memoryBudget) / kGiB;
    auto extend = [&](const Candidate& c) {
        const QPointF p = pointOf(c);
        xmin = std::min(xmin, p.x());
        xmax = std::max(xmax, p.x());
        ymax = std::max(ymax, p.y());
    };
    for (const auto& c : r.pareto) {
        (c.fits ? m_pareto : m_others)->append(pointOf(c));
        extend(c);
        const int i = m_table->rowCount();
        m_table->insertRow(i);
        m_table->setItem(i, 0, cell(QString("%1 ms").arg(c.sim.stepNs * 1e-6, 0, 'f', 1)));
        m_table->setItem(i, 1, cell(QString::number(c.sim.tokensPerS, 'f', 0)));
        m_table->setItem(i, 2, cell(QString("%1%").arg(100 * c.sim.mfu, 0, 'f', 1)));
        m_table->setItem(i, 3, cell(QString::fromStdString(formatBytes(c.sim.peakReserved))));
        m_table->setItem(i, 4, cell(c.fits ? "yes" : "no"));
        m_table->setItem(i, 5, cell(QString::fromStdString(c.summary), false));
    }
    if (r.baseline.sim.stepNs > 0) {
        m_baseline->append(pointOf(r.baseline));
        extend(r.baseline);
    }
    if (xmax <= 0) return;
    const double pad = std::max(1e-3, (xmax - xmin) * 0.08);
    auto* x = qobject_cast<QValueAxis*>(chart->axes(Qt::Horizontal).front());
    auto* y = qobject_cast<QValueAxis*>(chart->axes(Qt::Vertical).front());
    x->setRange(std::max(0.0, xmin - pad), xmax + pad);
    y->setRange(0, ymax * 1.1);
    budget->append(std::max(0.0, xmin - pad), static_cast<double>(r.memoryBudget) / kGiB);
    budget->append(xmax + pad, static_cast<double>(r.memoryBudget) / kGiB);
    m_table->resizeColumnsToContents();
    // Start on the recommendation: the fastest plan that fits.
    int start = 0;
    if (r.best)
        for (size_t i = 0; i < r.pareto.size(); ++i)
            if (r.pareto[i].sim.stepNs == r.best->sim.stepNs && r.pareto[i].fits) {
                start = static_cast<int>(i);
                break;
            }
    select(r.pareto.empty() ? -1 : start);
}

void RecommendView::select(int paretoIndex) {
    if (!m_result || paretoIndex < 0 ||
        static_cast<size_t>(paretoIndex) >= m_result->pareto.size()) {
        m_selected = -1;
        m_chosen->clear();
        m_details->clear();
        m_load->setEnabled(false);
        m_export->setEnabled(false);
        return;
    }
    m_selected = paretoIndex;
    const Candidate& c = m_result->pareto[static_cast<size_t>(paretoIndex)];
    m_chosen->clear();
    m_chosen->append(pointOf(c));
    {
        const QSignalBlocker block(m_table);
        m_table->selectRow(paretoIndex);
    }
    m_details->setText(
        QString("<b>Selected</b>: %1<br>step %2 ms, %3 tokens/s, MFU %4%, peak allocated %5, "
                "reserved %6, exposed communication %7 ms%8")
            .arg(QString::fromStdString(c.summary).toHtmlEscaped())
            .arg(c.sim.stepNs * 1e-6, 0, 'f', 1)
            .arg(c.sim.tokensPerS, 0, 'f', 0)
            .arg(100 * c.sim.mfu, 0, 'f', 1)
            .arg(QString::fromStdString(formatBytes(c.sim.peakAllocated)),
                 QString::fromStdString(formatBytes(c.sim.peakReserved)))
            .arg(c.sim.exposedCommNs * 1e-6, 0, 'f', 1)
            .arg(c.fits ? "" : " <b style='color:#c02020'>(does not fit)</b>"));
    m_load->setEnabled(true);
    m_export->setEnabled(true);
}

QString RecommendView::exportSelected(const QString& path, ExportFormat format) const {
    if (!m_result || m_selected < 0) return "no plan selected";
    const Candidate& c = m_result->pareto[static_cast<size_t>(m_selected)];
    const ResolvedPlan r = resolvePlan(*m_model, c.plan, m_cluster.get(), "recommended");
    if (r.hasErrors())
        return "the plan does not resolve: " +
               QString::fromStdString(r.problems.front().toString());
    const Status s = writeFileAtomically(path.toStdString(), exportPlan(r, format).dump(2) + "\n");
    return s ? QString() : QString::fromStdString(s.error());
}

}  // namespace shardscope::gui
