// SPDX-License-Identifier: Apache-2.0
#pragma once
// The model's module tree as a Qt item model: name, class, parameters, size, and the unit
// that manages the module when a plan is resolved. A thin adapter over ModelGraph (plans/):
// it holds immutable snapshots and never copies the tree.
#include <QAbstractItemModel>

#include <memory>

#include "plans/model/model_graph.h"
#include "plans/plan/resolve.h"

namespace shardscope::gui {

class ModuleTreeModel : public QAbstractItemModel {
    Q_OBJECT
public:
    enum Column { Name, Class, Params, Size, Unit, ColumnCount };
    enum Role { ModuleIdRole = Qt::UserRole + 1, NumelRole };

    explicit ModuleTreeModel(QObject* parent = nullptr);

    void setModel(std::shared_ptr<const ModelGraph> graph);
    void setPlan(std::shared_ptr<const ResolvedPlan> plan);  // may be null
    [[nodiscard]] const ModelGraph* graph() const { return m_graph.get(); }

    QModelIndex index(int row, int column, const QModelIndex& parent = {}) const override;
    QModelIndex parent(const QModelIndex& child) const override;
    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;
    // With a plan, the Module column has a check box: ticked for a module that roots a
    // unit. Toggling it asks for the plan edit (unitToggleRequested); the model changes
    // when the edited plan is set.
    Qt::ItemFlags flags(const QModelIndex& index) const override;
    bool setData(const QModelIndex& index, const QVariant& value, int role = Qt::EditRole) override;
    [[nodiscard]] QModelIndex indexOf(ModuleId m, int column = 0) const;

signals:
    void unitToggleRequested(ModuleId module, bool makeUnit);

private:
    std::shared_ptr<const ModelGraph> m_graph;
    std::shared_ptr<const ResolvedPlan> m_plan;
    std::vector<int32_t> m_unitOfModule;  // managing unit index per module, -1 without a plan
    std::vector<int32_t> m_row;           // row of each module within its parent
    std::vector<char> m_unitRoot;         // the module is a unit's first module
};

}  // namespace shardscope::gui
