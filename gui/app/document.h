// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the app has open: at most one model, plan and cluster, and the plan resolved
// against them. Loading and resolving are plain functions so they run off the GUI thread
// and are tested without widgets; results are immutable snapshots.
#include <QString>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/search/variant.h"
#include "engine/sim/simulator.h"
#include "gui/timeline/memory_chart.h"
#include "gui/timeline/timeline_widget.h"
#include "plans/cluster/cluster.h"
#include "plans/model/model_graph.h"
#include "plans/plan/plan.h"
#include "plans/plan/resolve.h"
#include "profiler/analysis/fsdp_trace.h"
#include "profiler/analysis/summary.h"
#include "profiler/trace/trace.h"

namespace shardscope::gui {

struct LoadedFile {
    enum class Kind { Model, Plan, Cluster, Trace } kind = Kind::Model;
    QString path;
    std::shared_ptr<const ModelGraph> model;
    std::shared_ptr<const Plan> plan;
    std::shared_ptr<const ClusterSpec> cluster;
    std::shared_ptr<const Trace> trace;  // a PyTorch profiler (Kineto) trace
    // Its rows and HTA figures, computed with the load (off the GUI thread).
    std::shared_ptr<const TimelineData> traceTimeline;
    std::shared_ptr<const TraceSummary> traceSummary;
    // Its memory counters as a memory timeline (allocated and reserved only), or null.
    std::shared_ptr<const SimResult> traceMemory;
    // Every rank's memory counter of a multi-rank trace, as the chart's lines; null for one.
    std::shared_ptr<const std::vector<MemorySeries>> traceRankMemory;
    // FSDP's structure from the trace's own labels (PyTorch FSDP2/FSDP1 runs), or null.
    std::shared_ptr<const FsdpTraceAnalysis> traceFsdp;
    QString error;  // non-empty when loading failed; names the file and field
};

// Sniffs the file (HF config / shardscope.model / shardscope.plan / shardscope.cluster /
// trace). A trace import checks `cancel` and reports `progress` (0-1) every 256 KiB; a
// cancelled load returns the error "PATH: cancelled".
[[nodiscard]] LoadedFile loadFile(const QString& path, const std::atomic<bool>* cancel = nullptr,
                                  std::function<void(double)> progress = {});

// A timeline the Compare view can show: a simulated step or an opened trace.
struct CompareSource {
    QString name;
    std::shared_ptr<const TimelineData> timeline;
    std::shared_ptr<const SimResult> memory;  // peaks (and the memory timeline), or null
};

struct OpenedTrace {
    QString path;
    std::shared_ptr<const Trace> trace;
    std::shared_ptr<const TimelineData> timeline;
    std::shared_ptr<const TraceSummary> summary;
    std::shared_ptr<const SimResult> memory;
    std::shared_ptr<const FsdpTraceAnalysis> fsdp;  // null when the trace has no FSDP labels
    std::shared_ptr<const std::vector<MemorySeries>> rankMemory;  // null: one rank's counter
};

struct Document {
    std::shared_ptr<const ModelGraph> model;
    std::shared_ptr<const Plan> plan;
    std::shared_ptr<const ClusterSpec> cluster;
    QString modelPath, planPath, clusterPath;
    std::shared_ptr<const ResolvedPlan> resolved;  // when model and plan are both open
    // The simulated step, when a cluster is open too and the plan has no errors.
    std::shared_ptr<const TimelineData> timeline;
    std::shared_ptr<const SimResult> simulation;
    // Every trace opened, the last opened last (opening a path again moves it there). The
    // timeline shows whichever of the last trace and the simulation was opened last.
    std::vector<OpenedTrace> traces;
    [[nodiscard]] const OpenedTrace* lastTrace() const {
        return traces.empty() ? nullptr : &traces.back();
    }
    bool showTrace = false;
    // The plan as written, without the what-if edits (the same as timeline/simulation when
    // there are none).
    std::shared_ptr<const TimelineData> baseTimeline;
    std::shared_ptr<const SimResult> baseSimulation;
    [[nodiscard]] std::vector<CompareSource> compareSources() const;

    void apply(const LoadedFile& f);  // replaces the slot of f's kind and re-resolves

    // What-if edits on top of the plan as written: applied to a copy of the resolved plan
    // (engine/search/variant.h) and simulated again; returns false with `why` if invalid.
    struct WhatIf {
        PlanVariant variant;
        int64_t microBatchSize = 0;  // 0: the plan's
        // Whether anything is set on top of the plan.
        [[nodiscard]] bool active() const {
            return microBatchSize > 0 || !(variant == PlanVariant{});
        }
    };
    WhatIf whatIf;
    bool resimulate(QString* why = nullptr);

    // The plan editor's edits: each replaces the plan with an edited copy, resolves and
    // simulates it again (well under a millisecond for an 80-block model); false with
    // `why` when the edit cannot be made, the plan then unchanged.
    bool setModuleIsUnit(ModuleId module, bool isUnit, QString* why = nullptr);
    bool setWrapPolicy(const WrapPolicySpec& wrap, QString* why = nullptr);
    bool setUnitReshard(size_t unit, const QString& value, QString* why = nullptr);
    // Unit names, comma-separated; "implicit" or empty goes back to implicit prefetching.
    bool setUnitPrefetch(size_t unit, bool forward, const QString& value, QString* why = nullptr);
    // One unit's checkpointing ("none", "full", "selective_op", "attention"), mixed precision
    // ("bfloat16 / float32": param / reduce dtype; "-": none) or CPU offload ("yes", "no").
    enum class UnitSetting { Checkpointing, Precision, Offload };
    bool setUnitSetting(size_t unit, UnitSetting which, const QString& value,
                        QString* why = nullptr);
    // Plan-wide: the device mesh ("64" or "8,8"), mixed precision (param and reduce dtype
    // names, "" for none) and CPU offload.
    bool setPlanWide(const QString& mesh, const QString& paramDtype, const QString& reduceDtype,
                     bool offload, QString* why = nullptr);
    void replacePlan(Plan p);
    // replacePlan unless the edit adds an error (`why`: the first new one).
    bool tryPlan(Plan p, QString* why);
    bool planEdited = false;  // the plan differs from the file it came from
};

}  // namespace shardscope::gui
