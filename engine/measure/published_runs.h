// SPDX-License-Identifier: Apache-2.0
#pragma once
// FSDP training runs that others measured and published ("format":
// "shardscope.published_runs", samples/published/fsdp-runs.json): each with its source and
// the sentence quoted, the model, the plan written from the run's description, the bundled
// cluster profile and GPU count it ran on, and the published tokens/s per GPU and peak
// reserved memory. `shardscope bench published` predicts every run with no calibration
// and prints the error; tests/python/test_bench_published.py holds the bars.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plans/core/expected.h"

namespace shardscope {

inline constexpr const char* kPublishedRunsFormat = "shardscope.published_runs";

struct PublishedRun {
    std::string id;
    std::string source, quote, notes;
    std::string gpu;               // the GPU kind the run is summarised under ("A100 80GB", "H100")
    std::string api;               // "fsdp2" or "fsdp1", as the source ran it
    std::string mode;              // "eager", or "compile" (torch.compile per block)
    std::string model;             // samples/models/<model>/config.json
    std::string plan;              // plan file, relative to the runs file
    nlohmann::json planOverrides;  // merged over the plan file (RFC 7386 merge patch)
    std::string cluster;           // samples/clusters/<cluster>.json
    int64_t gpus = 0;
    int64_t microBatchSize = 0, seqLen = 0;
    // PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, where the source's launcher sets it
    // (torchtitan's run_train.sh since October 2024).
    bool expandableSegments = false;
    double publishedTokensPerSPerGpu = 0;
    std::optional<double> publishedPeakReservedGiB;
    std::string pointer;  // the run's JSON pointer in its file, for messages
};

struct PublishedRunsFile {
    std::string path;
    std::vector<PublishedRun> runs;
};

// Reads a runs file; models are looked up in `modelsDir`, clusters in `clustersDir`, plans
// beside the file. Every run's files are checked to exist here, so a typo is reported
// before anything is simulated.
[[nodiscard]] Expected<PublishedRunsFile> loadPublishedRuns(const std::string& path,
                                                            const std::string& modelsDir,
                                                            const std::string& clustersDir);

struct PublishedRunResult {
    double stepMs = 0;
    double tokensPerSPerGpu = 0;
    double tokensError = 0;  // (predicted - published) / published
    int64_t peakAllocatedBytes = 0, peakReservedBytes = 0, deviceMemoryBytes = 0;
    std::optional<double> reservedError;
    bool oom = false;
    double computeMs = 0, exposedCommMs = 0, mfu = 0;
    std::string clusterName;
};

// Simulates one run from its description: the plan file with the overrides, a mesh of
// `gpus` ranks, the run's micro-batch and sequence length, on the profile with as many
// nodes as the run used.
[[nodiscard]] Expected<PublishedRunResult> predictPublishedRun(const PublishedRunsFile& f,
                                                               const PublishedRun& run,
                                                               const std::string& modelsDir,
                                                               const std::string& clustersDir);

struct PublishedSummary {
    std::string gpu;
    int runs = 0;
    double medianAbsTokensError = 0, maxAbsTokensError = 0;
    int reservedRuns = 0;
    double maxAbsReservedError = 0;
    int oomRuns = 0;  // predicted out of memory (every published run ran)
};
// Per GPU kind, in the order the kinds first appear.
[[nodiscard]] std::vector<PublishedSummary> summarizePublished(
    const std::vector<PublishedRun>& runs, const std::vector<PublishedRunResult>& results);

}  // namespace shardscope
