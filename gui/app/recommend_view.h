// SPDX-License-Identifier: Apache-2.0
#pragma once
// Recommend: the plan search (engine/search) for the open model and cluster, run in the
// background with progress and cancel; its Pareto front of step time against peak memory
// as a scatter plot beside the table of those plans. Picking a point selects its plan;
// "Load" opens it in the Plan tab (timeline, memory, what-if), "Export" writes it in any of
// the four JSON formats.
#include <QFuture>
#include <QWidget>

#include <atomic>
#include <memory>

#include "engine/search/search.h"
#include "plans/plan/export.h"

class QCheckBox;
class QComboBox;
class QHBoxLayout;
class QLabel;
class QProgressBar;
class QPushButton;
class QSpinBox;
class QTableWidget;

class QChartView;
class QScatterSeries;

namespace shardscope::gui {

class RecommendView : public QWidget {
    Q_OBJECT
public:
    explicit RecommendView(QWidget* parent = nullptr);
    ~RecommendView() override;
    void setInputs(std::shared_ptr<const ModelGraph> model,
                   std::shared_ptr<const ClusterSpec> cluster, int64_t seqLen);
    void start();  // the Search button
    void cancel();
    [[nodiscard]] bool running() const { return m_running; }
    [[nodiscard]] const SearchResult* result() const { return m_result.get(); }
    [[nodiscard]] int selected() const { return m_selected; }  // index into the Pareto front
    void select(int paretoIndex);
    [[nodiscard]] QTableWidget* table() const { return m_table; }
    [[nodiscard]] QScatterSeries* paretoSeries() const { return m_pareto; }
    // Writes the selected plan; returns an error message, empty on success.
    [[nodiscard]] QString exportSelected(const QString& path, ExportFormat format) const;

signals:
    void finished();
    void loadPlanRequested(std::shared_ptr<const Plan> plan);

private:
    // The constructor's parts, in the order it builds them.
    QHBoxLayout* buildSearchBar();
    void buildChart();
    QWidget* buildPlanList();
    void showResult();

    std::shared_ptr<const ModelGraph> m_model;
    std::shared_ptr<const ClusterSpec> m_cluster;
    std::shared_ptr<SearchResult> m_result;
    std::shared_ptr<std::atomic<bool>> m_cancel;
    QFuture<std::shared_ptr<SearchResult>> m_future;
    bool m_running = false;
    int m_selected = -1;
    QSpinBox *m_seq, *m_batch;
    QCheckBox* m_fsdp1;
    QPushButton *m_search, *m_stop, *m_load, *m_export;
    QComboBox* m_format;
    QProgressBar* m_progress;
    QLabel *m_status, *m_details;
    QTableWidget* m_table;
    QChartView* m_chart;
    QScatterSeries *m_pareto, *m_others, *m_baseline, *m_chosen;
};

}  // namespace shardscope::gui
