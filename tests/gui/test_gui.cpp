// SPDX-License-Identifier: Apache-2.0
// GUI tests, offscreen: item models under QAbstractItemModelTester, and the main window
// opening the samples as a user would, checked by what it shows.
#include <gtest/gtest.h>

#include <QAbstractItemModelTester>
#include <QApplication>
#include <QCheckBox>
#include <QComboBox>
#include <QCursor>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QPlainTextEdit>
#include <QScatterSeries>
#include <QScrollBar>
#include <QSignalSpy>
#include <QSpinBox>
#include <QStatusBar>
#include <QTableWidget>
#include <QTest>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "gui/app/compare_view.h"
#include "gui/app/document.h"
#include "gui/app/main_window.h"
#include "gui/app/recommend_view.h"
#include "gui/models/module_tree_model.h"
#include "gui/models/unit_table_model.h"
#include "gui/timeline/step_stats.h"
#include "plans/core/strings.h"
#include "plans/plan/plan.h"
#include "profiler/import/synthetic_trace.h"
#include "tests/support/golden.h"
#include "tests/support/sample_traces.h"

using namespace shardscope;
using namespace shardscope::gui;
using shardscope::test::samplePath;

namespace {

QString sample(const char* rel) {
    return QString::fromStdString(samplePath(rel));
}

// The Llama-3-8B model on the 64-GPU H100 cluster, with the given sample plan.
QStringList llamaOnH100(const char* plan) {
    return {sample("models/llama3-8b/config.json"), sample(plan),
            sample("clusters/h100-sxm-8x8.json")};
}

// A PyTorch-profiler-style trace of `ranks` x `streams` with `events` kernels, written to the
// temporary folder as `file`; its path.
std::string syntheticTrace(const char* file, int ranks, int streams, int events) {
    const std::string path = (shardscope::test::testTempDir() / file).string();
    shardscope::SyntheticTraceOptions so;
    so.ranks = ranks;
    so.streams = streams;
    so.events = events;
    shardscope::writeSyntheticTrace(path, so);
    return path;
}

Document openSamples() {
    Document d;
    for (const QString& f : llamaOnH100("plans/llama-per-block.json")) {
        const LoadedFile lf = loadFile(f);
        EXPECT_TRUE(lf.error.isEmpty()) << lf.error.toStdString();
        d.apply(lf);
    }
    return d;
}

// Opens files in the window as a user would (loads run off the GUI thread) and waits for
// the window to finish; false if it did not within the timeout.
bool openAndWait(MainWindow& w, const QStringList& files, int timeoutMs = 20000) {
    auto done = std::make_shared<bool>(false);  // outlives a timeout
    w.openFiles(files, [done] { *done = true; });
    return QTest::qWaitFor([&] { return *done; }, timeoutMs);
}

// Opens one trace (a file, or a folder of per-rank files) in the window and waits for it;
// the document's last trace, or null when it did not open within 30 s.
const OpenedTrace* openTrace(MainWindow& w, const std::string& path) {
    if (!openAndWait(w, {QString::fromStdString(path)}, 30000)) return nullptr;
    return w.document().lastTrace();
}

// A Kineto trace of one rank of `world`, as torch.profiler writes it (distributedInfo).
void writeRankTrace(const std::filesystem::path& path, int rank, int world,
                    const nlohmann::json& events) {
    std::ofstream(path) << nlohmann::json{
        {"distributedInfo", {{"rank", rank}, {"world_size", world}}},
        {"traceEvents",
         events}}.dump();
}

// The Llama per-block plan on 64 H100s with a trace opened after it (the trace is then the
// document's last).
bool openLlamaPlanAndTrace(MainWindow& w, const std::string& trace) {
    QStringList files = llamaOnH100("plans/llama-per-block.json");
    files << QString::fromStdString(trace);
    return openAndWait(w, files, 30000);
}

// Plan edits resolve and simulate in the background: waits until the window has the result.
void settle(MainWindow& w) {
    ASSERT_TRUE(QTest::qWaitFor([&] { return !w.editing(); }, 20000));
}

}  // namespace

TEST(GuiModels, ModuleTreePassesTheModelTester) {
    const Document d = openSamples();
    ModuleTreeModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
    model.setModel(d.model);
    model.setPlan(d.resolved);
    ASSERT_EQ(model.rowCount(), 1);
    const QModelIndex root = model.index(0, 0);
    EXPECT_EQ(model.data(root).toString(), "<root>");
    EXPECT_EQ(model.rowCount(root), 2);  // model, lm_head
    const QModelIndex layer5 = model.indexOf(*d.model->findModule("model.layers.5"));
    EXPECT_EQ(model.data(layer5).toString(), "5");
    EXPECT_EQ(model.data(layer5.siblingAtColumn(ModuleTreeModel::Class)).toString(),
              "LlamaDecoderLayer");
    EXPECT_EQ(model.data(layer5.siblingAtColumn(ModuleTreeModel::Params)).toString(), "218.11M");
    EXPECT_EQ(model.data(layer5.siblingAtColumn(ModuleTreeModel::Unit)).toString(),
              "model.layers.5");
    const QModelIndex q = model.indexOf(*d.model->findModule("model.layers.5.self_attn.q_proj"),
                                        ModuleTreeModel::Unit);
    EXPECT_EQ(model.data(q).toString(), "model.layers.5");  // managed by its enclosing unit
    EXPECT_EQ(model.parent(layer5), model.indexOf(*d.model->findModule("model.layers")));
    model.setPlan(nullptr);
    EXPECT_TRUE(model.data(layer5.siblingAtColumn(ModuleTreeModel::Unit)).isNull());
}

TEST(GuiModels, UnitTablePassesTheModelTester) {
    const Document d = openSamples();
    UnitTableModel model;
    QAbstractItemModelTester tester(&model, QAbstractItemModelTester::FailureReportingMode::Fatal);
    model.setPlan(d.resolved);
    ASSERT_EQ(model.rowCount(), 35);
    // Every column has its header (the Offload column's used to be read past the names).
    for (int c = 0; c < UnitTableModel::ColumnCount; ++c)
        EXPECT_FALSE(model.headerData(c, Qt::Horizontal, Qt::DisplayRole).toString().isEmpty())
            << c;
    EXPECT_EQ(model.headerData(UnitTableModel::Offload, Qt::Horizontal, Qt::DisplayRole).toString(),
              "Offload");
    EXPECT_EQ(model.data(model.index(0, UnitTableModel::Unit)).toString(), "<root>");
    EXPECT_EQ(model.data(model.index(2, UnitTableModel::Unit)).toString(), "model.layers.0");
    EXPECT_EQ(model.data(model.index(2, UnitTableModel::Sharded)).toString(), "13.00 MiB");
    EXPECT_EQ(model.data(model.index(2, UnitTableModel::Precision)).toString(),
              "bfloat16 / float32");
    EXPECT_EQ(
        model.data(model.index(2, UnitTableModel::Sharded), UnitTableModel::SortRole).toLongLong(),
        218112000LL * 4 / 64);
    model.setPlan(nullptr);
    EXPECT_EQ(model.rowCount(), 0);
}

TEST(GuiWindow, OpensSamplesOffTheGuiThreadAndShowsProblems) {
    MainWindow w;
    // A plan whose mesh disagrees with the cluster: the window must list the error.
    ASSERT_TRUE(openAndWait(
        w, {sample("models/tiny-llama/config.json"), sample("plans/tiny-llama-2rank.json"),
            sample("clusters/h100-sxm-8x8.json")}));
    ASSERT_TRUE(w.document().resolved);
    EXPECT_EQ(w.unitModel()->rowCount(), 5);
    EXPECT_EQ(w.treeModel()->rowCount(), 1);
    ASSERT_GE(w.problemList()->count(), 1);
    EXPECT_TRUE(w.problemList()->item(0)->text().contains("world size 64 of cluster"))
        << w.problemList()->item(0)->text().toStdString();
    // A broken file is reported with its name and field, and nothing else changes.
    ASSERT_TRUE(openAndWait(w, {sample("models/does-not-exist.json")}));
    EXPECT_TRUE(w.problemList()->item(0)->text().contains("does-not-exist.json: cannot open file"))
        << w.problemList()->item(0)->text().toStdString();
    EXPECT_EQ(w.unitModel()->rowCount(), 5);
}

// --- timeline draw list -----------------------------------------------------------------

#include "gui/timeline/draw_list.h"
#include "gui/timeline/memory_chart.h"

namespace {
std::vector<TimelineRow> denseRow(int n, int64_t len, int64_t gap) {
    TimelineRow r;
    r.name = "compute";
    int64_t t = 0;
    for (int i = 0; i < n; ++i) {
        r.events.push_back({t, t + len, EventKind::Compute, i, "op " + std::to_string(i)});
        t += len + gap;
    }
    return {r};
}
}  // namespace

TEST(DrawList, CoordinatesAndEdges) {
    Viewport v{1000, 2000, 500};
    EXPECT_DOUBLE_EQ(timeToPixel(1000, v), 0);
    EXPECT_DOUBLE_EQ(timeToPixel(2000, v), 500);
    EXPECT_DOUBLE_EQ(timeToPixel(500, v), -250);  // before the viewport: negative
    EXPECT_EQ(pixelToTime(250, v), 1500);
    Viewport empty{5, 5, 100};
    EXPECT_DOUBLE_EQ(timeToPixel(7, empty), 0);
}

TEST(DrawList, AtMostAboutOnePrimitivePerPixel) {
    // A million 1 ns events over 2 ms on a 1000-pixel row.
    const auto rows = denseRow(1000000, 1, 1);
    Viewport v{0, 2000000, 1000};
    const auto dl = buildDrawList(rows, v);
    EXPECT_LE(dl.size(), 1000u / 2);  // folded into blocks at least minWidthPx wide
    int64_t folded = 0;
    for (const auto& d : dl)
        folded += d.folded;
    EXPECT_EQ(folded, 1000000);  // every event is accounted for
    std::printf("1,000,000 events on 1,000 px: %zu primitives\n", dl.size());
}

