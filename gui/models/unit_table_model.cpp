// SPDX-License-Identifier: Apache-2.0
#include "gui/models/unit_table_model.h"

#include <iterator>

#include "plans/core/strings.h"

namespace shardscope::gui {

UnitTableModel::UnitTableModel(QObject* parent) : QAbstractTableModel(parent) {}

void UnitTableModel::setPlan(std::shared_ptr<const ResolvedPlan> plan) {
    beginResetModel();
    m_plan = std::move(plan);
    endResetModel();
}

int UnitTableModel::rowCount(const QModelIndex& parent) const {
    return parent.isValid() || !m_plan ? 0 : static_cast<int>(m_plan->units.size());
}

int UnitTableModel::columnCount(const QModelIndex& parent) const {
    return parent.isValid() ? 0 : ColumnCount;
}

QVariant UnitTableModel::data(const QModelIndex& index, int role) const {
    if (!m_plan || !index.isValid() || index.row() >= rowCount()) return {};
    const auto& u = m_plan->units[static_cast<size_t>(index.row())];
    if (role == SortRole) {
        switch (index.column()) {
            case Params:
                return qlonglong(u.numel);
            case Sharded:
                return qlonglong(u.shardedBytes);
            case Unsharded:
                return qlonglong(u.unshardedBytes);
            default:
                return index.row();
        }
    }
    if (role == Qt::TextAlignmentRole && index.column() >= Params && index.column() <= Unsharded)
        return QVariant(Qt::AlignRight | Qt::AlignVCenter);
    if (role != Qt::DisplayRole) return {};
    switch (index.column()) {
        case Unit:
            return QString::fromStdString(u.displayName());
        case Modules:
            return static_cast<int>(u.modules.size());
        case Params:
            return QString::fromStdString(formatCount(u.numel));
        case Sharded:
            return QString::fromStdString(formatBytes(u.shardedBytes));
        case Unsharded:
            return QString::fromStdString(formatBytes(u.unshardedBytes));
        case Reshard:
            return u.reshard == Reshard::Int
                       ? QString::number(u.reshardK)
                       : QString(u.reshard == Reshard::True ? "True" : "False");
        case Checkpointing:
            return QString(acModeName(u.activationCheckpointing));
        case Precision:
            return u.mixedPrecision.paramDtype || u.mixedPrecision.reduceDtype
                       ? QString::fromStdString(std::string(dtypeName(u.allGatherDtype)) + " / " +
                                                std::string(dtypeName(u.reduceDtype)))
                       : QString("-");
        case Offload:
            return QString(u.offload.enabled ? "yes" : "no");
        case ForwardPrefetch:
        case BackwardPrefetch: {
            const bool fwd = index.column() == ForwardPrefetch;
            if (!(fwd ? u.explicitForwardPrefetch : u.explicitBackwardPrefetch))
                return QString("implicit");
            QStringList names;
            for (UnitId t : fwd ? u.forwardPrefetch : u.backwardPrefetch)
                names << QString::fromStdString(m_plan->units[t.index()].displayName());
            return names.isEmpty() ? QString("none") : names.join(", ");
        }
    }
    return {};
}

QVariant UnitTableModel::headerData(int section, Qt::Orientation o, int role) const {
    if (o != Qt::Horizontal || role != Qt::DisplayRole) return {};
    static const char* names[] = {
        "Unit",    "Modules",       "Parameters",           "Sharded / rank",   "Unsharded",
        "Reshard", "Checkpointing", "Param / reduce dtype", "Forward prefetch", "Backward prefetch",
        "Offload"};
    static_assert(std::size(names) == ColumnCount, "a header name for every column");
    return section >= 0 && section < ColumnCount ? QString(names[section]) : QVariant();
}

Qt::ItemFlags UnitTableModel::flags(const QModelIndex& index) const {
    if (!index.isValid()) return Qt::NoItemFlags;
    Qt::ItemFlags f = Qt::ItemIsEnabled | Qt::ItemIsSelectable;
    if (index.column() >= Reshard) f |= Qt::ItemIsEditable;
    return f;
}

bool UnitTableModel::setData(const QModelIndex& index, const QVariant& value, int role) {
    if (!index.isValid() || role != Qt::EditRole || !m_plan) return false;
    if (index.column() == Reshard)
        emit reshardEditRequested(index.row(), value.toString().trimmed());
    else if (index.column() == ForwardPrefetch || index.column() == BackwardPrefetch)
        emit prefetchEditRequested(index.row(), index.column() == ForwardPrefetch,
                                   value.toString().trimmed());
    else
        emit settingEditRequested(index.row(), index.column(), value.toString().trimmed());
    return false;  // the edited plan, once resolved, changes the model
}

}  // namespace shardscope::gui
