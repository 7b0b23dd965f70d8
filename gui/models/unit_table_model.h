// SPDX-License-Identifier: Apache-2.0
#pragma once
// A resolved plan's units as a table: parameters, per-rank sharded and unsharded bytes,
// reshard_after_forward, activation checkpointing, mixed precision, prefetch.
#include <QAbstractTableModel>

#include <memory>

#include "plans/plan/resolve.h"

namespace shardscope::gui {

class UnitTableModel : public QAbstractTableModel {
    Q_OBJECT
public:
    enum Column {
        Unit,
        Modules,
        Params,
        Sharded,
        Unsharded,
        Reshard,
        Checkpointing,
        Precision,
        ForwardPrefetch,
        BackwardPrefetch,
        Offload,
        ColumnCount
    };
    enum Role { SortRole = Qt::UserRole + 1 };

    explicit UnitTableModel(QObject* parent = nullptr);
    void setPlan(std::shared_ptr<const ResolvedPlan> plan);
    [[nodiscard]] const ResolvedPlan* plan() const { return m_plan.get(); }

    int rowCount(const QModelIndex& parent = {}) const override;
    int columnCount(const QModelIndex& parent = {}) const override;
    QVariant data(const QModelIndex& index, int role = Qt::DisplayRole) const override;
    QVariant headerData(int section, Qt::Orientation o, int role = Qt::DisplayRole) const override;
    // Reshard ("True", "False" or a group size) and the prefetch lists (unit names,
    // comma-separated; empty: implicit) are editable: an edit asks for the plan change.
    Qt::ItemFlags flags(const QModelIndex& index) const override;
    bool setData(const QModelIndex& index, const QVariant& value, int role = Qt::EditRole) override;

signals:
    void reshardEditRequested(int unit, QString value);
    void prefetchEditRequested(int unit, bool forward, QString value);
    // Checkpointing ("none", "full", "selective_op", "attention"), Precision ("bfloat16 / float32",
    // "-") and Offload ("yes", "no") cells.
    void settingEditRequested(int unit, int column, QString value);

private:
    std::shared_ptr<const ResolvedPlan> m_plan;
};

}  // namespace shardscope::gui