TEST(DrawList, FoldedBlocksTakeTheKindCoveringMostOfTheirTime) {
    // Two dense rows zoomed out: one of compute with every tenth event an all-gather, one
    // alternating 1 ns compute with 9 ns all-reduces. Mixed blocks used to be grey (Other).
    std::vector<TimelineRow> rows(2);
    int64_t t = 0;
    for (int i = 0; i < 10000; ++i, t += 11)
        rows[0].events.push_back(
            {t, t + 10, i % 10 == 0 ? EventKind::AllGather : EventKind::Compute, i, "x"});
    t = 0;
    for (int i = 0; i < 10000; ++i) {
        const int64_t len = i % 2 == 0 ? 1 : 9;
        rows[1].events.push_back(
            {t, t + len, i % 2 == 0 ? EventKind::Compute : EventKind::AllReduce, i, "y"});
        t += len + 1;
    }
    const Viewport v{0, 110000, 500};
    // Without the rows' kind index (rows built by hand): mixed blocks stay Other.
    for (const auto& d : buildDrawList(rows, v))
        if (d.folded > 1) {
            EXPECT_EQ(d.kind, EventKind::Other);
        }
    sortEventsByStart(rows);
    const auto dl = buildDrawList(rows, v);
    int64_t folded[2] = {0, 0};
    for (const auto& d : dl) {
        ASSERT_GT(d.folded, 1);
        EXPECT_EQ(d.kind, d.row == 0 ? EventKind::Compute : EventKind::AllReduce) << d.row;
        folded[d.row] += d.folded;
    }
    EXPECT_EQ(folded[0], 10000);
    EXPECT_EQ(folded[1], 10000);
}

TEST(DrawList, WideEventsKeepIdentityAndLabelsOnlyWhenWide) {
    const auto rows = denseRow(10, 100, 100);  // 10 events of 100 ns
    Viewport v{0, 2000, 2000};                 // 1 px per ns
    auto dl = buildDrawList(rows, v);
    ASSERT_EQ(dl.size(), 10u);
    EXPECT_EQ(dl[3].op, 3);
    EXPECT_EQ(dl[3].label, "op 3");  // 100 px >= 60 px
    v.widthPx = 400;                 // 20 px per event: no labels, still separate
    dl = buildDrawList(rows, v);
    ASSERT_EQ(dl.size(), 10u);
    EXPECT_TRUE(dl[0].label.empty());
    v = {300, 700, 400};  // only events overlapping [300, 700) are drawn
    dl = buildDrawList(rows, v);
    ASSERT_EQ(dl.size(), 2u);
    EXPECT_EQ(dl[0].op, 2);
    EXPECT_EQ(dl[1].op, 3);
}

TEST(GuiWindow, SimulatedTimelineShowsEveryStreamThatRan) {
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-hsdp-prefetch.json")));
    ASSERT_TRUE(w.document().timeline);
    std::vector<std::string> rows;
    for (const auto& r : w.document().timeline->rows)
        rows.push_back(r.name);
    EXPECT_EQ(rows, (std::vector<std::string>{"compute", "ag_copy_in", "all_gather",
                                              "reduce_scatter", "all_reduce"}));
    w.timeline()->repaint();
    const auto& dl = w.timeline()->lastDrawList();
    ASSERT_FALSE(dl.empty());
    std::set<EventKind> kinds;
    for (const auto& d : dl)
        kinds.insert(d.kind);
    EXPECT_TRUE(kinds.count(EventKind::Compute) && kinds.count(EventKind::AllGather) &&
                kinds.count(EventKind::ReduceScatter) && kinds.count(EventKind::AllReduce));
    EXPECT_LE(dl.size(), static_cast<size_t>(rows.size() * w.timeline()->viewport().widthPx));
}

TEST(GuiWindow, WhatIfPrefetchAndReshardResimulateLive) {
    MainWindow w;
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    ASSERT_TRUE(w.document().simulation);
    const int64_t planned = w.document().simulation->stepNs;
    // Keeping parameters after forward removes the backward all-gathers: the step changes
    // at once, and the timeline follows.
    w.reshardBox()->setCurrentIndex(2);  // False
    ASSERT_TRUE(w.document().simulation);
    const int64_t noReshard = w.document().simulation->stepNs;
    EXPECT_NE(noReshard, planned);
    EXPECT_GT(w.document().simulation->peakAllocated, 0);
    w.forwardPrefetchBox()->setValue(2);
    ASSERT_TRUE(w.document().simulation);
    EXPECT_TRUE(w.document().timeline);
    // Back to the plan as written gives the planned step again.
    w.reshardBox()->setCurrentIndex(0);
    w.forwardPrefetchBox()->setValue(0);
    EXPECT_EQ(w.document().simulation->stepNs, planned);
}

TEST(GuiWindow, OpensAPyTorchProfilerTraceOnTheTimeline) {
    const std::string f = std::string(SHARDSCOPE_SOURCE_DIR) +
                          "/../shared/data/traces/HolisticTraceAnalysis/tests/data/"
                          "nccl_parser_config/nccl_data.json.gz";
    if (!std::filesystem::exists(f))
        GTEST_SKIP() << "needs ../shared/data/traces beside the checkout";
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openTrace(w, f));
    EXPECT_TRUE(w.document().showTrace);
    std::vector<std::string> rows, host;
    for (const auto& r : w.document().lastTrace()->timeline->rows)
        if (r.depth == 0) (r.host ? host : rows).push_back(r.name);
    EXPECT_EQ(rows, (std::vector<std::string>{"stream 7", "stream 40"}));
    // The launching threads, shown with the flows only (one of them has nested calls,
    // drawn a depth per row).
    EXPECT_EQ(host.size(), 2u);
    EXPECT_EQ(w.timeline()->visibleRows().size(), 2u);
    // Collectives keep their kind: this trace has 15 all-reduces and 6 broadcasts, no
    // all-gather or reduce-scatter (what `shardscope trace summary` reports for it).
    std::map<EventKind, int> kinds;
    for (const auto& r : w.document().lastTrace()->timeline->rows)
        for (const auto& e : r.events)
            ++kinds[e.kind];
    EXPECT_EQ(kinds[EventKind::AllReduce], 15);
    EXPECT_EQ(kinds[EventKind::AllGather], 0);
    EXPECT_EQ(kinds[EventKind::ReduceScatter], 0);
    w.timeline()->repaint();
    EXPECT_FALSE(w.timeline()->lastDrawList().empty());
}

TEST(GuiWindow, ManyRanksScrollInsideTheWindow) {
    // 8 ranks x 8 streams: 72 rows of 22 px. The window used to grow to fit them all, past
    // a 900-pixel screen, pushing the memory chart and the status bar off it.
    const std::string path = syntheticTrace("shardscope_gui_8x8.pt.trace.json", 8, 8, 20000);
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(openAndWait(w, {QString::fromStdString(path)}, 30000));
    QApplication::processEvents();
    TimelineWidget* t = w.timeline();
    const int rows = static_cast<int>(t->visibleRows().size());
    EXPECT_EQ(rows, 72);  // 8 rank headers and 64 streams
    EXPECT_LE(w.height(), 900);
    // The last row can be brought on screen: the tracks scroll, the time range stays.
    auto lastRowShown = [&] {
        return !t->visibleRegion()
                    .intersected(QRect(0, t->rowY(rows - 1), 40, TimelineWidget::kRowHeight))
                    .isEmpty();
    };
    EXPECT_FALSE(lastRowShown());
    const Viewport before = t->viewport();
    QScrollBar* bar = w.timelineScroll()->verticalScrollBar();
    ASSERT_GT(bar->maximum(), 0);
    t->setFocus();
    QTest::keyClick(t, Qt::Key_PageDown);  // PageDown on the tracks scrolls them
    EXPECT_GT(bar->value(), 0);
    bar->setValue(bar->maximum());
    QApplication::processEvents();
    EXPECT_TRUE(lastRowShown());
    // Virtualised: a repaint lays out only the rows on screen.
    t->repaint();
    const QRect shown = t->visibleRegion().boundingRect();
    std::set<int> drawnRows;
    for (const auto& d : t->lastDrawList()) {
        drawnRows.insert(d.row);
        EXPECT_GT(t->rowY(d.row) + TimelineWidget::kRowHeight, shown.top());
        EXPECT_LT(t->rowY(d.row), shown.bottom() + 1);
    }
    EXPECT_FALSE(drawnRows.empty());
    EXPECT_LT(drawnRows.size(), 64u);
    EXPECT_EQ(t->viewport().startNs, before.startNs);
    EXPECT_EQ(t->viewport().endNs, before.endNs);
    // The status bar stays inside the window; the memory chart is hidden, the trace having
    // no memory events (its empty box used to take the tracks' room).
    QWidget* status = w.statusBar();
    EXPECT_LE(status->mapTo(&w, QPoint(0, status->height())).y(), w.height());
    EXPECT_FALSE(w.memoryChart()->isVisible());
    std::filesystem::remove(path);
}

TEST(GuiWindow, OpensATraceWhoseEventsStartPastTheFirstBlocks) {
    // Kineto writes its header (deviceProperties: kilobytes on a multi-GPU machine) before
    // traceEvents; the app used to sniff only the first 4 KB and refuse the file.
    nlohmann::json ev = nlohmann::json::array();
    ev.push_back({{"ph", "X"},
                  {"cat", "kernel"},
                  {"name", "gemm"},
                  {"pid", 1},
                  {"tid", 7},
                  {"ts", 1.0},
                  {"dur", 2.0},
                  {"args", {{"stream", 7}}}});
    const std::string path =
        (shardscope::test::testTempDir() / "shardscope_gui_late_events.pt.trace.json").string();
    std::ofstream(path) << "{\"traceName\": \"" << std::string(40000, 'x')
                        << "\", \"traceEvents\": " << ev.dump() << "}";
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openTrace(w, path));
    EXPECT_EQ(w.document().lastTrace()->trace->size(), 1u);
}

// A PyTorch FSDP2 step on Gloo as Kineto writes it: FSDP's labels, the c10d op with its
// shapes, the Gloo collective on its thread (the all-gather's span given), the CPU
// allocator's [memory] events.
static nlohmann::json fsdpCpuStepEvents(double glooAgStart = 12, double glooAgDur = 60) {
    using J = nlohmann::json;
    auto x = [](const char* cat, const std::string& name, int tid, double ts, double dur,
                J args = nullptr) {
        J e = {{"ph", "X"},  {"cat", cat}, {"name", name}, {"pid", 9},
               {"tid", tid}, {"ts", ts},   {"dur", dur}};
        if (!args.is_null()) e["args"] = std::move(args);
        return e;
    };
    J ev = J::array();
    ev.push_back(x("user_annotation", "ProfilerStep#1", 1, 0, 1000));
    ev.push_back(x("user_annotation", "FSDP::root_pre_forward", 1, 1, 1));
    ev.push_back(x("user_annotation", "FSDP::pre_forward (model.layers.0)", 1, 5, 100));
    ev.push_back(x("user_annotation", "FSDP::all_gather (model.layers.0)", 1, 6, 90));
    ev.push_back(x("cpu_op", "c10d::_allgather_base_", 1, 10, 3,
                   {{"Input Dims", {{8}, {4}}}, {"Input type", {"float", "float"}}}));
    ev.push_back(x("user_annotation", "gloo:all_gather", 2, glooAgStart, glooAgDur,
                   {{"Input Dims", {{4}}}, {"Input type", {"float"}}}));
    ev.push_back(x("user_annotation", "FSDP::post_forward (model.layers.0)", 1, 300, 2));
    ev.push_back(x("user_annotation", "FSDP::pre_backward (model.layers.0)", 1, 450, 5));
    ev.push_back(x("user_annotation", "FSDP::post_backward_reduce (model.layers.0)", 1, 500, 60));
    ev.push_back(x("cpu_op", "c10d::_reduce_scatter_base_", 1, 505, 3,
                   {{"Input Dims", {{4}, {8}}}, {"Input type", {"float", "float"}}}));
    ev.push_back(x("user_annotation", "gloo:all_reduce", 2, 510, 40,
                   {{"Input Dims", {{8}}}, {"Input type", {"float"}}}));
    for (int i = 0; i < 3; ++i)
        ev.push_back({{"ph", "i"},
                      {"s", "t"},
                      {"name", "[memory]"},
                      {"cat", "cpu_instant_event"},
                      {"pid", 9},
                      {"tid", 1},
                      {"ts", 20 + 100 * i},
                      {"args",
                       {{"Device Type", 0},
                        {"Bytes", 1024},
                        {"Total Allocated", 1024 * (i + 1)},
                        {"Total Reserved", 0}}}});
    return ev;
}

