// SPDX-License-Identifier: Apache-2.0
// `shardscope bench published`: the simulator against FSDP runs others measured and
// published (samples/published/fsdp-runs.json), predicted from their descriptions with the
// bundled cluster profiles and no calibration.
#include <cmath>
#include <cstdio>
#include <iostream>

#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/measure/published_runs.h"
#include "plans/core/strings.h"

namespace shardscope::cli {

namespace {

std::string pct(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%+.1f%%", 100 * x);
    return b;
}

std::string num(const char* f, double x) {
    char b[48];
    std::snprintf(b, sizeof b, f, x);
    return b;
}

std::string dirOr(const Args& a, const char* opt, const std::string& runsFile, const char* sub) {
    if (a.has(opt)) return a.get(opt);
    const auto slash = runsFile.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : runsFile.substr(0, slash);
    return dir + "/../" + sub;
}

int runBenchPublished(const Args& a) {
    const std::string file = samplePath(a.get("--runs"));
    const std::string models = dirOr(a, "--models-dir", file, "models");
    const std::string clusters = dirOr(a, "--clusters-dir", file, "clusters");
    auto runs = loadPublishedRuns(file, models, clusters);
    if (failed(runs)) return kExitUsage;
    const std::string filter = a.get("--filter");
    std::vector<PublishedRun> picked;
    std::vector<PublishedRunResult> results;
    for (const PublishedRun& run : runs->runs) {
        if (!filter.empty() && run.id.find(filter) == std::string::npos &&
            run.gpu.find(filter) == std::string::npos)
            continue;
        auto r = predictPublishedRun(*runs, run, models, clusters);
        if (failed(r)) return kExitUsage;
        picked.push_back(run);
        results.push_back(*r);
    }
    if (picked.empty()) {
        std::cerr << "error: --filter \"" << filter << "\" matches no run of " << file << "\n";
        return kExitUsage;
    }
    const auto summary = summarizePublished(picked, results);
    if (a.flag("--json")) {
        nlohmann::json rows = nlohmann::json::array();
        for (size_t i = 0; i < picked.size(); ++i) {
            const PublishedRun& run = picked[i];
            const PublishedRunResult& r = results[i];
            nlohmann::json row{{"id", run.id},
                               {"gpu", run.gpu},
                               {"gpus", run.gpus},
                               {"api", run.api},
                               {"mode", run.mode},
                               {"cluster", run.cluster},
                               {"source", run.source},
                               {"published_tokens_per_s_per_gpu", run.publishedTokensPerSPerGpu},
                               {"predicted_tokens_per_s_per_gpu", r.tokensPerSPerGpu},
                               {"tokens_error", r.tokensError},
                               {"step_ms", r.stepMs},
                               {"compute_ms", r.computeMs},
                               {"exposed_comm_ms", r.exposedCommMs},
                               {"mfu", r.mfu},
                               {"peak_allocated_bytes", r.peakAllocatedBytes},
                               {"peak_reserved_bytes", r.peakReservedBytes},
                               {"device_memory_bytes", r.deviceMemoryBytes},
                               {"oom", r.oom}};
            row["published_peak_reserved_gib"] = run.publishedPeakReservedGiB
                                                     ? nlohmann::json(*run.publishedPeakReservedGiB)
                                                     : nlohmann::json();
            row["reserved_error"] =
                r.reservedError ? nlohmann::json(*r.reservedError) : nlohmann::json();
            rows.push_back(row);
        }
        nlohmann::json sum = nlohmann::json::array();
        for (const PublishedSummary& s : summary)
            sum.push_back({{"gpu", s.gpu},
                           {"runs", s.runs},
                           {"median_abs_tokens_error", s.medianAbsTokensError},
                           {"max_abs_tokens_error", s.maxAbsTokensError},
                           {"reserved_runs", s.reservedRuns},
                           {"max_abs_reserved_error", s.maxAbsReservedError},
                           {"oom_runs", s.oomRuns}});
        return emitJson({{"runs_file", file}, {"runs", rows}, {"summary", sum}}, "").ok()
                   ? kExitOk
                   : kExitUsage;
    }
    std::cout << "Published FSDP runs predicted from their descriptions with the bundled "
                 "profiles, no calibration ("
              << file << ")\n\n";
    Table t({"run", "GPUs", "profile", "published tok/s/GPU", "predicted", "error",
             "published reserved", "predicted", "error", "exposed comm"},
            {false, true, false, true, true, true, true, true, true, true});
    for (size_t i = 0; i < picked.size(); ++i) {
        const PublishedRun& run = picked[i];
        const PublishedRunResult& r = results[i];
        const double gib = static_cast<double>(r.peakReservedBytes) / (1024.0 * 1024 * 1024);
        t.row({run.id, std::to_string(run.gpus), run.cluster,
               num("%.0f", run.publishedTokensPerSPerGpu), num("%.0f", r.tokensPerSPerGpu),
               pct(r.tokensError),
               run.publishedPeakReservedGiB ? num("%.2f GiB", *run.publishedPeakReservedGiB) : "-",
               num("%.2f GiB", gib) + (r.oom ? " OOM" : ""),
               r.reservedError ? pct(*r.reservedError) : "-",
               num("%.1f%%", r.stepMs > 0 ? 100 * r.exposedCommMs / r.stepMs : 0)});
    }
    t.print(std::cout);
    std::cout << "\n";
    Table s({"GPU", "runs", "median |error| tok/s", "max |error|", "reserved: runs", "max |error|",
             "predicted OOM"},
            {false, true, true, true, true, true, true});
    for (const PublishedSummary& x : summary)
        s.row({x.gpu, std::to_string(x.runs), num("%.1f%%", 100 * x.medianAbsTokensError),
               num("%.1f%%", 100 * x.maxAbsTokensError), std::to_string(x.reservedRuns),
               x.reservedRuns ? num("%.1f%%", 100 * x.maxAbsReservedError) : "-",
               std::to_string(x.oomRuns)});
    s.print(std::cout);
    return kExitOk;
}

}  // namespace

std::vector<Command> benchPublishedCommands() {
    CommandSpec s;
    s.name = "bench published";
    s.summary = "Predict published FSDP runs (torchtitan, PR #165...) and print the error.";
    s.description =
        "Every run of the runs file is simulated from its description: the model, the plan\n"
        "written from what the source says ran, the bundled cluster profile of its GPU with\n"
        "as many nodes as it used, its micro-batch and sequence length. No calibration: the\n"
        "profiles are what `-c NAME` gives any user. Prints predicted against published\n"
        "tokens/s per GPU and peak reserved memory, the error, and per GPU kind the median\n"
        "and largest error. The simulator is deterministic: the figures are the same on any\n"
        "machine.";
    s.options = {{"--runs", "FILE", "published runs", "samples/published/fsdp-runs.json"},
                 {"--models-dir", "DIR", "where run models are found [FILE's ../models]"},
                 {"--clusters-dir", "DIR", "where run profiles are found [FILE's ../clusters]"},
                 {"--filter", "TEXT", "only runs whose id or GPU kind contains TEXT"},
                 {"--json", "", "print JSON"}};
    s.examples = {"shardscope bench published", "shardscope bench published --filter H100"};
    return {{s, runBenchPublished}};
}

}  // namespace shardscope::cli
