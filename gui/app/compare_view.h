// SPDX-License-Identifier: Apache-2.0
#pragma once
// Compare: two timelines stacked on one time axis (plan A against plan B, the plan as
// written against its what-if edits, or simulated against measured), with a table of step
// time, communication, exposed communication, overlap and peak memory side by side with
// their differences, and the per-unit differences in exposed communication.
#include <QWidget>

#include <vector>

#include "gui/app/document.h"

class QComboBox;
class QLabel;
class QTableWidget;

namespace shardscope::gui {

class TimelineWidget;

class CompareView : public QWidget {
    Q_OBJECT
public:
    explicit CompareView(QWidget* parent = nullptr);
    // Keeps the chosen sources by name when they are still there. The figures and timelines
    // are rebuilt when the tab is shown (a what-if edit must not pay for a hidden tab).
    void setSources(std::vector<CompareSource> sources);
    [[nodiscard]] QComboBox* sourceA() const { return m_a; }
    [[nodiscard]] QComboBox* sourceB() const { return m_b; }
    [[nodiscard]] QTableWidget* table() const { return m_table; }
    [[nodiscard]] QTableWidget* unitTable() const { return m_units; }
    [[nodiscard]] TimelineWidget* timelineA() const { return m_timelineA; }
    [[nodiscard]] TimelineWidget* timelineB() const { return m_timelineB; }

protected:
    void showEvent(QShowEvent* e) override;

private:
    void refresh();
    bool m_stale = false;  // sources changed while the tab was hidden
    QString m_shownNames;  // the sources A and B last shown, by name

    std::vector<CompareSource> m_sources;
    QComboBox *m_a, *m_b;
    QLabel *m_labelA, *m_labelB, *m_hint;
    TimelineWidget *m_timelineA, *m_timelineB;
    QTableWidget *m_table, *m_units;
};

}  // namespace shardscope::gui