TEST(GuiWindow, ShowsFsdpUnitsAndCpuMemoryOfAPyTorchCpuRun) {
    using J = nlohmann::json;
    const J ev = fsdpCpuStepEvents();
    const std::string path =
        (shardscope::test::testTempDir() / "shardscope_gui_fsdp_cpu.pt.trace.json").string();
    writeRankTrace(path, 0, 2, ev);
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    const OpenedTrace* tr = openTrace(w, path);
    ASSERT_TRUE(tr);
    ASSERT_TRUE(tr->fsdp);
    EXPECT_EQ(tr->fsdp->api, "fsdp2");
    std::map<std::string, std::vector<std::string>> labels;
    for (const auto& r : tr->timeline->rows)
        for (const auto& e : r.events)
            labels[r.name].push_back(e.label);
    ASSERT_EQ(labels["FSDP all-gathers"].size(), 1u);
    EXPECT_EQ(labels["FSDP all-gathers"][0],
              "model.layers.0 all-gather (forward, 0.06 ms exposed)");
    ASSERT_EQ(labels["FSDP reduce-scatters"].size(), 1u);
    EXPECT_EQ(labels["FSDP reduce-scatters"][0].rfind("model.layers.0 reduce-scatter (backward", 0),
              0u);
    // A CPU run's communication is Gloo's (it used to read "communication 0.0 ms": only
    // NCCL kernels counted).
    const QString summary = w.summaryLabel()->text();
    EXPECT_TRUE(summary.contains("CPU run): communication 0.1 ms on Gloo threads"))
        << summary.toStdString();
    // The CPU allocator's counter is the memory timeline of a CPU run.
    ASSERT_TRUE(tr->memory);
    EXPECT_EQ(tr->memory->peakAllocated, 3072);
    // The main thread's nested slices (step > pre_forward > all_gather > c10d op) are drawn
    // one depth per row, each row without overlap.
    std::map<std::string, int> depthOf;
    for (const auto& r : tr->timeline->rows) {
        for (const auto& e : r.events)
            depthOf[e.label] = r.depth;
        for (size_t i = 1; i < r.events.size(); ++i)
            EXPECT_LE(r.events[i - 1].end, r.events[i].start) << r.name;
    }
    // FSDP's units on top: each unit's forward (pre_forward to post_forward) and backward
    // (pre_backward to its last post_backward hook), then its collectives, then the threads.
    ASSERT_GE(tr->timeline->rows.size(), 3u);
    EXPECT_EQ(tr->timeline->rows[0].name, "FSDP units");
    EXPECT_EQ(tr->timeline->rows[1].name, "FSDP all-gathers");
    EXPECT_EQ(tr->timeline->rows[2].name, "FSDP reduce-scatters");
    std::map<std::string, std::pair<int64_t, int64_t>> spans;
    for (const auto& e : tr->timeline->rows[0].events)
        spans[e.label] = {e.start, e.end};
    const int64_t t0 = spans["model.layers.0 forward"].first;        // the trace's times start at 0
    EXPECT_EQ(spans["model.layers.0 forward"].second - t0, 297000);  // 5 us to 302 us
    EXPECT_EQ(spans["model.layers.0 backward"].first - t0, 445000);  // 450 us
    EXPECT_EQ(spans["model.layers.0 backward"].second - t0, 555000);  // to 560 us
    EXPECT_EQ(depthOf["ProfilerStep#1"], 0);
    EXPECT_EQ(depthOf["FSDP::pre_forward (model.layers.0)"], 1);
    EXPECT_EQ(depthOf["FSDP::all_gather (model.layers.0)"], 2);
    EXPECT_EQ(depthOf["c10d::_allgather_base_"], 3);
}

TEST(GuiWindow, MemoryChartShowsTheSimulatedPeak) {
    MainWindow w;
    w.resize(1200, 900);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    ASSERT_TRUE(w.document().simulation);
    EXPECT_EQ(w.memoryChart()->peakShown(), w.document().simulation->peakAllocated);
    EXPECT_GT(w.memoryChart()->peakShown(),
              int64_t{40} << 30);  // Llama-3-8B, 8192 tokens, no checkpointing
}

// A timeline widget on screen, `width` pixels wide, as the timeline tests use it.
bool shownAt(TimelineWidget& t, int width) {
    t.resize(width, 300);
    t.show();
    return QTest::qWaitForWindowExposed(&t);
}

// Two ranks, each with a compute and an all-gather row: compute [0, 10) ms, all-gather
// [5, 15) ms on rank 0; rank 1 shifted by 1 ms.
std::shared_ptr<TimelineData> twoRanks() {
    auto d = std::make_shared<TimelineData>();
    const int64_t ms = 1'000'000;
    d->units = {"", "layers.0"};
    for (int r = 0; r < 2; ++r) {
        const std::string g = "rank " + std::to_string(r);
        const int64_t o = r * ms;
        TimelineRow compute, allGather;
        compute.name = "compute";
        compute.events = {{o, o + 10 * ms, EventKind::Compute, 0, "fwd", 1}};
        compute.group = g;
        allGather.name = "all_gather";
        allGather.events = {{o + 5 * ms, o + 15 * ms, EventKind::AllGather, 1, "ag", 1}};
        allGather.group = g;
        d->rows.push_back(std::move(compute));
        d->rows.push_back(std::move(allGather));
    }
    d->endNs = 16 * ms;
    return d;
}

TEST(StepStats, RangeFiguresAreUnionsPerRank) {
    const auto d = twoRanks();
    const int64_t ms = 1'000'000;
    const auto all = rangeStats(*d, 0, 20 * ms);
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0].group, "rank 0");
    EXPECT_EQ(all[0].busyNs, 15 * ms);
    EXPECT_EQ(all[0].computeNs, 10 * ms);
    EXPECT_EQ(all[0].commNs, 10 * ms);
    EXPECT_EQ(all[0].exposedCommNs, 5 * ms);
    EXPECT_DOUBLE_EQ(all[0].overlapPercent(), 50.0);
    // Clipped to [8, 12) ms: compute 2 ms, all-gather 4 ms of which 2 exposed.
    const auto part = rangeStats(*d, 8 * ms, 12 * ms);
    EXPECT_EQ(part[0].computeNs, 2 * ms);
    EXPECT_EQ(part[0].commNs, 4 * ms);
    EXPECT_EQ(part[0].exposedCommNs, 2 * ms);
    EXPECT_EQ(part[1].computeNs, 3 * ms);  // rank 1: compute until 11 ms
    const StepStats st = stepStats(*d);
    EXPECT_EQ(st.stepNs, 15 * ms);
    EXPECT_EQ(st.exposedCommByUnit.at("layers.0"), 5 * ms);
    // With measured steps, figures are per step, averaged.
    auto withSteps = std::make_shared<TimelineData>(*d);
    withSteps->steps = {{"rank 0", 0, 8 * ms}, {"rank 0", 8 * ms, 16 * ms}};
    const StepStats avg = stepStats(*withSteps);
    EXPECT_EQ(avg.steps, 2);
    EXPECT_EQ(avg.stepNs, 8 * ms);
    EXPECT_EQ(avg.total.computeNs, 5 * ms);  // 8 + 2 over two steps
}

TEST(StepStats, ASelectionAggregatesByName) {
    // Perfetto's slice table for a selection: per name, count, time in range, mean, max.
    auto d = twoRanks();
    const int64_t ms = 1'000'000;
    d->rows[0].events.push_back({11 * ms, 13 * ms, EventKind::Compute, 2, "fwd", 1});
    const auto all = statsByName(*d, 0, 20 * ms);
    ASSERT_EQ(all.size(), 2u);
    EXPECT_EQ(all[0].name, "fwd");  // 10 + 10 + 2 ms
    EXPECT_EQ(all[0].count, 3);
    EXPECT_EQ(all[0].inRangeNs, 22 * ms);
    EXPECT_EQ(all[0].meanNs(), 22 * ms / 3);
    EXPECT_EQ(all[0].maxNs, 10 * ms);
    EXPECT_EQ(all[1].name, "ag");
    EXPECT_EQ(all[1].count, 2);
    // [9, 12) ms: rank 0's fwd 1 ms + its second 1 ms, rank 1's fwd 2 ms; both ags 3 ms each.
    const auto part = statsByName(*d, 9 * ms, 12 * ms);
    ASSERT_EQ(part.size(), 2u);
    EXPECT_EQ(part[0].name, "ag");
    EXPECT_EQ(part[0].inRangeNs, 6 * ms);
    EXPECT_EQ(part[1].inRangeNs, 4 * ms);
    EXPECT_EQ(part[1].totalNs, 22 * ms);  // whole durations
    EXPECT_TRUE(statsByName(*d, 30 * ms, 40 * ms).empty());
}

TEST(GuiTimeline, SearchStepsThroughMatchesAndCentresThem) {
    TimelineWidget t;
    ASSERT_TRUE(shownAt(t, 1000));
    auto d = twoRanks();
    const int64_t ms = 1'000'000;
    d->rows[0].events.push_back({12 * ms, 13 * ms, EventKind::Compute, 7, "late AG-copy", 1});
    t.setData(d);
    t.setCollapsed("rank 1", true);
    t.setViewport(0, 2 * ms);
    EXPECT_EQ(t.setSearch("Ag"), 3);  // case-insensitive: two "ag", one "late AG-copy"
    EXPECT_EQ(t.setSearch("nothing"), 0);
    EXPECT_EQ(t.findNext(), -1);
    ASSERT_EQ(t.setSearch("ag"), 3);
    // By start: rank 0's ag (5 ms), rank 1's (6 ms), the late copy (12 ms); then around.
    EXPECT_EQ(t.findNext(), 0);
    EXPECT_EQ(t.selectedOp(), 1);
    Viewport v = t.viewport();
    EXPECT_EQ(v.endNs - v.startNs, 12 * ms);  // wider than the view: fitted with a margin
    EXPECT_LE(v.startNs, 5 * ms);
    EXPECT_GE(v.endNs, 15 * ms);
    EXPECT_EQ(t.findNext(), 1);
    EXPECT_FALSE(t.isCollapsed("rank 1"));  // its rank opened to show it
    EXPECT_EQ(t.findNext(), 2);
    EXPECT_EQ(t.selectedOp(), 7);
    v = t.viewport();
    EXPECT_LT(v.startNs, 12 * ms);  // narrower than the view: centred, zoom kept
    EXPECT_GT(v.endNs, 13 * ms);
    EXPECT_EQ(v.endNs - v.startNs, 12 * ms);
    EXPECT_EQ(t.findNext(), 0);      // wraps
    EXPECT_EQ(t.findNext(true), 2);  // and back
}

