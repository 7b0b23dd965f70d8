// SPDX-License-Identifier: Apache-2.0
#include "gui/app/document.h"

#include "gui/timeline/sim_timeline.h"
#include "plans/core/json_reader.h"
#include "plans/model/model_json.h"
#include "plans/plan/plan_json.h"

namespace shardscope::gui {

LoadedFile loadFile(const QString& path) {
    LoadedFile f;
    f.path = path;
    const std::string p = path.toStdString();
    auto j = readJsonFile(p);
    if (!j) {
        f.error = QString::fromStdString(j.error());
        return f;
    }
    const std::string format = j->is_object() && j->contains("format") && (*j)["format"].is_string()
                                   ? (*j)["format"].get<std::string>()
                                   : std::string();
    if (format == kPlanFormat) {
        f.kind = LoadedFile::Kind::Plan;
        auto plan = planFromJson(*j, p);
        if (plan)
            f.plan = std::make_shared<const Plan>(std::move(*plan));
        else
            f.error = QString::fromStdString(plan.error());
    } else if (format == kClusterFormat) {
        f.kind = LoadedFile::Kind::Cluster;
        auto c = clusterFromJson(*j, p);
        if (c)
            f.cluster = std::make_shared<const ClusterSpec>(std::move(*c));
        else
            f.error = QString::fromStdString(c.error());
    } else {
        f.kind = LoadedFile::Kind::Model;
        auto g = looksLikeHfConfig(*j) ? modelFromHfConfig(*j, p)
                 : format == kModelFormat
                     ? modelFromJson(*j, p)
                     : Expected<ModelGraph>(
                           Error{p + ":/: not a ShardScope model, plan or cluster file, nor a "
                                     "Hugging Face config.json"});
        if (g)
            f.model = std::make_shared<const ModelGraph>(std::move(*g));
        else
            f.error = QString::fromStdString(g.error());
    }
    return f;
}

void Document::apply(const LoadedFile& f) {
    if (!f.error.isEmpty()) return;
    switch (f.kind) {
        case LoadedFile::Kind::Model:
            model = f.model;
            modelPath = f.path;
            break;
        case LoadedFile::Kind::Plan:
            plan = f.plan;
            planPath = f.path;
            break;
        case LoadedFile::Kind::Cluster:
            cluster = f.cluster;
            clusterPath = f.path;
            break;
    }
    resolved.reset();
    timeline.reset();
    simulation.reset();
    if (model && plan)
        resolved = std::make_shared<const ResolvedPlan>(
            resolvePlan(*model, *plan, cluster.get(), planPath.toStdString()));
    resimulate();
}

bool Document::resimulate(QString* why) {
    timeline.reset();
    simulation.reset();
    if (!resolved || !cluster || resolved->hasErrors()) return false;
    // Simulating one step takes well under a millisecond: done here, not in a thread.
    ResolvedPlan edited = *resolved;
    std::string reason;
    if (!applyVariant(edited, whatIf.variant, &reason)) {
        if (why) *why = QString::fromStdString(reason);
        return false;
    }
    const int64_t mbs = whatIf.microBatchSize > 0 ? whatIf.microBatchSize : plan->microBatchSize;
    const StepOptions o{mbs, plan->seqLen, plan->microBatches, cluster->node.devicesPerNode};
    const StepProgram program = buildStepProgram(edited, o);
    auto sim = std::make_shared<SimResult>(simulate(program, *cluster, edited.worldSize));
    timeline = std::make_shared<const TimelineData>(timelineFromSimulation(edited, program, *sim));
    simulation = std::move(sim);
    return true;
}

}  // namespace shardscope::gui
