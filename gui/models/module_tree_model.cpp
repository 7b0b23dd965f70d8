// SPDX-License-Identifier: Apache-2.0
#include "gui/models/module_tree_model.h"

#include "plans/core/strings.h"

namespace shardscope::gui {

ModuleTreeModel::ModuleTreeModel(QObject* parent) : QAbstractItemModel(parent) {}

void ModuleTreeModel::setModel(std::shared_ptr<const ModelGraph> graph) {
    beginResetModel();
    m_graph = std::move(graph);
    m_plan.reset();
    m_unitOfModule.clear();
    m_row.assign(m_graph ? m_graph->moduleCount() : 0, 0);
    if (m_graph)
        for (const auto& m : m_graph->modules())
            for (size_t i = 0; i < m.children.size(); ++i)
                m_row[m.children[i].index()] = static_cast<int32_t>(i);
    endResetModel();
}

void ModuleTreeModel::setPlan(std::shared_ptr<const ResolvedPlan> plan) {
    // The unit column changes everywhere at once; a reset is the honest signal.
    beginResetModel();
    m_plan = std::move(plan);
    m_unitOfModule.assign(m_graph ? m_graph->moduleCount() : 0, -1);
    if (m_graph && m_plan && m_plan->model == m_graph.get()) {
        std::vector<int32_t> unitRoot(m_graph->moduleCount(), -1);
        for (size_t u = 0; u < m_plan->units.size(); ++u)
            for (ModuleId m : m_plan->units[u].modules)
                unitRoot[m.index()] = static_cast<int32_t>(u);
        m_unitRoot.assign(m_graph->moduleCount(), 0);
        for (const auto& u : m_plan->units)
            if (!u.modules.empty()) m_unitRoot[u.modules.front().index()] = 1;
        for (size_t m = 0; m < m_graph->moduleCount(); ++m)
            m_unitOfModule[m] = unitRoot[m] >= 0
                                    ? unitRoot[m]
                                    : m_unitOfModule[m_graph->modules()[m].parent.index()];
    }
    endResetModel();
}

QModelIndex ModuleTreeModel::index(int row, int column, const QModelIndex& parent) const {
    if (!m_graph || row < 0 || column < 0 || column >= ColumnCount) return {};
    if (!parent.isValid()) return row == 0 ? createIndex(0, column, quintptr(0)) : QModelIndex();
    const auto& p = m_graph->module(ModuleId(static_cast<int32_t>(parent.internalId())));
    if (row >= static_cast<int>(p.children.size())) return {};
    return createIndex(row, column, quintptr(p.children[static_cast<size_t>(row)].value));
}

QModelIndex ModuleTreeModel::parent(const QModelIndex& child) const {
    if (!m_graph || !child.isValid() || child.internalId() == 0) return {};
    const ModuleId parent =
        m_graph->module(ModuleId(static_cast<int32_t>(child.internalId()))).parent;
    return createIndex(m_row[parent.index()], 0, quintptr(parent.value));
}

int ModuleTreeModel::rowCount(const QModelIndex& parent) const {
    if (!m_graph) return 0;
    if (!parent.isValid()) return 1;
    if (parent.column() != 0) return 0;
    return static_cast<int>(
        m_graph->module(ModuleId(static_cast<int32_t>(parent.internalId()))).children.size());
}

int ModuleTreeModel::columnCount(const QModelIndex&) const {
    return ColumnCount;
}

QModelIndex ModuleTreeModel::indexOf(ModuleId m, int column) const {
    if (!m_graph || !m.valid() || m.index() >= m_graph->moduleCount()) return {};
    return createIndex(m_row[m.index()], column, quintptr(m.value));
}

QVariant ModuleTreeModel::data(const QModelIndex& index, int role) const {
    if (!m_graph || !index.isValid()) return {};
    const ModuleId id(static_cast<int32_t>(index.internalId()));
    const auto& m = m_graph->module(id);
    if (role == ModuleIdRole) return id.value;
    if (role == Qt::CheckStateRole && index.column() == Name && m_plan &&
        m_unitRoot.size() == m_graph->moduleCount())
        return m_unitRoot[id.index()] ? Qt::Checked : Qt::Unchecked;
    if (role == NumelRole) return qlonglong(m_graph->subtreeNumel(id));
    if (role == Qt::TextAlignmentRole && (index.column() == Params || index.column() == Size))
        return QVariant(Qt::AlignRight | Qt::AlignVCenter);
    if (role == Qt::ToolTipRole)
        return QString::fromStdString((m.fqn.empty() ? "<root>" : m.fqn) + "\n" +
                                      withThousands(m_graph->subtreeNumel(id)) + " parameters");
    if (role != Qt::DisplayRole) return {};
    switch (index.column()) {
        case Name:
            return QString::fromStdString(id.value == 0 ? "<root>" : m.name);
        case Class:
            return QString::fromStdString(m.cls);
        case Params:
            return QString::fromStdString(formatCount(m_graph->subtreeNumel(id)));
        case Size:
            return QString::fromStdString(formatBytes(m_graph->subtreeParamBytes(id)));
        case Unit:
            if (m_unitOfModule.empty() || m_unitOfModule[id.index()] < 0) return {};
            return QString::fromStdString(
                m_plan->units[static_cast<size_t>(m_unitOfModule[id.index()])].displayName());
    }
    return {};
}

Qt::ItemFlags ModuleTreeModel::flags(const QModelIndex& index) const {
    if (!index.isValid()) return Qt::NoItemFlags;
    Qt::ItemFlags f = Qt::ItemIsEnabled | Qt::ItemIsSelectable;
    // The root is always a unit (fully_shard on the model itself).
    if (index.column() == Name && m_plan && index.internalId() != 0) f |= Qt::ItemIsUserCheckable;
    return f;
}

bool ModuleTreeModel::setData(const QModelIndex& index, const QVariant& value, int role) {
    if (!index.isValid() || role != Qt::CheckStateRole || index.column() != Name || !m_plan ||
        index.internalId() == 0)
        return false;
    emit unitToggleRequested(ModuleId(static_cast<int32_t>(index.internalId())),
                             value.toInt() == Qt::Checked);
    return false;  // the edited plan, once resolved, changes the model
}

QVariant ModuleTreeModel::headerData(int section, Qt::Orientation o, int role) const {
    if (o != Qt::Horizontal || role != Qt::DisplayRole) return {};
    static const char* names[] = {"Module", "Class", "Parameters", "Size", "Unit"};
    return section >= 0 && section < ColumnCount ? QString(names[section]) : QVariant();
}

}  // namespace shardscope::gui