TEST(GuiTimeline, FFitsTheSelectionAndWSZoomAtTheMouse) {
    TimelineWidget t;
    ASSERT_TRUE(shownAt(t, 1150));
    const int64_t ms = 1'000'000;
    t.setData(twoRanks());
    // F with an op selected: that op (rank 0's all-gather, 5-15 ms) with a margin.
    t.selectOp(1);
    QTest::keyClick(&t, Qt::Key_F);
    Viewport v = t.viewport();
    EXPECT_LE(v.startNs, 5 * ms);
    EXPECT_GE(v.endNs, 15 * ms);
    EXPECT_LT(v.endNs - v.startNs, 15 * ms);
    // With a range: the range; with nothing: the whole step.
    t.selectRange(2 * ms, 4 * ms);
    QTest::keyClick(&t, Qt::Key_F);
    v = t.viewport();
    EXPECT_LE(v.startNs, 2 * ms);
    EXPECT_GE(v.endNs, 4 * ms);
    EXPECT_LT(v.endNs - v.startNs, 3 * ms);
    QTest::keyClick(&t, Qt::Key_Escape);
    QTest::keyClick(&t, Qt::Key_F);
    EXPECT_EQ(t.viewport().startNs, 0);
    EXPECT_EQ(t.viewport().endNs, 16 * ms);
    // W zooms in at the mouse: the time under it stays where it was.
    const int x = TimelineWidget::kLabelWidth + 200;
    QCursor::setPos(t.mapToGlobal(QPoint(x, 60)));
    if (t.mapFromGlobal(QCursor::pos()).x() != x)
        GTEST_SKIP() << "this platform does not let a test place the mouse";
    const int64_t under = pixelToTime(x - TimelineWidget::kLabelWidth, t.viewport());
    QTest::keyClick(&t, Qt::Key_W);
    v = t.viewport();
    EXPECT_LT(v.endNs - v.startNs, 16 * ms);
    EXPECT_NEAR(static_cast<double>(pixelToTime(x - TimelineWidget::kLabelWidth, v)),
                static_cast<double>(under), 0.01 * ms);
}

TEST(GuiTimeline, TooltipsSayWhatWhereAndWhen) {
    TimelineWidget t;
    ASSERT_TRUE(shownAt(t, 1150));
    t.setData(twoRanks());
    t.repaint();
    // Rank 0's all-gather row (after its header row): 5-15 ms of 0-16 ms.
    const Viewport v = t.viewport();
    const double x = TimelineWidget::kLabelWidth + timeToPixel(10'000'000, v);
    const QString tip = t.tooltipAt(QPointF(x, t.rowY(2) + 5));
    EXPECT_TRUE(tip.contains("ag")) << tip.toStdString();
    EXPECT_TRUE(tip.contains("all_gather")) << tip.toStdString();
    EXPECT_TRUE(tip.contains("rank 0")) << tip.toStdString();
    EXPECT_TRUE(tip.contains("start 5.000 ms, duration 10.000 ms")) << tip.toStdString();
    EXPECT_TRUE(t.tooltipAt(QPointF(5, 5)).isEmpty());
}

TEST(GuiTimeline, LabelsElideInTheMiddle) {
    // Both the unit and the op's kind stay readable in a narrow box.
    const QFontMetrics fm(QApplication::font());
    const QString full = "model.layers.26 forward";
    const QString shown = elideLabel(full, fm, fm.horizontalAdvance(full) * 3 / 4);
    EXPECT_NE(shown, full);
    EXPECT_TRUE(shown.contains(QChar(0x2026))) << shown.toStdString();
    EXPECT_TRUE(shown.startsWith("model.")) << shown.toStdString();
    EXPECT_TRUE(shown.endsWith("forward")) << shown.toStdString();
    EXPECT_EQ(elideLabel(full, fm, fm.horizontalAdvance(full) + 10), full);
}

TEST(GuiTimeline, RankGroupsCollapseFromTheirHeaderRow) {
    TimelineWidget t;
    ASSERT_TRUE(shownAt(t, 900));
    t.setData(twoRanks());
    ASSERT_EQ(t.visibleRows().size(), 6u);  // two headers, two rows each
    EXPECT_EQ(t.visibleRows()[0], nullptr);
    t.repaint();
    const size_t drawn = t.lastDrawList().size();
    QTest::mouseClick(&t, Qt::LeftButton, {}, QPoint(20, t.rowY(0) + 5));
    EXPECT_TRUE(t.isCollapsed("rank 0"));
    ASSERT_EQ(t.visibleRows().size(), 4u);
    t.repaint();
    EXPECT_EQ(t.lastDrawList().size(), drawn - 2);  // rank 0's two events are gone
    QTest::mouseClick(&t, Qt::LeftButton, {}, QPoint(20, t.rowY(0) + 5));
    EXPECT_FALSE(t.isCollapsed("rank 0"));
    EXPECT_EQ(t.visibleRows().size(), 6u);
}

