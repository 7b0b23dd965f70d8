// SPDX-License-Identifier: Apache-2.0
#include "gui/app/main_window.h"

#include <algorithm>

#include <QCheckBox>
#include <QComboBox>
#include <QDragEnterEvent>
#include <QFileDialog>
#include <QFileInfo>
#include <QFutureWatcher>
#include <QGuiApplication>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMenuBar>
#include <QMessageBox>
#include <QShortcut>

#include <QMimeData>
#include <QPlainTextEdit>
#include <QPointer>
#include <QProgressBar>
#include <QPushButton>
#include <QScrollBar>
#include <QSettings>
#include <QSignalBlocker>
#include <QSortFilterProxyModel>
#include <QSpinBox>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QTableView>
#include <QTreeView>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrent>
#include <cstdio>

#include <tuple>

#include "gui/app/compare_view.h"
#include "gui/app/recommend_view.h"
#include "gui/models/module_tree_model.h"
#include "gui/models/unit_table_model.h"
#include "gui/timeline/memory_chart.h"
#include "gui/timeline/step_stats.h"
#include "gui/timeline/timeline_widget.h"
#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "plans/plan/plan_json.h"

namespace shardscope::gui {

namespace {
const char* const kDetailsHint =
    "Click an op for its details (unit, phase, bytes, achieved bandwidth, what it waited "
    "on); shift-drag over the timeline for the busy time, exposed communication and "
    "overlap of a range; Esc clears.";
}  // namespace

QString MainWindow::describeRange(int64_t t0, int64_t t1) const {
    const auto& d = m_timeline->data();
    if (!d) return {};
    QString s = QString("Range %1 - %2 ms (%3 ms)\n")
                    .arg(static_cast<double>(t0) * 1e-6, 0, 'f', 3)
                    .arg(static_cast<double>(t1) * 1e-6, 0, 'f', 3)
                    .arg(static_cast<double>(t1 - t0) * 1e-6, 0, 'f', 3);
    for (const RangeStats& r : rangeStats(*d, t0, t1)) {
        if (!r.group.empty()) s += "\n" + QString::fromStdString(r.group) + "\n";
        auto pct = [&](int64_t ns) {
            return QString("%1 ms (%2% of the range)")
                .arg(static_cast<double>(ns) * 1e-6, 0, 'f', 3)
                .arg(t1 > t0 ? 100.0 * static_cast<double>(ns) / static_cast<double>(t1 - t0) : 0,
                     0, 'f', 1);
        };
        s += "  busy: " + pct(r.busyNs) + "\n";
        s += "  compute: " + pct(r.computeNs) + "\n";
        s += "  communication: " + pct(r.commNs) + "\n";
        s += "  exposed communication: " + pct(r.exposedCommNs) + "\n";
        s += QString("  overlap: %1% of the communication under compute\n")
                 .arg(r.overlapPercent(), 0, 'f', 1);
        s += QString("  %1 ops\n").arg(r.events);
    }
    // The selection by op name (Perfetto's slice aggregation): every rank together.
    const auto names = statsByName(*d, t0, t1);
    if (!names.empty()) {
        s += QString("\nBy name (%1 names; in range, count, mean, max):\n").arg(names.size());
        const size_t shown = std::min<size_t>(names.size(), 20);
        for (size_t i = 0; i < shown; ++i) {
            const NameStats& n = names[i];
            QString name = QString::fromStdString(n.name);
            if (name.size() > 48) name = name.left(22) + "\u2026" + name.right(25);
            s += QString("  %1  %2 ms  x%3  %4 ms  %5 ms\n")
                     .arg(name)
                     .arg(static_cast<double>(n.inRangeNs) * 1e-6, 0, 'f', 3)
                     .arg(n.count)
                     .arg(static_cast<double>(n.meanNs()) * 1e-6, 0, 'f', 3)
                     .arg(static_cast<double>(n.maxNs) * 1e-6, 0, 'f', 3);
        }
        if (names.size() > shown)
            s += QString("  ... and %1 more names\n").arg(names.size() - shown);
    }
    return s;
}

// The tracks area asks for up to 8 rows (a rank's 8 streams) before it scrolls, which a
// 900-pixel screen has room for beside the plan editor and the memory chart.
void MainWindow::sizeTimelineArea() {
    constexpr int kRowsShown = 8;
    m_timelineScroll->setMinimumHeight(
        std::min(m_timeline->minimumHeight(),
                 TimelineWidget::kTop + 6 + kRowsShown * TimelineWidget::kRowHeight));
}

void MainWindow::searchChanged() {
    const QString q = m_search->text();
    const int n = m_timeline->setSearch(q.toStdString());
    m_searchLabel->setText(q.isEmpty() ? QString()
                           : n == 0    ? QString("no match")
                                       : QString("%1 match%2").arg(n).arg(n == 1 ? "" : "es"));
}

void MainWindow::findNext(bool backward) {
    const int n = m_timeline->searchMatches();
    if (n == 0) return;
    const int k = m_timeline->findNext(backward);
    m_searchLabel->setText(QString("%1 of %2").arg(k + 1).arg(n));
}

QString MainWindow::savePlan(const QString& path) {
    if (!m_doc.plan) return "no plan is open";
    const Status st =
        writeFileAtomically(path.toStdString(), planToJson(*m_doc.plan).dump(2) + "\n");
    if (!st) return QString::fromStdString(st.error());
    m_doc.planPath = path;
    m_doc.planEdited = false;
    statusBar()->showMessage("Saved " + path);
    return {};
}

void MainWindow::applyWrapPolicy() {
    if (!m_doc.plan) return;
    WrapPolicySpec w;
    const QString arg = m_wrapArg->text().trimmed();
    QString why;
    switch (m_wrapKind->currentIndex()) {
        case 0:
            w.kind = WrapPolicySpec::Kind::None;
            break;
        case 1: {
            bool ok = false;
            const qlonglong n = arg.isEmpty() ? 100000000 : arg.toLongLong(&ok);
            if (!arg.isEmpty() && (!ok || n < 1))
                why = "min_num_params: expected a positive integer";
            w.kind = WrapPolicySpec::Kind::Size;
            w.minNumParams = n;
            break;
        }
        case 2:
            w.kind = WrapPolicySpec::Kind::ModuleClass;
            for (const QString& c : arg.split(',', Qt::SkipEmptyParts))
                w.classes.push_back(c.trimmed().toStdString());
            if (w.classes.empty())
                why = "by module class: name at least one class, e.g. LlamaDecoderLayer";
            break;
        case 3:
            w.kind = WrapPolicySpec::Kind::NamePattern;
            for (const QString& c : arg.split(',', Qt::SkipEmptyParts))
                w.patterns.push_back(c.trimmed().toStdString());
            if (w.patterns.empty())
                why = "by name pattern: give a regular expression, e.g. layers\\.\\d+$";
            break;
    }
    if (!why.isEmpty()) {
        showEditError(why);
        return;
    }
    editPlan([w](Document& d, QString* why) { return d.setWrapPolicy(w, why); });
}

void MainWindow::editPlan(std::function<bool(Document&, QString*)> edit) {
    // On a copy of the document (its parts are immutable snapshots) off the GUI thread; the
    // result replaces the document only if no later edit was made meanwhile.
    const int generation = ++m_editGeneration;
    ++m_editsRunning;
    const auto base = m_doc.plan;
    auto* watcher = new QFutureWatcher<std::tuple<bool, QString, Document>>(this);
    connect(watcher, &QFutureWatcher<std::tuple<bool, QString, Document>>::finished, this,
            [this, watcher, generation, base] {
                auto [ok, why, doc] = watcher->result();
                watcher->deleteLater();
                --m_editsRunning;
                // Superseded by a later edit, or the plan was replaced (a file opened).
                if (generation != m_editGeneration || m_doc.plan != base) return;
                if (!ok) {
                    showEditError(why.isEmpty() ? QString("the edit cannot be made") : why);
                    refresh();  // the models show the plan as it is (a refused tick unticks)
                    return;
                }
                // Only what the edit changed: the plan and what follows from it (traces
                // opened meanwhile stay).
                m_doc.plan = doc.plan;
                m_doc.planEdited = doc.planEdited;
                m_doc.resolved = doc.resolved;
                m_doc.timeline = doc.timeline;
                m_doc.simulation = doc.simulation;
                m_doc.baseTimeline = doc.baseTimeline;
                m_doc.baseSimulation = doc.baseSimulation;
                m_doc.showTrace = false;  // the edited step shows; traces stay in Compare
                m_wrapError->hide();
                refresh();
            });
    watcher->setFuture(QtConcurrent::run([doc = m_doc, edit]() mutable {
        QString why;
        const bool ok = edit(doc, &why);
        return std::make_tuple(ok, why, std::move(doc));
    }));
}

void MainWindow::showEditError(const QString& why) {
    statusBar()->showMessage(why);
    m_wrapError->setText(why);
    m_wrapError->show();
}

void MainWindow::applyPlanWide() {
    auto dtype = [](QComboBox* c) { return c->currentIndex() == 0 ? QString() : c->currentText(); };
    editPlan([mesh = m_mesh->text().trimmed(), p = dtype(m_paramDtype), r = dtype(m_reduceDtype),
              off = m_offload->isChecked()](Document& d, QString* why) {
        return d.setPlanWide(mesh, p, r, off, why);
    });
}

void MainWindow::cancelLoading() {
    if (m_loadCancel) m_loadCancel->store(true);
    statusBar()->showMessage("Cancelling...");
}

void MainWindow::selectOp(int32_t op) {
    m_timeline->selectOp(op);  // its eventSelected fills the details panel
}

void MainWindow::selectRange(int64_t startNs, int64_t endNs) {
    m_timeline->selectRange(startNs, endNs);
}

void MainWindow::showTab(const QString& name) {
    for (int i = 0; i < m_tabs->count(); ++i)
        if (m_tabs->tabText(i).toLower().startsWith(name.toLower())) m_tabs->setCurrentIndex(i);
}

MainWindow::MainWindow(QWidget* parent)
    : QMainWindow(parent), m_tree(new ModuleTreeModel(this)), m_units(new UnitTableModel(this)) {
    setWindowTitle("ShardScope");
    setAcceptDrops(true);
    resize(1280, 760);

    m_treeView = new QTreeView;
    m_treeView->setModel(m_tree);
    m_treeView->setUniformRowHeights(true);
    m_treeView->setAlternatingRowColors(true);

    QWidget* right = buildUnitPanel();
    QWidget* left = buildPlanEditor();
    auto* split = new QSplitter;
    split->addWidget(left);
    split->addWidget(right);
    split->setStretchFactor(0, 1);
    split->setStretchFactor(1, 1);

    QWidget* bottom = buildTimelinePanel();
    buildTabs(split, bottom);
    buildStatusBarAndMenus();
    refresh();
}

// The right of the plan tab: the summary, the units table and the problems list.
QWidget* MainWindow::buildUnitPanel() {
    auto* proxy = new QSortFilterProxyModel(this);
    proxy->setSourceModel(m_units);
    proxy->setSortRole(UnitTableModel::SortRole);
    m_unitView = new QTableView;
    m_unitView->setModel(proxy);
    m_unitView->setSortingEnabled(true);
    m_unitView->sortByColumn(-1, Qt::AscendingOrder);
    m_unitView->verticalHeader()->hide();
    m_unitView->verticalHeader()->setDefaultSectionSize(m_unitView->fontMetrics().height() + 6);
    m_unitView->setAlternatingRowColors(true);
    m_unitView->horizontalHeader()->setStretchLastSection(true);
    m_unitView->setSelectionBehavior(QAbstractItemView::SelectRows);

    m_summary = new QLabel(
        "Open a model (config.json or model JSON), a plan and a cluster: File > Open, or drop "
        "files here.");
    m_summary->setWordWrap(true);
    m_summary->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_problems = new QListWidget;

    auto* right = new QWidget;
    auto* rl = new QVBoxLayout(right);
    rl->setContentsMargins(0, 0, 0, 0);
    rl->addWidget(m_summary);
    auto* rightSplit = new QSplitter(Qt::Vertical);
    rightSplit->addWidget(m_unitView);
    rightSplit->addWidget(m_problems);
    rightSplit->setStretchFactor(0, 4);
    rightSplit->setStretchFactor(1, 1);
    rl->addWidget(rightSplit);

    return right;
}

QWidget* MainWindow::buildPlanEditor() {
    // The left of the plan tab, the plan editor: tick modules in the tree to make them units, or
    // apply a wrap policy; edit a unit's Reshard cell in the table. Each edit resolves and
    // simulates at once.
    m_wrapKind = new QComboBox;
    m_wrapKind->addItems(
        {"no policy", "size-based (min_num_params)", "by module class", "by name pattern"});
    m_wrapArg = new QLineEdit;
    m_wrapArg->setPlaceholderText("100000000 | LlamaDecoderLayer, ... | regex");
    auto* applyWrap = new QPushButton("Apply");
    m_wrapError = new QLabel;
    m_wrapError->setWordWrap(true);
    m_wrapError->setStyleSheet("color: #c02020");
    m_wrapError->hide();
    auto* wrapRow = new QHBoxLayout;
    wrapRow->addWidget(new QLabel("<b>Wrap</b>"));
    wrapRow->addWidget(m_wrapKind);
    wrapRow->addWidget(m_wrapArg, 1);
    wrapRow->addWidget(applyWrap);
    connect(applyWrap, &QPushButton::clicked, this, &MainWindow::applyWrapPolicy);
    connect(m_wrapArg, &QLineEdit::returnPressed, this, &MainWindow::applyWrapPolicy);
    connect(m_tree, &ModuleTreeModel::unitToggleRequested, this, [this](ModuleId m, bool makeUnit) {
        editPlan([m, makeUnit](Document& d, QString* why) {
            return d.setModuleIsUnit(m, makeUnit, why);
        });
    });
    connect(m_units, &UnitTableModel::reshardEditRequested, this,
            [this](int unit, const QString& value) {
                editPlan([unit, value](Document& d, QString* why) {
                    return d.setUnitReshard(static_cast<size_t>(unit), value, why);
                });
            });
    connect(m_units, &UnitTableModel::prefetchEditRequested, this,
            [this](int unit, bool forward, const QString& value) {
                editPlan([unit, forward, value](Document& d, QString* why) {
                    return d.setUnitPrefetch(static_cast<size_t>(unit), forward, value, why);
                });
            });
    connect(m_units, &UnitTableModel::settingEditRequested, this,
            [this](int unit, int column, const QString& value) {
                const auto which =
                    column == UnitTableModel::Checkpointing ? Document::UnitSetting::Checkpointing
                    : column == UnitTableModel::Precision   ? Document::UnitSetting::Precision
                                                            : Document::UnitSetting::Offload;
                editPlan([unit, which, value](Document& d, QString* why) {
                    return d.setUnitSetting(static_cast<size_t>(unit), which, value, why);
                });
            });
    // Plan-wide settings: mesh, mixed precision, offload.
    m_mesh = new QLineEdit;
    m_mesh->setPlaceholderText("all ranks");
    m_mesh->setToolTip("Device mesh: 64 (1D) or 8,8 (replicate, shard: HSDP)");
    m_mesh->setMaximumWidth(90);
    m_paramDtype = new QComboBox;
    m_reduceDtype = new QComboBox;
    for (QComboBox* c : {m_paramDtype, m_reduceDtype})
        c->addItems({"-", "float32", "bfloat16", "float16"});
    m_offload = new QCheckBox("CPU offload");
    auto* applyPlanWide = new QPushButton("Apply");
    auto* planRow = new QHBoxLayout;
    planRow->addWidget(new QLabel("<b>Mesh</b>"));
    planRow->addWidget(m_mesh);
    planRow->addWidget(new QLabel("param"));
    planRow->addWidget(m_paramDtype);
    planRow->addWidget(new QLabel("reduce"));
    planRow->addWidget(m_reduceDtype);
    planRow->addWidget(m_offload);
    planRow->addWidget(applyPlanWide);
    planRow->addStretch(1);
    connect(applyPlanWide, &QPushButton::clicked, this, &MainWindow::applyPlanWide);
    auto* left = new QWidget;
    auto* ll = new QVBoxLayout(left);
    ll->setContentsMargins(0, 0, 0, 0);
    ll->addLayout(wrapRow);
    ll->addLayout(planRow);
    ll->addWidget(m_wrapError);
    ll->addWidget(m_treeView, 1);

    return left;
}

QWidget* MainWindow::buildWhatIfControls() {
    // What if: settings applied on top of the plan, re-simulated at once.
    auto* controls = new QWidget;
    auto* cl = new QHBoxLayout(controls);
    cl->setContentsMargins(0, 0, 0, 0);
    m_reshard = new QComboBox;
    m_reshard->addItems({"as planned", "True", "False", "node size (int)"});
    m_ac = new QComboBox;
    m_ac->addItems({"as planned", "none", "attention", "full", "selective_op"});  // AcMode order
    auto spin = [](int lo, int hi, const QString& special) {
        auto* sb = new QSpinBox;
        sb->setRange(lo, hi);
        sb->setSpecialValueText(special);
        return sb;
    };
    m_fwdPrefetch = spin(0, 3, "implicit");
    m_bwdPrefetch = spin(0, 3, "implicit");
    m_microBatch = spin(0, 64, "as planned");
    cl->addWidget(new QLabel("<b>What if</b> reshard after forward"));
    cl->addWidget(m_reshard);
    cl->addWidget(new QLabel("forward prefetch"));
    cl->addWidget(m_fwdPrefetch);
    cl->addWidget(new QLabel("backward prefetch"));
    cl->addWidget(m_bwdPrefetch);
    cl->addWidget(new QLabel("checkpointing"));
    cl->addWidget(m_ac);
    cl->addWidget(new QLabel("micro-batch"));
    cl->addWidget(m_microBatch);
    cl->addStretch(1);
    m_flows = new QCheckBox("launch \u2192 kernel flows");
    m_flows->setToolTip(
        "Show the host threads' kernel launches and an arrow to each kernel "
        "(PyTorch profiler traces)");
    m_flows->setEnabled(false);
    cl->addWidget(m_flows);
    m_search = new QLineEdit;
    m_search->setPlaceholderText("Search ops (Ctrl+F)");
    m_search->setClearButtonEnabled(true);
    m_search->setToolTip(
        "Ops whose name contains this text. Enter or F3: next; Shift+Enter or "
        "Shift+F3: previous");
    m_search->setMinimumWidth(150);
    m_search->setMaximumWidth(240);
    m_searchLabel = new QLabel;
    cl->addWidget(m_search);
    cl->addWidget(m_searchLabel);
    connect(m_search, &QLineEdit::textChanged, this, [this] { searchChanged(); });
    connect(m_search, &QLineEdit::returnPressed, this,
            [this] { findNext(QGuiApplication::keyboardModifiers().testFlag(Qt::ShiftModifier)); });
    auto* focusSearch = new QShortcut(QKeySequence::Find, this);
    connect(focusSearch, &QShortcut::activated, this, [this] {
        m_search->setFocus();
        m_search->selectAll();
    });
    connect(new QShortcut(QKeySequence::FindNext, this), &QShortcut::activated, this,
            [this] { findNext(false); });
    connect(new QShortcut(QKeySequence::FindPrevious, this), &QShortcut::activated, this,
            [this] { findNext(true); });
    for (QComboBox* b : {m_reshard, m_ac})
        connect(b, &QComboBox::currentIndexChanged, this, [this] { whatIfChanged(); });
    for (QSpinBox* b : {m_fwdPrefetch, m_bwdPrefetch, m_microBatch})
        connect(b, &QSpinBox::valueChanged, this, [this] { whatIfChanged(); });

    return controls;
}

// The simulated step below: one row per stream, the memory chart and the details panel.
QWidget* MainWindow::buildTimelinePanel() {
    m_simSummary = new QLabel;
    m_simSummary->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_timeline = new TimelineWidget;
    QWidget* controls = buildWhatIfControls();
    auto* bottom = new QWidget;
    auto* bl = new QVBoxLayout(bottom);
    bl->setContentsMargins(4, 0, 4, 0);
    bl->addWidget(controls);
    bl->addWidget(m_simSummary);
    auto* charts = new QWidget;
    auto* chl = new QVBoxLayout(charts);
    chl->setContentsMargins(0, 0, 0, 0);
    // The tracks scroll: a multi-rank trace (8 ranks x 8 streams is 72 rows) would otherwise
    // grow the window past the screen and push the memory chart and status bar off it. The
    // wheel keeps zooming (Shift pans); the scroll bar and PageUp/PageDown scroll.
    m_timelineScroll = new QScrollArea;
    m_timelineScroll->setWidget(m_timeline);
    m_timelineScroll->setWidgetResizable(true);
    m_timelineScroll->setFrameShape(QFrame::NoFrame);
    // The time axis and the pinned tracks are drawn where the tracks are scrolled to: a
    // scroll repaints the whole widget (the scroll area would only blit and fill the rest).
    connect(m_timelineScroll->verticalScrollBar(), &QScrollBar::valueChanged, m_timeline,
            [this] { m_timeline->update(); });
    m_timelineScroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
    m_timelineScroll->setMinimumHeight(TimelineWidget::kTop + 4 * TimelineWidget::kRowHeight);
    chl->addWidget(m_timelineScroll, 1);
    m_memory = new MemoryChart;
    chl->addWidget(m_memory);
    // The details panel: the selected op, or the figures of a selected time range.
    m_details = new QPlainTextEdit;
    m_details->setReadOnly(true);
    m_details->setMinimumWidth(240);
    m_details->setPlaceholderText(kDetailsHint);
    auto* timelineSplit = new QSplitter;
    timelineSplit->addWidget(charts);
    timelineSplit->addWidget(m_details);
    timelineSplit->setStretchFactor(0, 4);
    timelineSplit->setStretchFactor(1, 1);
    bl->addWidget(timelineSplit, 1);
    connect(m_timeline, &TimelineWidget::viewportChanged, m_memory, &MemoryChart::setRange);
    connect(m_flows, &QCheckBox::toggled, m_timeline, &TimelineWidget::setShowFlows);
    connect(m_timeline, &TimelineWidget::eventSelected, this, [this](int32_t op) {
        const auto& d = m_timeline->data();
        m_details->setPlainText(d && d->describe ? QString::fromStdString(d->describe(op))
                                                 : QString("op %1").arg(op));
    });
    connect(m_timeline, &TimelineWidget::rangeSelected, this,
            [this](int64_t t0, int64_t t1) { m_details->setPlainText(describeRange(t0, t1)); });
    connect(m_timeline, &TimelineWidget::selectionCleared, m_details, &QPlainTextEdit::clear);
    return bottom;
}

// The plan tab (the plan above, the timeline below), the Compare and Recommend tabs.
void MainWindow::buildTabs(QWidget* plan, QWidget* timeline) {
    auto* outer = new QSplitter(Qt::Vertical);
    m_outer = outer;
    outer->addWidget(plan);
    outer->addWidget(timeline);
    outer->setStretchFactor(0, 3);
    outer->setStretchFactor(1, 2);
    m_compare = new CompareView;
    m_tabs = new QTabWidget;
    m_tabs->addTab(outer, "Plan && timeline");
    m_tabs->addTab(m_compare, "Compare");
    m_recommend = new RecommendView;
    m_tabs->addTab(m_recommend, "Recommend");
    connect(m_recommend, &RecommendView::loadPlanRequested, this,
            [this](std::shared_ptr<const Plan> plan) {
                LoadedFile f;
                f.kind = LoadedFile::Kind::Plan;
                f.path = "recommended plan";
                f.plan = std::move(plan);
                m_doc.apply(f);
                refresh();
                m_tabs->setCurrentIndex(0);
                statusBar()->showMessage("Loaded the recommended plan: " +
                                         QString::fromStdString(m_doc.plan->name));
            });
    setCentralWidget(m_tabs);
}

// The loading progress and its Cancel button in the status bar; the File menu.
void MainWindow::buildStatusBarAndMenus() {
    m_progress = new QProgressBar;
    m_progress->setMaximumWidth(200);
    m_progress->hide();
    statusBar()->addPermanentWidget(m_progress);
    m_cancelLoad = new QPushButton("Cancel");
    m_cancelLoad->setToolTip("Stop loading the files being opened");
    m_cancelLoad->hide();
    statusBar()->addPermanentWidget(m_cancelLoad);
    connect(m_cancelLoad, &QPushButton::clicked, this, &MainWindow::cancelLoading);

    QMenu* file = menuBar()->addMenu("&File");
    file->addAction("&Open...", QKeySequence::Open, this, [this] {
        const QStringList paths = QFileDialog::getOpenFileNames(
            this, "Open model, plan, cluster or PyTorch profiler trace", QString(),
            "JSON files (*.json *.json.gz);;All files (*)");
        if (!paths.isEmpty()) openFiles(paths);
    });
    file->addAction("&Save plan as...", QKeySequence::SaveAs, this, [this] {
        if (!m_doc.plan) return;
        const QString path = QFileDialog::getSaveFileName(this, "Save the plan", "plan.json",
                                                          "ShardScope plan (*.json)");
        if (!path.isEmpty()) {
            const QString err = savePlan(path);
            if (!err.isEmpty()) showError(err);
        }
    });
    m_recent = file->addMenu("Open &Recent");
    rebuildRecentMenu();
    file->addSeparator();
    file->addAction("&Quit", QKeySequence::Quit, this, &QWidget::close);
}

void MainWindow::openFiles(const QStringList& paths, std::function<void()> done) {
    if (paths.isEmpty()) {
        if (done) done();
        return;
    }
    if (m_pending == 0) m_loadCancel = std::make_shared<std::atomic<bool>>(false);
    m_pending += static_cast<int>(paths.size());
    m_progress->setRange(0, 1000);
    m_progress->setValue(0);
    m_progress->show();
    m_cancelLoad->show();
    statusBar()->showMessage(QString("Loading %1 file(s)...").arg(paths.size()));
    auto remaining = std::make_shared<int>(static_cast<int>(paths.size()));
    auto results = std::make_shared<std::vector<LoadedFile>>(paths.size());
    // Each file's fraction read, shown as their mean; posted from the loading threads.
    auto fractions = std::make_shared<std::vector<std::atomic<int>>>(paths.size());
    auto cancel = m_loadCancel;
    QPointer<MainWindow> self(this);
    for (int i = 0; i < paths.size(); ++i) {
        auto* watcher = new QFutureWatcher<LoadedFile>(this);
        connect(watcher, &QFutureWatcher<LoadedFile>::finished, this, [=, this] {
            (*results)[static_cast<size_t>(i)] = watcher->result();
            watcher->deleteLater();
            --m_pending;
            if (--*remaining > 0) return;
            // Apply in the order given so models resolve before plans regardless of timing.
            m_loadErrors.clear();
            int cancelled = 0;
            for (const auto& f : *results) {
                if (f.error.endsWith(": cancelled")) {
                    ++cancelled;
                    continue;
                }
                if (!f.error.isEmpty()) {
                    showError(f.error);
                    continue;
                }
                m_doc.apply(f);
                rememberRecent(f.path);
            }
            refresh();
            if (m_pending == 0) {
                m_progress->hide();
                m_cancelLoad->hide();
            }
            if (cancelled > 0)
                statusBar()->showMessage(
                    QString("Loading cancelled (%1 file(s) not opened)").arg(cancelled));
            if (done) done();
        });
        auto progress = [self, fractions, i](double f) {
            (*fractions)[static_cast<size_t>(i)] = static_cast<int>(1000 * f);
            QMetaObject::invokeMethod(
                self,
                [self, fractions] {
                    if (!self) return;
                    int sum = 0;
                    for (const auto& x : *fractions)
                        sum += x.load();
                    self->m_progress->setValue(sum / static_cast<int>(fractions->size()));
                },
                Qt::QueuedConnection);
        };
        watcher->setFuture(QtConcurrent::run(
            [p = paths[i], cancel, progress] { return loadFile(p, cancel.get(), progress); }));
    }
}

void MainWindow::refresh() {
    if (m_tree->graph() != m_doc.model.get()) m_tree->setModel(m_doc.model);
    m_tree->setPlan(m_doc.resolved);
    m_units->setPlan(m_doc.resolved);
    m_treeView->expandToDepth(2);
    for (int c = 0; c < ModuleTreeModel::ColumnCount; ++c)
        m_treeView->resizeColumnToContents(c);
    m_unitView->resizeColumnsToContents();
    m_problems->clear();
    for (const QString& e : m_loadErrors) {
        auto* item = new QListWidgetItem(e, m_problems);
        item->setForeground(QColor(0xc0, 0x20, 0x20));
    }
    QStringList parts;
    if (m_doc.model)
        parts << QString("<b>Model</b> %1: %2 parameters, %3 modules")
                     .arg(QString::fromStdString(m_doc.model->name).toHtmlEscaped(),
                          QString::fromStdString(withThousands(m_doc.model->totalParams())))
                     .arg(m_doc.model->moduleCount());
    if (m_doc.cluster)
        parts << QString("<b>Cluster</b> %1 (%2 devices)")
                     .arg(QString::fromStdString(m_doc.cluster->name).toHtmlEscaped())
                     .arg(m_doc.cluster->worldSize());
    if (const auto& r = m_doc.resolved) {
        parts << QString(
                     "<b>Plan</b> %1 [%2]: %3 units over %4 ranks (shard %5%6); sharded parameters "
                     "%7 per "
                     "rank, largest unsharded unit %8")
                     .arg(QString::fromStdString(r->plan.name).toHtmlEscaped(),
                          planApiName(r->plan.api))
                     .arg(r->units.size())
                     .arg(r->worldSize)
                     .arg(r->shardSize)
                     .arg(r->hsdp ? QString(", replicate %1").arg(r->replicateSize) : QString())
                     .arg(QString::fromStdString(formatBytes(r->totalShardedBytes())),
                          QString::fromStdString(formatBytes(r->maxUnshardedBytes())));
        for (const auto& p : r->problems) {
            auto* item = new QListWidgetItem(QString::fromStdString(p.toString()), m_problems);
            item->setForeground(p.severity == Problem::Severity::Error ? QColor(0xc0, 0x20, 0x20)
                                                                       : QColor(0xa0, 0x70, 0x00));
        }
        if (r->problems.empty()) new QListWidgetItem("No problems found.", m_problems);
    } else if (m_doc.plan) {
        parts << "<b>Plan</b> open; open a model to resolve it";
    }
    if (!parts.isEmpty()) m_summary->setText(parts.join("<br>"));
    if (m_doc.plan) {  // the plan-wide row shows the plan's settings
        QStringList mesh;
        for (int64_t d : m_doc.plan->meshShape)
            mesh << QString::number(d);
        m_mesh->setText(mesh.join(","));
        const auto& mp = m_doc.plan->defaults.mixedPrecision;
        auto show = [](QComboBox* c, const std::optional<DType>& d) {
            const int i = d ? c->findText(QString::fromStdString(std::string(dtypeName(*d)))) : 0;
            c->setCurrentIndex(i >= 0 ? i : 0);
        };
        show(m_paramDtype, mp ? mp->paramDtype : std::nullopt);
        show(m_reduceDtype, mp ? mp->reduceDtype : std::nullopt);
        m_offload->setChecked(m_doc.plan->defaults.offload &&
                              m_doc.plan->defaults.offload->enabled);
        const WrapPolicySpec& w = m_doc.plan->wrap;
        m_wrapKind->setCurrentIndex(
            static_cast<int>(w.kind));  // None, Size, ModuleClass, NamePattern
        QStringList items;
        for (const auto& c : w.kind == WrapPolicySpec::Kind::ModuleClass ? w.classes : w.patterns)
            items << QString::fromStdString(c);
        m_wrapArg->setText(w.kind == WrapPolicySpec::Kind::Size ? QString::number(w.minNumParams)
                                                                : items.join(", "));
    }
    syncWhatIfWidgets();
    showSimulation();
    m_compare->setSources(m_doc.compareSources());
    m_recommend->setInputs(m_doc.model, m_doc.cluster, m_doc.plan ? m_doc.plan->seqLen : 0);
    updateTitle();
    statusBar()->showMessage(m_doc.resolved
                                 ? QString("%1 error(s)").arg(m_doc.resolved->errorCount())
                                 : QString("Ready"));
}

void MainWindow::syncWhatIfWidgets() {
    // The what-if bar shows the document's what-if state (a loaded plan resets it), without
    // re-simulating while it is set.
    const Document::WhatIf& w = m_doc.whatIf;
    const QSignalBlocker b1(m_reshard), b2(m_ac), b3(m_fwdPrefetch), b4(m_bwdPrefetch),
        b5(m_microBatch);
    const ReshardSetting& r = w.variant.reshard;
    m_reshard->setCurrentIndex(r.kind == ReshardSetting::Kind::Default ? 0
                               : r.kind == ReshardSetting::Kind::Int   ? 3
                               : r.value                               ? 1
                                                                       : 2);
    m_ac->setCurrentIndex(w.variant.ac ? static_cast<int>(*w.variant.ac) + 1 : 0);
    m_fwdPrefetch->setValue(w.variant.forwardPrefetchDepth);
    m_bwdPrefetch->setValue(w.variant.backwardPrefetchDepth);
    m_microBatch->setValue(static_cast<int>(w.microBatchSize));
}

void MainWindow::updateTitle() {
    // The title says what the timeline shows: a trace by its file, else the model and the
    // plan, edited or not, with the what-if settings on top or not.
    QStringList title{"ShardScope"};
    if (const OpenedTrace* tr = m_doc.showTrace ? m_doc.lastTrace() : nullptr) {
        title << QFileInfo(tr->path).fileName() + " (trace)";
    } else {
        for (const QString& p : {m_doc.modelPath, m_doc.planPath})
            if (!p.isEmpty()) title << QFileInfo(p).fileName();
        if (m_doc.planEdited) title.last() += " (edited)";
        if (m_doc.plan && m_doc.whatIf.active()) title.last() += " + what-if";
    }
    setWindowTitle(title.join(" - "));
}

void MainWindow::whatIfChanged() {
    PlanVariant& v = m_doc.whatIf.variant;
    const int rs = m_reshard->currentIndex();
    v.reshard = rs == 1   ? ReshardSetting::ofBool(true)
                : rs == 2 ? ReshardSetting::ofBool(false)
                : rs == 3
                    ? ReshardSetting::ofInt(m_doc.cluster ? m_doc.cluster->node.devicesPerNode : 8)
                    : ReshardSetting{};
    const int ac = m_ac->currentIndex();
    v.ac = ac == 0 ? std::optional<AcMode>() : std::optional<AcMode>(static_cast<AcMode>(ac - 1));
    v.forwardPrefetchDepth = m_fwdPrefetch->value();
    v.backwardPrefetchDepth = m_bwdPrefetch->value();
    m_doc.whatIf.microBatchSize = m_microBatch->value();
    // A what-if shows its step, even over a trace opened last (which stays in Compare).
    if (m_doc.resolved) m_doc.showTrace = false;
    QString why;
    if (!m_doc.resimulate(&why) && !why.isEmpty()) statusBar()->showMessage("What if: " + why);
    showSimulation();
    updateTitle();
    m_compare->setSources(m_doc.compareSources());
}

void MainWindow::showSimulation() {
    const OpenedTrace* tr = m_doc.showTrace ? m_doc.lastTrace() : nullptr;
    const bool flows = tr && tr->timeline && !tr->timeline->flows.empty();
    m_flows->setEnabled(flows);
    m_flows->setToolTip(
        flows ? QString("%1 launch-to-kernel flows in this trace").arg(tr->timeline->flows.size())
              : QString("The trace shown has no launch-to-kernel flows"));
    if (tr && tr->timeline && tr->summary) {
        m_simulatedFor = {nullptr, nullptr};
        m_timeline->setData(tr->timeline);
        sizeTimelineArea();
        searchChanged();
        m_memory->setData(tr->memory, 0);
        m_memory->setSeries(tr->rankMemory ? *tr->rankMemory : std::vector<MemorySeries>{});
        // A trace without memory events has no chart: the tracks get its room.
        m_memory->setVisible(tr->memory && !tr->memory->timeline.empty());
        // A trace opened on its own: the empty plan editor yields its room to the tracks, once
        // when that trace is first shown (a later refresh keeps where the user dragged it).
        if (!m_doc.model && m_tracksSizedFor != tr->timeline.get()) {
            m_tracksSizedFor = tr->timeline.get();
            const int total = m_outer->height();
            m_outer->setSizes({total / 6, total - total / 6});
        }
        const TraceSummary& s = *tr->summary;
        QString text;
        if (s.kernelTimeNs > 0 || s.hostCommNs == 0)
            text = QString(
                       "<b>Trace</b> %1 (rank %2, %3): GPU time %4 ms, compute %5 "
                       "ms, idle %6 ms; communication %7 ms, "
                       "%8% overlapped by compute (HTA's definitions)")
                       .arg(QFileInfo(tr->path).fileName().toHtmlEscaped())
                       .arg(s.rank)
                       .arg(QString::fromStdString(s.dialect))
                       .arg(s.kernelTimeNs * 1e-6, 0, 'f', 1)
                       .arg(s.computeNs * 1e-6, 0, 'f', 1)
                       .arg(s.idleNs * 1e-6, 0, 'f', 1)
                       .arg(s.commNs * 1e-6, 0, 'f', 1)
                       .arg(100.0 * s.overlapRatio, 0, 'f', 1);
        else  // a CPU run: Gloo's collectives, exposed while the issuing thread ran no op
            text = QString(
                       "<b>Trace</b> %1 (rank %2, CPU run): communication %3 ms on Gloo "
                       "threads, %4 ms of it exposed")
                       .arg(QFileInfo(tr->path).fileName().toHtmlEscaped())
                       .arg(s.rank)
                       .arg(s.hostCommNs * 1e-6, 0, 'f', 1)
                       .arg(s.hostExposedNs * 1e-6, 0, 'f', 1);
        if (const auto& f = tr->fsdp)
            text += QString(
                        "<br><b>%1</b>: %2 units, %3 step%4 of %5 micro-batch%6; per step "
                        "FSDP communication %7 ms, %8 ms exposed (rows \"FSDP all-gathers\" "
                        "and \"FSDP reduce-scatters\")")
                        .arg(f->api == "fsdp2" ? "FSDP2" : "FSDP1")
                        .arg(f->units.size())
                        .arg(f->steps)
                        .arg(f->steps > 1 ? "s" : "")
                        .arg(f->microBatches)
                        .arg(f->microBatches > 1 ? "es" : "")
                        .arg(static_cast<double>(f->commNs) * 1e-6, 0, 'f', 1)
                        .arg(static_cast<double>(f->exposedNs) * 1e-6, 0, 'f', 1);
        m_simSummary->setText(text);
        return;
    }
    // Re-simulating the same model on the same cluster (a plan edit, a what-if) keeps the
    // zoom; a new model, cluster or a trace shown in between fits the step again.
    const std::pair<const void*, const void*> key{m_doc.model.get(), m_doc.cluster.get()};
    m_timeline->setData(m_doc.timeline, m_doc.timeline && key == m_simulatedFor);
    m_simulatedFor = m_doc.timeline ? key : std::pair<const void*, const void*>{nullptr, nullptr};
    sizeTimelineArea();
    searchChanged();
    m_memory->setData(m_doc.simulation, m_doc.cluster ? m_doc.cluster->device.memoryBytes : 0);
    m_memory->setSeries({});
    m_memory->setVisible(m_doc.simulation != nullptr);
    if (const auto& sim = m_doc.simulation) {
        m_simSummary->setText(QString("<b>Simulated step</b> %1 ms: compute %2 ms, communication "
                                      "%3 ms of which %4 ms exposed "
                                      "(overlap %5%); peak allocated %6, reserved %7%8 &nbsp; "
                                      "<i>wheel/W/S zoom, drag/A/D pan, F fit</i>")
                                  .arg(sim->stepNs * 1e-6, 0, 'f', 1)
                                  .arg(sim->computeNs * 1e-6, 0, 'f', 1)
                                  .arg(sim->commNs * 1e-6, 0, 'f', 1)
                                  .arg(sim->exposedCommNs * 1e-6, 0, 'f', 1)
                                  .arg(100.0 * sim->overlapRatio, 0, 'f', 1)
                                  .arg(QString::fromStdString(formatBytes(sim->peakAllocated)),
                                       QString::fromStdString(formatBytes(sim->peakReserved)),
                                       sim->oom
                                           ? QString(" <b style='color:#c02020'>out of memory</b>")
                                           : QString()));
    } else {
        m_simSummary->setText(
            m_doc.resolved && !m_doc.cluster ? "Open a cluster to simulate the step." : QString());
    }
}

void MainWindow::showError(const QString& message) {
    m_loadErrors << message;
    if (!qEnvironmentVariableIsSet("SHARDSCOPE_GUI_NO_DIALOGS"))
        QMessageBox::warning(this, "Cannot open file", message);
    else  // unattended (--screenshot, tests): said on stderr instead of a modal dialog
        std::fprintf(stderr, "shardscope-gui: %s\n", qPrintable(message));
}

void MainWindow::rememberRecent(const QString& path) {
    QSettings s("ShardScope", "shardscope-gui");
    QStringList recent = s.value("recentFiles").toStringList();
    recent.removeAll(QFileInfo(path).absoluteFilePath());
    recent.prepend(QFileInfo(path).absoluteFilePath());
    while (recent.size() > 10)
        recent.removeLast();
    s.setValue("recentFiles", recent);
    rebuildRecentMenu();
}

void MainWindow::rebuildRecentMenu() {
    m_recent->clear();
    const QStringList recent =
        QSettings("ShardScope", "shardscope-gui").value("recentFiles").toStringList();
    for (const QString& p : recent)
        m_recent->addAction(p, this, [this, p] { openFiles({p}); });
    m_recent->setEnabled(!recent.isEmpty());
}

void MainWindow::dragEnterEvent(QDragEnterEvent* e) {
    if (e->mimeData()->hasUrls()) e->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* e) {
    QStringList paths;
    for (const QUrl& u : e->mimeData()->urls())
        if (u.isLocalFile()) paths << u.toLocalFile();
    openFiles(paths);
}

}  // namespace shardscope::gui
