// SPDX-License-Identifier: Apache-2.0
#pragma once
// The pieces of `recommend`'s report: a candidate as JSON and as one line, what to do when
// nothing fits, and the recommendation with what each allowed option buys, the default,
// the current plan, where the memory goes, exposed communication and the Pareto front.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "engine/search/search.h"
#include "plans/cluster/cluster.h"
#include "plans/model/model_graph.h"

namespace shardscope::cli {

[[nodiscard]] std::string ms(int64_t ns);
[[nodiscard]] nlohmann::json candidateJson(const Candidate& c);
[[nodiscard]] std::string line(const Candidate& c);

// No plan fits the budget: the closest plan, by how much it misses, and what binds.
void printNoPlanFits(const SearchResult& res, double headroom);

// The best plan and what surrounds it; `mine` is the --current plan's candidate, if any.
void printRecommendation(const SearchResult& res, const Candidate* mine, const ModelGraph& g,
                         const ClusterSpec& cluster);

}  // namespace shardscope::cli