// Issue 20: a sideways scroll zoomed out. It pans now (so does Shift+wheel); the wheel zooms.
TEST(GuiTimeline, SidewaysScrollPansAndTheWheelZooms) {
    TimelineWidget t;
    ASSERT_TRUE(shownAt(t, 1000));
    t.setData(twoRanks());
    t.setViewport(2'000'000, 4'000'000);
    auto wheel = [&](QPoint angle, Qt::KeyboardModifiers mods = Qt::NoModifier) {
        QWheelEvent ev(QPointF(500, 50), t.mapToGlobal(QPointF(500, 50)), QPoint(), angle,
                       Qt::NoButton, mods, Qt::NoScrollPhase, false);
        QCoreApplication::sendEvent(&t, &ev);
        return t.viewport();
    };
    Viewport v = wheel(QPoint(-120, 0));  // scroll right: later times, same span
    EXPECT_EQ(v.endNs - v.startNs, 2'000'000);
    EXPECT_NEAR(static_cast<double>(v.startNs), 2'200'000.0, 2'000.0);
    v = wheel(QPoint(0, 120), Qt::ShiftModifier);  // Shift+wheel up: earlier
    EXPECT_EQ(v.endNs - v.startNs, 2'000'000);
    EXPECT_NEAR(static_cast<double>(v.startNs), 2'000'000.0, 2'000.0);
    v = wheel(QPoint(0, 120));  // the wheel zooms in at the cursor
    EXPECT_LT(v.endNs - v.startNs, 2'000'000);
}

TEST(GuiWindow, ClickingAnOpShowsItsDetails) {
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    TimelineWidget* t = w.timeline();
    t->setViewport(0, t->data()->endNs / 8);  // zoomed in: all-gathers a few pixels wide
    t->repaint();
    // The first wide all-gather drawn: click its middle as a user would.
    const DrawRect* ag = nullptr;
    for (const auto& d : t->lastDrawList())
        if (d.kind == EventKind::AllGather && d.folded == 1 && d.x1 - d.x0 >= 4) {
            ag = &d;
            break;
        }
    ASSERT_NE(ag, nullptr);
    const int32_t op = ag->op;
    QSignalSpy spy(t, &TimelineWidget::eventSelected);
    const QPoint at(TimelineWidget::kLabelWidth + static_cast<int>((ag->x0 + ag->x1) / 2),
                    t->rowY(ag->row) + TimelineWidget::kRowHeight / 2);
    QTest::mouseClick(t, Qt::LeftButton, {}, at);
    ASSERT_EQ(spy.count(), 1);
    EXPECT_EQ(t->selectedOp(), op);
    const QString text = w.detailsPanel()->toPlainText();
    EXPECT_TRUE(text.contains("all-gather")) << text.toStdString();
    EXPECT_TRUE(text.contains("unit model.")) << text.toStdString();
    EXPECT_TRUE(text.contains("GB/s bus")) << text.toStdString();
    EXPECT_TRUE(text.contains("waited on")) << text.toStdString();
    // Esc clears it.
    QTest::keyClick(t, Qt::Key_Escape);
    EXPECT_EQ(t->selectedOp(), -1);
    EXPECT_TRUE(w.detailsPanel()->toPlainText().isEmpty());
}

TEST(GuiWindow, ShiftDragSelectsARangeAndShowsItsFigures) {
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    TimelineWidget* t = w.timeline();
    t->repaint();
    QSignalSpy spy(t, &TimelineWidget::rangeSelected);
    const int y = t->rowY(0) + 5;
    const int x0 = TimelineWidget::kLabelWidth + 100, x1 = TimelineWidget::kLabelWidth + 300;
    QTest::mousePress(t, Qt::LeftButton, Qt::ShiftModifier, QPoint(x0, y));
    QMouseEvent move(QEvent::MouseMove, QPointF(x1, y), t->mapToGlobal(QPointF(x1, y)),
                     Qt::LeftButton, Qt::LeftButton, Qt::ShiftModifier);
    QApplication::sendEvent(t, &move);
    QTest::mouseRelease(t, Qt::LeftButton, Qt::ShiftModifier, QPoint(x1, y));
    ASSERT_EQ(spy.count(), 1);
    const auto range = t->selectedRange();
    ASSERT_TRUE(range.has_value());
    EXPECT_GT(range->second, range->first);
    const auto stats = rangeStats(*t->data(), range->first, range->second);
    ASSERT_EQ(stats.size(), 1u);
    const QString text = w.detailsPanel()->toPlainText();
    EXPECT_TRUE(
        text.contains(QString("exposed communication: %1 ms")
                          .arg(static_cast<double>(stats[0].exposedCommNs) * 1e-6, 0, 'f', 3)))
        << text.toStdString();
    EXPECT_TRUE(text.contains(QString("overlap: %1%").arg(stats[0].overlapPercent(), 0, 'f', 1)))
        << text.toStdString();
}

TEST(GuiWindow, SearchBoxFindsOpsAndTheRangeTableAggregatesThem) {
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    TimelineWidget* t = w.timeline();
    QTest::keyClicks(w.searchEdit(), "layers.3 all-gather");
    const int n = t->searchMatches();
    ASSERT_GT(n, 0);
    EXPECT_EQ(w.searchLabel()->text(), QString("%1 match%2").arg(n).arg(n == 1 ? "" : "es"));
    QTest::keyClick(w.searchEdit(), Qt::Key_Return);
    EXPECT_EQ(w.searchLabel()->text(), QString("1 of %1").arg(n));
    ASSERT_GE(t->selectedOp(), 0);
    const QString details = w.detailsPanel()->toPlainText();
    EXPECT_TRUE(details.contains("model.layers.3")) << details.toStdString();
    EXPECT_TRUE(details.contains("all-gather")) << details.toStdString();
    QTest::keyClicks(w.searchEdit(), "zzz");
    EXPECT_EQ(w.searchLabel()->text(), "no match");
    // A range over the whole step: the details end with the per-name table.
    w.selectRange(0, t->data()->endNs);
    const QString range = w.detailsPanel()->toPlainText();
    EXPECT_TRUE(range.contains("By name")) << range.toStdString();
    // One row per op kind over all units ("model.layers.3 all-gather" counts as "all-gather").
    EXPECT_TRUE(range.contains("\n  all-gather ")) << range.toStdString();
    EXPECT_TRUE(range.contains("\n  backward ")) << range.toStdString();
    EXPECT_FALSE(range.contains("model.layers.3 all-gather")) << range.toStdString();
}

TEST(GuiWindow, CompareShowsThePlanAgainstItsWhatIfEdits) {
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    w.reshardBox()->setCurrentIndex(2);  // reshard False: no backward all-gathers
    w.showTab("compare");
    CompareView* c = w.compareView();
    ASSERT_EQ(c->sourceA()->count(), 2);
    // A stays on what it showed (the plan as written); B takes the new what-if step.
    EXPECT_TRUE(c->sourceA()->currentText().contains("as written"));
    EXPECT_TRUE(c->sourceB()->currentText().contains("what-if"));
    QTableWidget* table = c->table();
    auto rowOf = [&](const QString& name) {
        for (int r = 0; r < table->rowCount(); ++r)
            if (table->item(r, 0)->text().startsWith(name)) return r;
        return -1;
    };
    const int step = rowOf("step time");
    ASSERT_GE(step, 0);
    const auto& doc = w.document();
    EXPECT_EQ(
        table->item(step, 1)->text(),
        QString("%1 ms").arg(static_cast<double>(doc.baseSimulation->stepNs) * 1e-6, 0, 'f', 3));
    EXPECT_EQ(table->item(step, 2)->text(),
              QString("%1 ms").arg(static_cast<double>(doc.simulation->stepNs) * 1e-6, 0, 'f', 3));
    const int peak = rowOf("peak allocated");
    ASSERT_GE(peak, 0);
    EXPECT_EQ(table->item(peak, 2)->text().toStdString(),
              formatBytes(doc.simulation->peakAllocated));
    // Keeping parameters after forward costs memory: B (the what-if) needs more.
    EXPECT_TRUE(table->item(peak, 3)->text().startsWith("+"))
        << table->item(peak, 3)->text().toStdString();
    EXPECT_GT(c->unitTable()->rowCount(), 1);
    // Both timelines share one axis.
    c->timelineA()->setViewport(1000, 5'000'000);
    EXPECT_EQ(c->timelineB()->viewport().startNs, 1000);
    EXPECT_EQ(c->timelineB()->viewport().endNs, 5'000'000);
}

TEST(GuiWindow, RecommendSearchesInTheBackgroundLoadsAndExports) {
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(
        openAndWait(w, {sample("models/tiny-llama/config.json"),
                        sample("plans/tiny-llama-2rank.json"), sample("clusters/cpu-2core.json")}));
    RecommendView* r = w.recommendView();
    QSignalSpy done(r, &RecommendView::finished);
    r->start();
    EXPECT_TRUE(r->running());
    ASSERT_TRUE(done.wait(120000));
    ASSERT_NE(r->result(), nullptr);
    const auto& front = r->result()->pareto;
    ASSERT_FALSE(front.empty());
    EXPECT_EQ(r->table()->rowCount(), static_cast<int>(front.size()));
    EXPECT_GE(r->selected(), 0);  // starts on the recommendation
    // Each point of the front is on the scatter (fits or not).
    int points = 0;
    for (const auto& c : front)
        points += c.fits ? 1 : 0;
    EXPECT_EQ(r->paretoSeries()->count(), points);
    const std::string dir = shardscope::test::testTempDir() / "shardscope_gui_export";
    std::filesystem::create_directories(dir);
    const QString out = QString::fromStdString(dir + "/plan.fsdp2.json");
    ASSERT_TRUE(r->exportSelected(out, ExportFormat::Fsdp2).isEmpty());
    std::ifstream in(out.toStdString());
    const auto j = nlohmann::json::parse(in);
    EXPECT_TRUE(j.contains("format"));
    // Loading it puts it in the Plan tab and simulates it, without the what-if settings
    // made before (they used to carry over: the best plan showed slower and out of memory).
    w.reshardBox()->setCurrentIndex(2);
    const Plan chosen = front[static_cast<size_t>(r->selected())].plan;
    emit r->loadPlanRequested(std::make_shared<const Plan>(chosen));
    ASSERT_TRUE(w.document().plan);
    EXPECT_EQ(w.document().plan->name, chosen.name);
    ASSERT_TRUE(w.document().simulation);
    EXPECT_EQ(w.reshardBox()->currentIndex(), 0);
    EXPECT_EQ(w.document().simulation, w.document().baseSimulation);  // no what-if on top
}

TEST(GuiPlanEditor, TickingModulesAndWrapPoliciesEditThePlan) {
    MainWindow w;
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    const ModelGraph& g = *w.document().model;
    const size_t units = w.document().resolved->units.size();
    ModuleTreeModel* tree = w.treeModel();
    // Tick an MLP: it becomes a unit of its own, and the step is simulated again.
    const ModuleId norm = *g.findModule("model.layers.0.mlp");
    const QModelIndex normIdx = tree->indexOf(norm);
    EXPECT_EQ(tree->data(normIdx, Qt::CheckStateRole).toInt(), Qt::Unchecked);
    EXPECT_TRUE(tree->flags(normIdx) & Qt::ItemIsUserCheckable);
    tree->setData(normIdx, Qt::Checked, Qt::CheckStateRole);
    settle(w);
    ASSERT_TRUE(w.document().resolved);
    EXPECT_EQ(w.document().resolved->units.size(), units + 1);
    EXPECT_TRUE(w.document().resolved->findUnit("model.layers.0.mlp").has_value());
    EXPECT_EQ(tree->data(tree->indexOf(norm), Qt::CheckStateRole).toInt(), Qt::Checked);
    EXPECT_TRUE(w.document().simulation);
    EXPECT_TRUE(w.document().planEdited);
    EXPECT_TRUE(w.windowTitle().contains("(edited)"));
    // model.norm shares the unit "norm+head": ticking it alone would put it in two units,
    // which the plan refuses, and the edit with it.
    const Plan beforeNorm = *w.document().plan;
    tree->setData(tree->indexOf(*g.findModule("model.norm")), Qt::Unchecked, Qt::CheckStateRole);
    settle(w);
    EXPECT_EQ(*w.document().plan, beforeNorm);
    // Untick a block the class policy wrapped: the policy's other units stay, explicitly.
    const ModuleId l3 = *g.findModule("model.layers.3");
    tree->setData(tree->indexOf(l3), Qt::Unchecked, Qt::CheckStateRole);
    settle(w);
    EXPECT_EQ(w.document().resolved->units.size(), units);
    EXPECT_FALSE(w.document().resolved->findUnit("model.layers.3").has_value());
    EXPECT_TRUE(w.document().resolved->findUnit("model.layers.4").has_value());
    EXPECT_EQ(w.document().plan->wrap.kind, WrapPolicySpec::Kind::None);
    EXPECT_FALSE(w.document().resolved->hasErrors());
    // A class policy from the wrap row: one unit per MLP on top of the explicit ones.
    w.wrapKindBox()->setCurrentIndex(2);
    w.wrapArgEdit()->setText("LlamaMLP");
    w.applyWrapPolicy();
    settle(w);
    EXPECT_FALSE(w.wrapErrorLabel()->isVisibleTo(&w));
    EXPECT_TRUE(w.document().resolved->findUnit("model.layers.3.mlp").has_value());
    // An invalid pattern is explained inline and changes nothing.
    const Plan before = *w.document().plan;
    w.wrapKindBox()->setCurrentIndex(3);
    w.wrapArgEdit()->setText("layers.(");
    w.applyWrapPolicy();
    settle(w);
    EXPECT_TRUE(w.wrapErrorLabel()->isVisibleTo(&w));
    EXPECT_FALSE(w.wrapErrorLabel()->text().isEmpty());
    EXPECT_EQ(*w.document().plan, before);
    // Saved and read back: the same plan.
    const std::string out = shardscope::test::testTempDir() / "shardscope_edited_plan.json";
    ASSERT_TRUE(w.savePlan(QString::fromStdString(out)).isEmpty());
    const LoadedFile back = loadFile(QString::fromStdString(out));
    ASSERT_TRUE(back.error.isEmpty()) << back.error.toStdString();
    EXPECT_EQ(back.plan->units, w.document().plan->units);
}

TEST(GuiPlanEditor, ReshardCellsEditOneUnit) {
    MainWindow w;
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    UnitTableModel* units = w.unitModel();
    const auto& r = *w.document().resolved;
    size_t l5 = 0;
    for (size_t i = 0; i < r.units.size(); ++i)
        if (r.units[i].name == "model.layers.5") l5 = i;
    ASSERT_GT(l5, 0u);
    const QModelIndex cell = units->index(static_cast<int>(l5), UnitTableModel::Reshard);
    EXPECT_TRUE(units->flags(cell) & Qt::ItemIsEditable);
    const int64_t step = w.document().simulation->stepNs;
    units->setData(cell, "False");
    settle(w);
    const auto& edited = *w.document().resolved;
    EXPECT_EQ(edited.units[l5].reshard, Reshard::False);
    EXPECT_EQ(edited.units[l5 + 1].reshard, Reshard::True);  // only that unit
    EXPECT_NE(w.document().simulation->stepNs, step);
    units->setData(units->index(static_cast<int>(l5), UnitTableModel::Reshard), "8");
    settle(w);
    EXPECT_EQ(w.document().resolved->units[l5].reshard, Reshard::Int);
    EXPECT_EQ(w.document().resolved->units[l5].reshardK, 8);
    // Not a setting: refused with the reason, plan unchanged.
    const Plan before = *w.document().plan;
    units->setData(units->index(static_cast<int>(l5), UnitTableModel::Reshard), "sometimes");
    settle(w);
    EXPECT_EQ(*w.document().plan, before);
    EXPECT_TRUE(w.wrapErrorLabel()->text().contains("expected True, False or a group size"));
}

TEST(GuiPlanEditor, PrefetchListsMeshPrecisionAndOffload) {
    MainWindow w;
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    UnitTableModel* units = w.unitModel();
    const auto& r = *w.document().resolved;
    size_t l2 = 0;
    for (size_t i = 0; i < r.units.size(); ++i)
        if (r.units[i].name == "model.layers.2") l2 = i;
    ASSERT_GT(l2, 0u);
    auto cell = [&](int col) { return units->index(static_cast<int>(l2), col); };
    EXPECT_EQ(units->data(cell(UnitTableModel::ForwardPrefetch)).toString(), "implicit");
    // An explicit forward prefetch list of two units, chosen by name.
    units->setData(cell(UnitTableModel::ForwardPrefetch), "model.layers.3, model.layers.4");
    settle(w);
    const auto& u = w.document().resolved->units[l2];
    EXPECT_TRUE(u.explicitForwardPrefetch);
    ASSERT_EQ(u.forwardPrefetch.size(), 2u);
    EXPECT_EQ(w.document().resolved->units[u.forwardPrefetch[0].index()].name, "model.layers.3");
    EXPECT_EQ(units->data(cell(UnitTableModel::ForwardPrefetch)).toString(),
              "model.layers.3, model.layers.4");
    // An unknown unit is refused, with the resolver's reason.
    const Plan before = *w.document().plan;
    units->setData(cell(UnitTableModel::ForwardPrefetch), "model.layers.99");
    settle(w);
    EXPECT_EQ(*w.document().plan, before);
    EXPECT_TRUE(w.wrapErrorLabel()->text().contains("model.layers.99"))
        << w.wrapErrorLabel()->text().toStdString();
    // Back to implicit.
    units->setData(cell(UnitTableModel::ForwardPrefetch), "implicit");
    settle(w);
    EXPECT_FALSE(w.document().resolved->units[l2].explicitForwardPrefetch);

    // Plan-wide: an 8 x 8 HSDP mesh, fp32 parameters, CPU offload.
    EXPECT_EQ(w.paramDtypeBox()->currentText(), "bfloat16");  // the plan's, shown
    w.meshEdit()->setText("8,8");
    w.paramDtypeBox()->setCurrentText("float32");
    w.offloadBox()->setChecked(true);
    w.applyPlanWide();
    settle(w);
    const auto& hsdp = *w.document().resolved;
    EXPECT_TRUE(hsdp.hsdp);
    EXPECT_EQ(hsdp.shardSize, 8);
    EXPECT_EQ(hsdp.units[1].allGatherDtype, DType::Float32);
    EXPECT_TRUE(hsdp.units[1].offload.enabled);
    EXPECT_TRUE(w.document().simulation);
    // A mesh that does not match the cluster's 64 devices is refused inline.
    const Plan good = *w.document().plan;
    w.meshEdit()->setText("3,5");
    w.applyPlanWide();
    settle(w);
    EXPECT_EQ(*w.document().plan, good);
    EXPECT_TRUE(w.wrapErrorLabel()->isVisibleTo(&w));
    w.meshEdit()->setText("eight");
    w.applyPlanWide();
    settle(w);
    EXPECT_TRUE(w.wrapErrorLabel()->text().contains("mesh: expected"));
}

TEST(GuiWindow, LaunchToKernelFlowsOnRequest) {
    const std::string path = shardscope::test::writeLaunchFlowTrace("shardscope_gui_flows.json");
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openAndWait(w, {QString::fromStdString(path)}));
    TimelineWidget* t = w.timeline();
    EXPECT_EQ(t->visibleRows().size(), 1u);  // the stream; launches hidden until asked for
    ASSERT_TRUE(w.flowsBox()->isEnabled());
    w.flowsBox()->setChecked(true);
    ASSERT_EQ(t->visibleRows().size(), 2u);
    EXPECT_TRUE(t->visibleRows()[1]->host);
    t->repaint();
    EXPECT_EQ(t->lastFlowCount(), 2u);
    // A kernel's details name the launch it waited for.
    int32_t relu = -1;
    for (const auto& r : t->data()->rows)
        for (const auto& e : r.events)
            if (e.label == "relu") relu = e.op;
    ASSERT_GE(relu, 0);
    const std::string text = t->data()->describe(relu);
    EXPECT_NE(text.find("launched by cudaLaunchKernel at 0.200 ms"), std::string::npos) << text;
    EXPECT_NE(text.find("queued 0.020 ms"), std::string::npos) << text;
    // The launches are not device work: the range figures leave them out.
    const auto st = rangeStats(*t->data(), 0, t->data()->endNs);
    EXPECT_EQ(st[0].busyNs, 250'000);  // the two kernels
    w.flowsBox()->setChecked(false);
    t->repaint();
    EXPECT_EQ(t->lastFlowCount(), 0u);
    std::filesystem::remove(path);
}

TEST(GuiPlanEditor, PerUnitCheckpointingPrecisionAndOffload) {
    MainWindow w;
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    UnitTableModel* units = w.unitModel();
    size_t l5 = 0;
    for (size_t i = 0; i < w.document().resolved->units.size(); ++i)
        if (w.document().resolved->units[i].name == "model.layers.5") l5 = i;
    ASSERT_GT(l5, 0u);
    auto edit = [&](int column, const char* value) {
        units->setData(units->index(static_cast<int>(l5), column), value);
        settle(w);
    };
    const int64_t step = w.document().simulation->stepNs;
    edit(UnitTableModel::Checkpointing, "full");
    EXPECT_EQ(w.document().resolved->units[l5].activationCheckpointing, AcMode::Full);
    EXPECT_EQ(w.document().resolved->units[l5 + 1].activationCheckpointing, AcMode::None);
    EXPECT_GT(w.document().simulation->stepNs, step);  // its forward runs twice
    edit(UnitTableModel::Precision, "float32 / float32");
    EXPECT_EQ(w.document().resolved->units[l5].allGatherDtype, DType::Float32);
    EXPECT_EQ(w.document().resolved->units[l5 + 1].allGatherDtype, DType::BFloat16);
    edit(UnitTableModel::Offload, "yes");
    EXPECT_TRUE(w.document().resolved->units[l5].offload.enabled);
    EXPECT_EQ(units->data(units->index(static_cast<int>(l5), UnitTableModel::Offload)).toString(),
              "yes");
    const Plan before = *w.document().plan;
    edit(UnitTableModel::Precision, "bf17 / float32");
    EXPECT_EQ(*w.document().plan, before);
    EXPECT_TRUE(w.wrapErrorLabel()->text().contains("mixed_precision: expected"));
    edit(UnitTableModel::Checkpointing, "sometimes");
    EXPECT_TRUE(w.wrapErrorLabel()->text().contains("activation_checkpointing: expected"));
    EXPECT_EQ(*w.document().plan, before);
}

TEST(GuiWindow, CancellingALoadOpensNothing) {
    // A trace large enough that the import is still running when Cancel is pressed.
    const std::string path =
        shardscope::test::writeKernelTrace("shardscope_gui_cancel.json", 200000);
    MainWindow w;
    w.show();
    auto done = std::make_shared<bool>(false);
    w.openFiles({QString::fromStdString(path)}, [done] { *done = true; });
    EXPECT_TRUE(w.loading());
    w.cancelLoading();
    ASSERT_TRUE(QTest::qWaitFor([&] { return *done; }, 30000));
    EXPECT_FALSE(w.loading());
    EXPECT_TRUE(w.document().traces.empty());
    EXPECT_FALSE(w.document().lastTrace());
    EXPECT_TRUE(w.problemList()->findItems("cancelled", Qt::MatchContains).isEmpty());
    // Opening it again, not cancelled, works.
    ASSERT_TRUE(openAndWait(w, {QString::fromStdString(path)}, 60000));
    EXPECT_EQ(w.document().traces.size(), 1u);
    std::filesystem::remove(path);
}

int main(int argc, char** argv) {
    if (qgetenv("QT_QPA_PLATFORM").isEmpty()) qputenv("QT_QPA_PLATFORM", "offscreen");
    qputenv("SHARDSCOPE_GUI_NO_DIALOGS", "1");  // errors go to the problem list, not to dialogs
    QApplication app(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}

TEST(DrawList, NestedSlicesGetOneRowPerDepthAndParentsStayVisibleWhenZoomed) {
    // A CPU thread's slices nest: a step encloses a hook, which encloses ops. They used to
    // share one row, and zooming into a child lost its parent (the visible-range search
    // assumes that ends are sorted, which nesting breaks).
    std::vector<TimelineRow> rows(1);
    rows[0].name = "thread 1";
    auto ev = [](int64_t a, int64_t b, const char* label) {
        return TimelineEvent{a, b, EventKind::Compute, -1, label, -1};
    };
    rows[0].events = {ev(0, 1000, "ProfilerStep#1"), ev(10, 500, "FSDP::pre_forward"),
                      ev(20, 30, "aten::mm"),        ev(40, 60, "aten::add"),
                      ev(600, 900, "optimizer"),     ev(610, 620, "aten::mul")};
    std::vector<TimelineRow> flat = rows;
    sortEventsByStart(flat);
    Viewport v;
    v.startNs = 611;
    v.endNs = 619;
    v.widthPx = 800;
    // In one row, zoomed into the multiply: the step that encloses it is not drawn.
    const auto before = buildDrawList(flat, v);
    EXPECT_TRUE(std::none_of(before.begin(), before.end(),
                             [](const DrawRect& d) { return d.label == "ProfilerStep#1"; }));
    splitNestedRows(rows);
    sortEventsByStart(rows);
    ASSERT_EQ(rows.size(), 3u);
    for (int d = 0; d < 3; ++d) {
        EXPECT_EQ(rows[static_cast<size_t>(d)].depth, d);
        EXPECT_EQ(rows[static_cast<size_t>(d)].name, "thread 1");
    }
    EXPECT_EQ(rows[0].events.size(), 1u);  // the step
    EXPECT_EQ(rows[1].events.size(), 2u);  // the hook and the optimizer
    EXPECT_EQ(rows[2].events.size(), 3u);  // the ops
    const auto list = buildDrawList(rows, v);
    std::set<std::string> shown;
    for (const auto& d : list)
        shown.insert(d.label);
    // The step, the optimizer and the multiply, each in its own row.
    EXPECT_EQ(shown, (std::set<std::string>{"ProfilerStep#1", "optimizer", "aten::mul"}));
    std::set<int> rowsShown;
    for (const auto& d : list)
        rowsShown.insert(d.row);
    EXPECT_EQ(rowsShown, (std::set<int>{0, 1, 2}));
    // Rows without overlap are left alone.
    std::vector<TimelineRow> plain(1);
    plain[0].events = {ev(0, 10, "a"), ev(10, 20, "b")};
    splitNestedRows(plain);
    EXPECT_EQ(plain.size(), 1u);
}

TEST(GuiWindow, ExposedPartsOfCollectivesAreHatchedAndAddUpToTheSimulation) {
    // Each collective's exposed parts (no compute ran meanwhile) are kept per op and drawn
    // hatched. Per unit they add up to the simulator's own exposed communication.
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    const auto& tl = w.document().timeline;
    const auto& sim = w.document().simulation;
    ASSERT_TRUE(tl && sim);
    ASSERT_FALSE(tl->exposed.empty());
    std::map<int32_t, int64_t> byUnit;
    int partly = 0;
    for (const auto& r : tl->rows)
        for (const auto& e : r.events) {
            const auto it = tl->exposed.find(e.op);
            if (it == tl->exposed.end()) continue;
            int64_t ns = 0;
            for (const auto& [a, b] : it->second) {
                EXPECT_TRUE(e.start <= a && a < b && b <= e.end);
                ns += b - a;
            }
            byUnit[e.unit] += ns;
            partly += ns < e.end - e.start ? 1 : 0;
        }
    EXPECT_GT(partly, 0);  // prefetched all-gathers: hidden in part
    for (size_t u = 0; u < sim->units.size(); ++u)
        EXPECT_EQ(byUnit[static_cast<int32_t>(u)], sim->units[u].exposedCommNs) << "unit " << u;
    // The tooltip of an exposed collective says how much of it was exposed.
    w.timeline()->repaint();
    for (const auto& d : w.timeline()->lastDrawList())
        if (d.folded == 1 && tl->exposed.count(d.op)) {
            const QString tip = w.timeline()->tooltipAt(
                QPointF(TimelineWidget::kLabelWidth + (d.x0 + d.x1) / 2,
                        w.timeline()->rowY(d.row) + TimelineWidget::kRowHeight / 2));
            EXPECT_TRUE(tip.contains("exposed")) << tip.toStdString();
            break;
        }
}

TEST(GuiTimeline, TheSelectedOpShowsWhatItWaitedOnAsArrows) {
    // A layer's all-gather waits on its copy-in and on an earlier op (the step program's
    // events): selecting it draws an arrow from each of those ops' end to its start.
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    const auto& tl = w.document().timeline;
    ASSERT_TRUE(tl);
    int32_t op = -1;
    size_t waits = 0;
    for (const auto& r : tl->rows)
        for (const auto& e : r.events)
            if (op < 0 && e.kind == EventKind::AllGather && tl->waits.count(e.op) &&
                tl->waits.at(e.op).size() >= 2) {
                op = e.op;
                waits = tl->waits.at(e.op).size();
            }
    ASSERT_GE(op, 0);
    w.timeline()->selectOp(op);
    w.timeline()->fitSelection();
    w.timeline()->setViewport(0, tl->endNs);
    w.timeline()->repaint();
    EXPECT_EQ(w.timeline()->lastDependencyCount(), waits);
    w.timeline()->clearSelection();
    w.timeline()->repaint();
    EXPECT_EQ(w.timeline()->lastDependencyCount(), 0u);
}

TEST(GuiWindow, EveryRanksMemoryCounterIsDrawnWithAHoverReadout) {
    // A 2-rank `shardscope run --trace` file: each rank's process has its "memory (bytes)"
    // counter. The chart used to show rank 0's only, unnamed; now a line per rank, named in
    // the legend, and the hover reads every rank's value at the cursor.
    using J = nlohmann::json;
    J ev = J::array();
    for (int rank = 0; rank < 2; ++rank) {
        const int pid = rank + 1;
        ev.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", pid},
                      {"args", {{"name", "rank " + std::to_string(rank) + " (measured)"}}}});
        ev.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", pid},
                      {"tid", 1000},
                      {"args", {{"name", "compute"}}}});
        ev.push_back({{"ph", "X"},
                      {"name", "model.layers.0 forward"},
                      {"cat", "compute"},
                      {"pid", pid},
                      {"tid", 1000},
                      {"ts", 0.0},
                      {"dur", 100.0},
                      {"args", {{"op_id", 0}, {"kind", "forward"}, {"step", 1}}}});
        for (int i = 0; i < 3; ++i)
            ev.push_back({{"ph", "C"},
                          {"name", "memory (bytes)"},
                          {"pid", pid},
                          {"tid", 1101},
                          {"ts", 10.0 + 40.0 * i},
                          {"args", {{"allocated", (rank + 1) * 1048576 * (i + 1)}}}});
    }
    const std::string path =
        (shardscope::test::testTempDir() / "shardscope_gui_two_rank_memory.json").string();
    std::ofstream(path) << J{
        {"traceEvents", ev},
        {"displayTimeUnit", "ns"},
        {"metadata",
         {{"producer", "shardscope run"},
          {"rank_pid_offset", 1},
          {"world_size", 2}}}}.dump();
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openAndWait(w, {QString::fromStdString(path)}, 30000));
    const auto& series = w.memoryChart()->series();
    ASSERT_EQ(series.size(), 2u);
    EXPECT_EQ(series[0].name, "rank 0");
    EXPECT_EQ(series[1].name, "rank 1");
    EXPECT_EQ(series[1].points.back().second, 2 * 3 * 1048576);
    // Half-way through the trace (after the second sample): rank 0 2 MiB, rank 1 4 MiB.
    w.timeline()->setViewport(0, 100000);
    const double left = TimelineWidget::kLabelWidth;
    const double x = left + (w.memoryChart()->width() - left) * 0.6;
    const QString r = w.memoryChart()->readoutAt(x);
    EXPECT_TRUE(r.contains("rank 0: 2.00 MiB")) << r.toStdString();
    EXPECT_TRUE(r.contains("rank 1: 4.00 MiB")) << r.toStdString();
    EXPECT_TRUE(w.memoryChart()->readoutAt(left - 10).isEmpty());
}

