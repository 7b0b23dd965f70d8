// SPDX-License-Identifier: Apache-2.0
#include "engine/measure/published_runs.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "engine/schedule/step_program.h"
#include "engine/sim/simulator.h"
#include "plans/cluster/cluster.h"
#include "plans/core/json_reader.h"
#include "plans/model/model_json.h"
#include "plans/plan/plan_json.h"
#include "plans/plan/resolve.h"

namespace shardscope {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string folderOf(const std::string& path) {
    const auto slash = path.find_last_of('/');
    return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

std::string modelPath(const std::string& dir, const std::string& name) {
    return dir + "/" + name + "/config.json";
}

std::string clusterPath(const std::string& dir, const std::string& name) {
    return dir + "/" + name + ".json";
}

PublishedRun readRun(const JsonReader& r) {
    r.allowOnly({"id", "source", "quote", "notes", "gpu", "api", "mode", "model", "plan",
                 "plan_overrides", "cluster", "gpus", "micro_batch_size", "seq_len",
                 "expandable_segments", "published"});
    PublishedRun run;
    run.pointer = r.pointer();
    run.id = r.getString("id");
    run.source = r.getString("source");
    run.quote = r.getString("quote");
    run.notes = r.optString("notes").value_or("");
    run.gpu = r.getString("gpu");
    run.api = r.getString("api");
    if (run.api != "fsdp2" && run.api != "fsdp1")
        r.at("api").fail("expected \"fsdp2\" or \"fsdp1\", got \"" + run.api + "\"");
    run.mode = r.getString("mode");
    if (run.mode != "eager" && run.mode != "compile")
        r.at("mode").fail(
            "expected \"eager\" or \"compile\" (torch.compile of each block, as torchtitan "
            "applies it), got \"" +
            run.mode + "\"");
    run.model = r.getString("model");
    run.plan = r.getString("plan");
    if (auto o = r.find("plan_overrides")) {
        if (!o->json().is_object()) o->failExpected("an object merged over the plan file");
        run.planOverrides = o->json();
    }
    run.cluster = r.getString("cluster");
    run.gpus = r.at("gpus").asIntAtLeast(1);
    run.microBatchSize = r.at("micro_batch_size").asIntAtLeast(1);
    run.seqLen = r.at("seq_len").asIntAtLeast(1);
    run.expandableSegments = r.optBool("expandable_segments").value_or(false);
    const JsonReader pub = r.at("published");
    pub.allowOnly({"tokens_per_s_per_gpu", "peak_reserved_gib"});
    run.publishedTokensPerSPerGpu = pub.at("tokens_per_s_per_gpu").asPositiveNumber();
    if (auto m = pub.find("peak_reserved_gib"); m && !m->isNull())
        run.publishedPeakReservedGiB = m->asPositiveNumber();
    return run;
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

Expected<PublishedRunsFile> loadPublishedRuns(const std::string& path, const std::string& modelsDir,
                                              const std::string& clustersDir) {
    auto j = readJsonFile(path);
    if (!j) return Error{j.error()};
    auto parsed = catchJsonErrors<PublishedRunsFile>([&] {
        JsonReader r(*j, path);
        r.checkFormat(kPublishedRunsFormat, 1);
        r.allowOnly({"format", "version", "about", "runs"});
        PublishedRunsFile f;
        f.path = path;
        const JsonReader list = r.at("runs");
        for (size_t i = 0; i < list.size(); ++i) {
            PublishedRun run = readRun(list[i]);
            for (const PublishedRun& o : f.runs)
                if (o.id == run.id)
                    list[i].at("id").fail("two runs have the id \"" + run.id + "\"");
            f.runs.push_back(std::move(run));
        }
        if (f.runs.empty()) list.fail("no runs");
        return f;
    });
    if (!parsed) return Error{parsed.error()};
    std::error_code ec;
    for (const PublishedRun& run : parsed->runs) {
        const std::string where = path + ":" + run.pointer;
        for (const auto& [field, file] :
             {std::pair<const char*, std::string>{"model", modelPath(modelsDir, run.model)},
              {"plan", folderOf(path) + "/" + run.plan},
              {"cluster", clusterPath(clustersDir, run.cluster)}})
            if (!std::filesystem::is_regular_file(file, ec))
                return Error{where + "/" + field + ": no file " + file};
    }
    return parsed;
}

Expected<PublishedRunResult> predictPublishedRun(const PublishedRunsFile& f,
                                                 const PublishedRun& run,
                                                 const std::string& modelsDir,
                                                 const std::string& clustersDir) {
    const std::string where = f.path + ":" + run.pointer;
    auto model = loadModelFile(modelPath(modelsDir, run.model));
    if (!model) return Error{where + "/model: " + model.error()};
    const std::string planFile = folderOf(f.path) + "/" + run.plan;
    auto planJson = readJsonFile(planFile);
    if (!planJson) return Error{where + "/plan: " + planJson.error()};
    nlohmann::json pj = *planJson;
    if (!run.planOverrides.is_null()) pj.merge_patch(run.planOverrides);
    // The run's shape: one FSDP mesh over every GPU, its micro-batch and sequence length.
    pj["mesh"] = {{"shape", {run.gpus}}};
    pj["training"]["micro_batch_size"] = run.microBatchSize;
    pj["training"]["seq_len"] = run.seqLen;
    pj["api"] = run.api;
    if (run.mode == "compile") pj["defaults"]["compile"] = "per_block";
    auto plan = planFromJson(pj, planFile + " (with " + run.id + "'s overrides)");
    if (!plan) return Error{where + "/plan_overrides: " + plan.error()};
    auto cluster = loadClusterFile(clusterPath(clustersDir, run.cluster));
    if (!cluster) return Error{where + "/cluster: " + cluster.error()};
    const int64_t perNode = cluster->node.devicesPerNode;
    if (run.gpus % perNode != 0 && run.gpus > perNode)
        return Error{where + "/gpus: " + std::to_string(run.gpus) + " GPUs do not fill nodes of " +
                     std::to_string(perNode) + " (" + run.cluster + ")"};
    cluster->nodes = std::max<int64_t>(1, run.gpus / perNode);
    if (run.gpus < perNode) cluster->node.devicesPerNode = run.gpus;

    const ResolvedPlan r = resolvePlan(*model, *plan, &*cluster, planFile);
    if (r.hasErrors()) {
        std::string msg = where + ": the plan has errors:";
        for (const auto& p : r.problems)
            msg += "\n  " + p.toString();
        return Error{msg};
    }
    const StepProgram prog = buildStepProgram(r, stepOptionsFor(*plan, *cluster));
    SimOptions opts;
    opts.keepTimeline = false;
    opts.keepOpTimes = false;
    opts.expandableSegments = run.expandableSegments;
    const SimResult s = simulate(prog, *cluster, r.worldSize, opts);

    PublishedRunResult out;
    out.clusterName = cluster->name;
    out.stepMs = static_cast<double>(s.stepNs) * 1e-6;
    out.tokensPerSPerGpu = s.stepNs > 0 ? static_cast<double>(prog.tokensPerRank) /
                                              (static_cast<double>(s.stepNs) * 1e-9)
                                        : 0;
    out.tokensError = out.tokensPerSPerGpu / run.publishedTokensPerSPerGpu - 1;
    out.peakAllocatedBytes = s.peakAllocated;
    out.peakReservedBytes = s.peakReserved;
    out.deviceMemoryBytes = cluster->device.memoryBytes;
    if (run.publishedPeakReservedGiB)
        out.reservedError =
            static_cast<double>(s.peakReserved) / kGiB / *run.publishedPeakReservedGiB - 1;
    out.oom = s.oom;
    out.computeMs = static_cast<double>(s.computeNs) * 1e-6;
    out.exposedCommMs = static_cast<double>(s.exposedCommNs) * 1e-6;
    out.mfu = s.mfu;
    return out;
}

std::vector<PublishedSummary> summarizePublished(const std::vector<PublishedRun>& runs,
                                                 const std::vector<PublishedRunResult>& results) {
    std::vector<PublishedSummary> out;
    std::vector<std::vector<double>> errors;
    for (size_t i = 0; i < runs.size() && i < results.size(); ++i) {
        // Eager and compiled runs apart: each kind of GPU and mode has its own bars.
        const std::string key = runs[i].gpu + (runs[i].mode == "eager" ? "" : ", compiled");
        auto it = std::find_if(out.begin(), out.end(),
                               [&](const PublishedSummary& s) { return s.gpu == key; });
        if (it == out.end()) {
            out.push_back({});
            out.back().gpu = key;
            errors.emplace_back();
            it = out.end() - 1;
        }
        const size_t k = static_cast<size_t>(it - out.begin());
        const PublishedRunResult& r = results[i];
        ++it->runs;
        errors[k].push_back(std::abs(r.tokensError));
        it->maxAbsTokensError = std::max(it->maxAbsTokensError, std::abs(r.tokensError));
        if (r.reservedError) {
            ++it->reservedRuns;
            it->maxAbsReservedError = std::max(it->maxAbsReservedError, std::abs(*r.reservedError));
        }
        if (r.oom) ++it->oomRuns;
    }
    for (size_t k = 0; k < out.size(); ++k)
        out[k].medianAbsTokensError = median(errors[k]);
    return out;
}

}  // namespace shardscope
