// SPDX-License-Identifier: Apache-2.0
#pragma once
// A small JSON parser for one trace event at a time: the importer cuts the file into
// events (streaming, never the whole file) and parses each from its bytes here, straight
// into an ordered (vector-backed) nlohmann value. It does what nlohmann's own parser does
// per event without its per-character token buffer and stream calls, which made the
// import about twice as slow (shardscope-gui-bench prints the figures).
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace shardscope {

// Parses exactly one JSON value (surrounding whitespace allowed). On a syntax error returns
// false and sets `error` to what was expected and the offset.
[[nodiscard]] bool parseJsonSpan(std::string_view text, nlohmann::ordered_json& out,
                                 std::string& error);

}  // namespace shardscope