TEST(GuiWindow, ZoomSurvivesEditsAndTheTitleSaysWhatIsShown) {
    // Edits and what-ifs re-simulate the same step: the zoom used to reset on every one.
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    EXPECT_EQ(w.windowTitle(), "ShardScope - config.json - llama-per-block.json");
    w.timeline()->setViewport(2000000, 9000000);
    w.reshardBox()->setCurrentIndex(2);  // what if: reshard_after_forward False
    EXPECT_EQ(w.timeline()->viewport().startNs, 2000000);
    EXPECT_EQ(w.timeline()->viewport().endNs, 9000000);
    EXPECT_EQ(w.windowTitle(), "ShardScope - config.json - llama-per-block.json + what-if");
    w.reshardBox()->setCurrentIndex(0);  // as planned
    EXPECT_EQ(w.timeline()->viewport().startNs, 2000000);
    EXPECT_EQ(w.windowTitle(), "ShardScope - config.json - llama-per-block.json");
    // A trace opened on top: the timeline fits it, and the title names it.
    const std::string path =
        (shardscope::test::testTempDir() / "shardscope_gui_title.pt.trace.json").string();
    std::ofstream(path) << R"({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "gemm",
        "pid": 1, "tid": 7, "ts": 1.0, "dur": 2.0, "args": {"stream": 7}}]})";
    ASSERT_TRUE(openAndWait(w, {QString::fromStdString(path)}, 30000));
    EXPECT_EQ(w.windowTitle(), "ShardScope - shardscope_gui_title.pt.trace.json (trace)");
    EXPECT_LT(w.timeline()->viewport().endNs, 2000000);
}

