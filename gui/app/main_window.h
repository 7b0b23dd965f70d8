// SPDX-License-Identifier: Apache-2.0
#pragma once
// The main window: the module tree (left) beside the plan's units and its problems
// (right). Files open from the command line, File > Open, recent files or drag and drop;
// they load off the GUI thread.
#include <QMainWindow>
#include <QScrollArea>
#include <QSplitter>

#include <atomic>
#include <functional>
#include <memory>

#include "gui/app/document.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QLineEdit;
class QSpinBox;
class QListWidget;
class QMenu;
class QPlainTextEdit;
class QProgressBar;
class QPushButton;
class QTableView;
class QTabWidget;
class QTreeView;

namespace shardscope::gui {

class CompareView;
class RecommendView;
class ModuleTreeModel;
class MemoryChart;
class TimelineWidget;
class UnitTableModel;

class MainWindow : public QMainWindow {
    Q_OBJECT
public:
    explicit MainWindow(QWidget* parent = nullptr);
    // Loads files in the background; `done` runs on the GUI thread when all have arrived.
    void openFiles(const QStringList& paths, std::function<void()> done = {});
    [[nodiscard]] const Document& document() const { return m_doc; }
    [[nodiscard]] ModuleTreeModel* treeModel() const { return m_tree; }
    [[nodiscard]] UnitTableModel* unitModel() const { return m_units; }
    [[nodiscard]] QListWidget* problemList() const { return m_problems; }
    [[nodiscard]] TimelineWidget* timeline() const { return m_timeline; }
    [[nodiscard]] QScrollArea* timelineScroll() const { return m_timelineScroll; }
    [[nodiscard]] MemoryChart* memoryChart() const { return m_memory; }
    [[nodiscard]] QPlainTextEdit* detailsPanel() const { return m_details; }
    [[nodiscard]] CompareView* compareView() const { return m_compare; }
    [[nodiscard]] RecommendView* recommendView() const { return m_recommend; }
    // The plan editor's wrap-policy row (tests drive it like a user would).
    [[nodiscard]] QComboBox* wrapKindBox() const { return m_wrapKind; }
    [[nodiscard]] QLineEdit* wrapArgEdit() const { return m_wrapArg; }
    [[nodiscard]] QLabel* wrapErrorLabel() const { return m_wrapError; }
    // The line above the timeline: the simulated step's or the trace's figures.
    [[nodiscard]] QLabel* summaryLabel() const { return m_simSummary; }
    void applyWrapPolicy();
    [[nodiscard]] QLineEdit* meshEdit() const { return m_mesh; }
    [[nodiscard]] QComboBox* paramDtypeBox() const { return m_paramDtype; }
    [[nodiscard]] QComboBox* reduceDtypeBox() const { return m_reduceDtype; }
    [[nodiscard]] QCheckBox* offloadBox() const { return m_offload; }
    void applyPlanWide();
    // Plan edits resolve and simulate in the background; true while one is running.
    [[nodiscard]] bool editing() const { return m_editsRunning > 0; }
    // Writes the (edited) plan as ShardScope plan JSON; an error message, or empty.
    QString savePlan(const QString& path);
    // Stops the loads in flight (the Cancel button beside the progress bar).
    void cancelLoading();
    [[nodiscard]] bool loading() const { return m_pending > 0; }
    // What a user does with the mouse, for screenshots and tests.
    void selectOp(int32_t op);
    void selectRange(int64_t startNs, int64_t endNs);
    void showTab(const QString& name);  // "plan", "compare", "recommend"
    // The details panel's text for a time range of the timeline shown.
    [[nodiscard]] QString describeRange(int64_t startNs, int64_t endNs) const;
    // What-if controls (tests drive them like a user would).
    [[nodiscard]] QComboBox* reshardBox() const { return m_reshard; }
    [[nodiscard]] QSpinBox* forwardPrefetchBox() const { return m_fwdPrefetch; }
    [[nodiscard]] QCheckBox* flowsBox() const { return m_flows; }
    // Search the timeline by op name (Ctrl+F): Enter or F3 for the next match,
    // Shift+Enter or Shift+F3 for the previous one; the label says "3 of 120".
    [[nodiscard]] QLineEdit* searchEdit() const { return m_search; }
    [[nodiscard]] QLabel* searchLabel() const { return m_searchLabel; }
    void findNext(bool backward = false);

protected:
    void dragEnterEvent(QDragEnterEvent* e) override;
    void dropEvent(QDropEvent* e) override;

private:
    // The constructor's parts, in the order it builds them.
    QWidget* buildUnitPanel();
    QWidget* buildPlanEditor();
    QWidget* buildWhatIfControls();
    QWidget* buildTimelinePanel();
    void buildTabs(QWidget* plan, QWidget* timeline);
    void buildStatusBarAndMenus();
    void refresh();
    void searchChanged();
    void whatIfChanged();
    void updateTitle();
    void syncWhatIfWidgets();
    void showSimulation();
    void showError(const QString& message);
    void rememberRecent(const QString& path);
    void rebuildRecentMenu();

    Document m_doc;
    ModuleTreeModel* m_tree;
    UnitTableModel* m_units;
    QTreeView* m_treeView;
    QTableView* m_unitView;
    QListWidget* m_problems;
    QLabel* m_summary;
    QLabel* m_simSummary;
    QLineEdit* m_search = nullptr;
    QLabel* m_searchLabel = nullptr;
    QComboBox* m_reshard;
    QComboBox* m_wrapKind;
    QLineEdit* m_wrapArg;
    QLabel* m_wrapError;
    QLineEdit* m_mesh;
    QComboBox *m_paramDtype, *m_reduceDtype;
    QCheckBox* m_offload;
    QCheckBox* m_flows;
    void showEditError(const QString& why);
    void editPlan(std::function<bool(Document&, QString*)> edit);
    int m_editGeneration = 0;
    int m_editsRunning = 0;
    QComboBox* m_ac;
    QSpinBox* m_fwdPrefetch;
    QSpinBox* m_bwdPrefetch;
    QSpinBox* m_microBatch;
    TimelineWidget* m_timeline;
    void sizeTimelineArea();
    QSplitter* m_outer = nullptr;
    const void* m_tracksSizedFor = nullptr;  // the trace the splitter was last sized for
    // What the simulated timeline last showed: the model and cluster it simulated (an edit
    // or a what-if of the same keeps the zoom), or null after a trace was shown.
    std::pair<const void*, const void*> m_simulatedFor{nullptr, nullptr};
    QScrollArea* m_timelineScroll = nullptr;
    MemoryChart* m_memory;
    QPlainTextEdit* m_details;
    QTabWidget* m_tabs;
    CompareView* m_compare;
    RecommendView* m_recommend;
    QProgressBar* m_progress;
    QPushButton* m_cancelLoad;
    std::shared_ptr<std::atomic<bool>> m_loadCancel;
    QMenu* m_recent;
    int m_pending = 0;
    QStringList m_loadErrors;  // shown above the plan's problems until the next successful load
};

}  // namespace shardscope::gui
