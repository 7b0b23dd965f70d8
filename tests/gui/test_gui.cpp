// SPDX-License-Identifier: Apache-2.0
// GUI tests, offscreen: item models under QAbstractItemModelTester, and the main window
// opening the samples as a user would, checked by what it shows.
#include <gtest/gtest.h>

#include <QAbstractItemModelTester>
#include <QApplication>
#include <QListWidget>
#include <QSignalSpy>
#include <QTest>

#include "gui/app/document.h"
#include "gui/app/main_window.h"
#include "gui/models/module_tree_model.h"
#include "gui/models/unit_table_model.h"
#include "tests/support/golden.h"

using namespace shardscope;
using namespace shardscope::gui;
using shardscope::test::samplePath;

namespace {

QString sample(const char* rel) {
    return QString::fromStdString(samplePath(rel));
}

Document openSamples() {
    Document d;
    for (const char* f : {"models/llama3-8b/config.json", "plans/llama-per-block.json",
                          "clusters/h100-sxm-8x8.json"}) {
        const LoadedFile lf = loadFile(sample(f));
        EXPECT_TRUE(lf.error.isEmpty()) << lf.error.toStdString();
        d.apply(lf);
    }
    return d;
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
    qputenv("SHARDSCOPE_GUI_NO_DIALOGS", "1");
    MainWindow w;
    bool done = false;
    // A plan whose mesh disagrees with the cluster: the window must list the error.
    w.openFiles({sample("models/tiny-llama/config.json"), sample("plans/tiny-llama-2rank.json"),
                 sample("clusters/h100-sxm-8x8.json")},
                [&] { done = true; });
    ASSERT_TRUE(QTest::qWaitFor([&] { return done; }, 20000));
    ASSERT_TRUE(w.document().resolved);
    EXPECT_EQ(w.unitModel()->rowCount(), 5);
    EXPECT_EQ(w.treeModel()->rowCount(), 1);
    ASSERT_GE(w.problemList()->count(), 1);
    EXPECT_TRUE(w.problemList()->item(0)->text().contains("world size 64 of cluster"))
        << w.problemList()->item(0)->text().toStdString();
    // A broken file is reported with its name and field, and nothing else changes.
    done = false;
    w.openFiles({sample("models/does-not-exist.json")}, [&] { done = true; });
    ASSERT_TRUE(QTest::qWaitFor([&] { return done; }, 20000));
    EXPECT_TRUE(w.problemList()->item(0)->text().contains("does-not-exist.json: cannot open file"))
        << w.problemList()->item(0)->text().toStdString();
    EXPECT_EQ(w.unitModel()->rowCount(), 5);
}

int main(int argc, char** argv) {
    if (qgetenv("QT_QPA_PLATFORM").isEmpty()) qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