TEST(GuiWindow, LoadingAPlanStartsFromThatPlanNotTheLastWhatIf) {
    // "Load in the Plan tab" after a recommendation kept the what-if settings made before:
    // the best plan showed as slower and out of memory. A loaded plan now resets them.
    MainWindow fresh;
    ASSERT_TRUE(openAndWait(fresh, llamaOnH100("plans/llama-hsdp-prefetch.json")));
    ASSERT_TRUE(fresh.document().simulation);
    const int64_t expected = fresh.document().simulation->stepNs;

    MainWindow w;
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    w.reshardBox()->setCurrentIndex(2);  // what if: False
    w.forwardPrefetchBox()->setValue(2);
    ASSERT_TRUE(openAndWait(w, {sample("plans/llama-hsdp-prefetch.json")}));
    ASSERT_TRUE(w.document().simulation);
    EXPECT_EQ(w.document().simulation->stepNs, expected);
    EXPECT_EQ(w.reshardBox()->currentIndex(), 0);
    EXPECT_EQ(w.forwardPrefetchBox()->value(), 0);
    EXPECT_FALSE(w.windowTitle().contains("what-if")) << w.windowTitle().toStdString();
}

TEST(GuiTimeline, APinnedTrackStaysUnderTheAxisWhileTheTracksScroll) {
    // Perfetto's pinning: click a track's name and it is also drawn in a band under the time
    // axis, which stays on screen while the tracks scroll (to set rank 7's compute beside
    // rank 0's, say). Clicking its name in the band unpins it.
    const std::string path = syntheticTrace("shardscope_gui_pin.pt.trace.json", 8, 8, 20000);
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(openAndWait(w, {QString::fromStdString(path)}, 30000));
    QApplication::processEvents();
    TimelineWidget* t = w.timeline();
    const int last = static_cast<int>(t->visibleRows().size()) - 1;  // rank 7's last stream
    const TimelineRow* target = t->visibleRows()[static_cast<size_t>(last)];
    ASSERT_TRUE(target);
    QScrollBar* bar = w.timelineScroll()->verticalScrollBar();
    bar->setValue(bar->maximum());
    QApplication::processEvents();
    const int y = t->rowY(last) + TimelineWidget::kRowHeight / 2;
    EXPECT_TRUE(t->tooltipAt(QPointF(20, y)).contains("pin"));
    QTest::mouseClick(t, Qt::LeftButton, {}, QPoint(20, y));
    ASSERT_EQ(t->pinnedRows().size(), 1u);
    EXPECT_EQ(&t->data()->rows[static_cast<size_t>(t->pinnedRows()[0])], target);
    // Back to the top: the pinned track is in the band under the axis, with its events.
    bar->setValue(0);
    QApplication::processEvents();
    t->repaint();
    const int band = TimelineWidget::kTop + TimelineWidget::kRowHeight / 2;
    EXPECT_EQ(t->pinnedAt(band), 0);
    const QString tip = t->tooltipAt(QPointF(TimelineWidget::kLabelWidth + 400, band));
    EXPECT_FALSE(tip.isEmpty());
    EXPECT_TRUE(tip.contains(QString::fromStdString(target->group))) << tip.toStdString();
    // Scrolled half-way, the band is still right under the visible top.
    bar->setValue(bar->maximum() / 2);
    QApplication::processEvents();
    const int top = t->visibleRegion().boundingRect().top();
    EXPECT_EQ(t->pinnedAt(top + band), 0);
    // Its name in the band unpins it.
    QTest::mouseClick(t, Qt::LeftButton, {}, QPoint(20, top + band));
    EXPECT_TRUE(t->pinnedRows().empty());
    std::filesystem::remove(path);
}

TEST(GuiWindow, ComparePutsAMeasuredTraceBesideThePlanAsItIsEdited) {
    // Side by side: a measured trace (A) and the plan's simulated step (B). A plan edit
    // re-simulates B; A, the trace, stays as it was, and so does the shared zoom.
    const std::string path = syntheticTrace("shardscope_gui_side.pt.trace.json", 1, 2, 2000);
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(openLlamaPlanAndTrace(w, path));
    w.showTab("compare");
    CompareView* c = w.compareView();
    const int trace = c->sourceA()->findText("trace: shardscope_gui_side.pt.trace.json");
    ASSERT_GE(trace, 0);
    c->sourceA()->setCurrentIndex(trace);
    c->sourceB()->setCurrentIndex(
        c->sourceB()->findText("simulated: llama-per-block.json as written"));
    ASSERT_TRUE(c->sourceB()->currentText().endsWith("as written"))
        << c->sourceB()->currentText().toStdString();
    const auto traceData = c->timelineA()->data();
    const auto before = c->timelineB()->data();
    ASSERT_TRUE(traceData && before);
    c->timelineA()->setViewport(1'000'000, 5'000'000);
    // A plan edit: layers.5 keeps its parameters after forward.
    UnitTableModel* units = w.unitModel();
    const auto& r = *w.document().resolved;
    size_t l5 = 0;
    for (size_t i = 0; i < r.units.size(); ++i)
        if (r.units[i].name == "model.layers.5") l5 = i;
    ASSERT_GT(l5, 0u);
    units->setData(units->index(static_cast<int>(l5), UnitTableModel::Reshard), "False");
    settle(w);
    EXPECT_EQ(c->timelineA()->data(), traceData);  // the measured side stays
    ASSERT_TRUE(c->timelineB()->data());
    EXPECT_NE(c->timelineB()->data(), before);  // the simulated side follows the edit
    EXPECT_TRUE(c->sourceB()->currentText().endsWith("as written"));
    EXPECT_EQ(c->timelineA()->viewport().startNs, 1'000'000);
    EXPECT_EQ(c->timelineB()->viewport().endNs, 5'000'000);
    std::filesystem::remove(path);
}

TEST(GuiWindow, OpensAFolderOfPerRankTracesOnOneTimeAxis) {
    // torch.profiler writes one file per rank into a folder; the CLI reads the folder, and
    // so does the app now: every rank in its group, the ranks' clocks aligned.
    const auto dir = shardscope::test::testTempDir() / "shardscope_gui_rank_folder";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    using J = nlohmann::json;
    for (int rank = 0; rank < 2; ++rank) {
        J ev = J::array();
        const double t0 = 1'000'000.0 + 100.0 * rank;  // rank 1 starts 100 us later
        ev.push_back({{"ph", "X"},
                      {"cat", "kernel"},
                      {"name", "gemm"},
                      {"pid", 1},
                      {"tid", 7},
                      {"ts", t0},
                      {"dur", 50.0},
                      {"args", {{"stream", 7}}}});
        ev.push_back({{"ph", "X"},
                      {"cat", "kernel"},
                      {"name", "gemm"},
                      {"pid", 1},
                      {"tid", 7},
                      {"ts", t0 + 60},
                      {"dur", 20.0},
                      {"args", {{"stream", 7}}}});
        writeRankTrace(dir / ("rank" + std::to_string(rank) + ".pt.trace.json"), rank, 2, ev);
    }
    std::ofstream(dir / "record.json") << "{}";  // not a trace: skipped
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    const OpenedTrace* tr = openTrace(w, dir.string());
    ASSERT_TRUE(tr && tr->timeline);
    std::map<std::string, int64_t> firstStart;
    for (const auto& r : tr->timeline->rows)
        for (const auto& e : r.events)
            if (!firstStart.count(r.group) || e.start < firstStart[r.group])
                firstStart[r.group] = e.start;
    ASSERT_EQ(firstStart.size(), 2u);
    EXPECT_EQ(firstStart["rank 1"] - firstStart["rank 0"], 100000);
    // Each rank's ops keep their details: one click on rank 1's first kernel names it.
    int32_t op1 = -1;
    for (const auto& r : tr->timeline->rows)
        if (r.group == "rank 1") op1 = r.events.front().op;
    ASSERT_GE(op1, 0);
    EXPECT_NE(tr->timeline->describe(op1).find("gemm"), std::string::npos);
    std::filesystem::remove_all(dir);
}

TEST(GuiWindow, AFolderOfFsdpRanksSaysWhoWaitedForItsPeer) {
    // Two ranks of an FSDP2 job: rank 1 reaches the all-gather 30 us after rank 0 and both
    // finish it together. Rank 0's all-gather says it waited 0.03 ms for a peer; rank 1's
    // says nothing of the kind (the wait, `trace overlap`'s PEER WAIT: peer_wait.h).
    const auto dir = shardscope::test::testTempDir() / "shardscope_gui_fsdp_ranks";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    for (int rank = 0; rank < 2; ++rank)
        writeRankTrace(dir / ("rank" + std::to_string(rank) + ".pt.trace.json"), rank, 2,
                       fsdpCpuStepEvents(12 + 30 * rank, 60 - 30 * rank));
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    const OpenedTrace* tr = openTrace(w, dir.string());
    ASSERT_TRUE(tr && tr->timeline);
    std::map<std::string, std::string> gatherOf;  // rank group -> its all-gather's label
    for (const auto& r : tr->timeline->rows)
        if (r.name == "FSDP all-gathers" && !r.events.empty())
            gatherOf[r.group] = r.events[0].label;
    ASSERT_EQ(gatherOf.size(), 2u);
    EXPECT_EQ(gatherOf["rank 0"],
              "model.layers.0 all-gather (forward, 0.06 ms exposed, 0.03 ms waiting for a peer)");
    EXPECT_EQ(gatherOf["rank 1"], "model.layers.0 all-gather (forward, 0.03 ms exposed)");
    std::filesystem::remove_all(dir);
}

TEST(GuiWindow, EditsAndWhatIfsShowTheirStepEvenOverAnOpenedTrace) {
    // With a trace opened last, plan edits and what-ifs used to change nothing visible: the
    // timeline kept showing the trace. They now show the re-simulated step; the trace stays
    // in Compare.
    const std::string path = syntheticTrace("shardscope_gui_over.pt.trace.json", 1, 2, 500);
    MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(openLlamaPlanAndTrace(w, path));
    ASSERT_TRUE(w.document().lastTrace());
    EXPECT_EQ(w.timeline()->data(), w.document().lastTrace()->timeline);  // the trace, last
    w.reshardBox()->setCurrentIndex(2);                                   // what if: False
    EXPECT_EQ(w.timeline()->data(), w.document().timeline);
    EXPECT_TRUE(w.windowTitle().contains("what-if")) << w.windowTitle().toStdString();
    // Back to the trace, then a plan edit: the edited step shows.
    ASSERT_TRUE(openAndWait(w, {QString::fromStdString(path)}, 30000));
    EXPECT_EQ(w.timeline()->data(), w.document().lastTrace()->timeline);
    UnitTableModel* units = w.unitModel();
    const auto& r = *w.document().resolved;
    size_t l5 = 0;
    for (size_t i = 0; i < r.units.size(); ++i)
        if (r.units[i].name == "model.layers.5") l5 = i;
    ASSERT_GT(l5, 0u);
    units->setData(units->index(static_cast<int>(l5), UnitTableModel::Reshard), "False");
    settle(w);
    EXPECT_EQ(w.timeline()->data(), w.document().timeline);
    EXPECT_TRUE(w.windowTitle().contains("(edited)")) << w.windowTitle().toStdString();
    bool traceInCompare = false;
    for (const auto& s : w.document().compareSources())
        traceInCompare = traceInCompare || s.name.startsWith("trace: ");
    EXPECT_TRUE(traceInCompare);
    std::filesystem::remove(path);
}

TEST(GuiWindow, AnFsdp1TraceGetsItsUnitsTrackToo) {
    // FSDP1 names no unit in its labels: each FullyShardedDataParallel.forward range is one,
    // numbered as `trace overlap` numbers them (the root 0, the nested ones in order).
    using J = nlohmann::json;
    auto x = [](const std::string& name, double ts, double dur) {
        return J{{"ph", "X"},    {"cat", "user_annotation"},
                 {"name", name}, {"pid", 9},
                 {"tid", 1},     {"ts", ts},
                 {"dur", dur}};
    };
    J ev = J::array();
    ev.push_back(x("ProfilerStep#1", 0, 2000));
    ev.push_back(x("FullyShardedDataParallel.forward", 10, 900));
    ev.push_back(x("FullyShardedDataParallel.forward", 50, 200));
    ev.push_back(x("FullyShardedDataParallel.forward", 300, 250));
    ev.push_back(x("FullyShardedDataParallel._pre_backward_hook", 1000, 5));
    const std::string path =
        (shardscope::test::testTempDir() / "shardscope_gui_fsdp1.pt.trace.json").string();
    writeRankTrace(path, 0, 2, ev);
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openAndWait(w, {QString::fromStdString(path)}, 30000));
    const OpenedTrace* tr = w.document().lastTrace();
    ASSERT_TRUE(tr && tr->fsdp);
    EXPECT_EQ(tr->fsdp->api, "fsdp1");
    std::vector<std::string> labels;
    for (const auto& r : tr->timeline->rows)
        if (r.name == "FSDP units")
            for (const auto& e : r.events)
                labels.push_back(e.label);
    std::sort(labels.begin(), labels.end());
    EXPECT_EQ(labels,
              (std::vector<std::string>{"unit 0 forward", "unit 1 forward", "unit 2 forward"}));
    std::filesystem::remove(path);
}

TEST(GuiWindow, TheZoomedMemoryChartStaysOutOfItsLabelColumn) {
    // Zoomed in, the memory before the view used to be drawn over the chart's labels.
    MainWindow w;
    w.resize(1200, 800);
    w.show();
    ASSERT_TRUE(openAndWait(w, llamaOnH100("plans/llama-per-block.json")));
    const int64_t end = w.document().simulation->stepNs;
    w.timeline()->setViewport(end / 2, end / 2 + end / 10);  // long after memory starts
    QApplication::processEvents();
    const QImage img = w.memoryChart()->grab().toImage();
    // The label column's right edge, in the plot's height: no fill of any category there.
    const int x = TimelineWidget::kLabelWidth - 4;
    int filled = 0;
    for (int y = 10; y < img.height() - 24; ++y) {
        const QColor c = img.pixelColor(x, y);
        filled += (c.red() < 200 || c.green() < 200 || c.blue() < 200) ? 1 : 0;
    }
    EXPECT_EQ(filled, 0);
}
