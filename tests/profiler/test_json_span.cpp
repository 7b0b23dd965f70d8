// SPDX-License-Identifier: Apache-2.0
// The importer's per-event JSON parser gives what nlohmann's parser gives, and refuses
// what it refuses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "profiler/import/json_span.h"

using shardscope::parseJsonSpan;

namespace {

void same(const std::string& text) {
    nlohmann::ordered_json mine;
    std::string err;
    ASSERT_TRUE(parseJsonSpan(text, mine, err)) << text << ": " << err;
    const auto ref = nlohmann::ordered_json::parse(text);
    EXPECT_EQ(mine, ref) << text;
    EXPECT_EQ(mine.dump(), ref.dump()) << text;  // types too: unsigned, signed, float
}

}  // namespace

TEST(JsonSpan, ParsesWhatNlohmannParses) {
    same(R"({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "pid": 0,
             "tid": 7, "ts": 1700000000123.456, "dur": 12.5,
             "args": {"External id": 31, "Input Dims": [[1, 2], [], [3]], "flag": true,
                      "none": null, "neg": -42, "exp": 1.5e-3, "big": 18446744073709551615,
                      "tiny": 1e-400, "zero": 0, "negzero": -0.0}})");
    same(
        R"({"name": "quote \" backslash \\ slash \/ tab \t nl \n uni \u00b7 \u4e2d pair \ud83d\ude00"})");
    same(R"([])");
    same(R"({})");
    same(R"("lone string")");
    same(R"(  [1, -2, 3.25, "x", {"a": [{"b": {}}]}]  )");
    same(R"({"dup": 1, "dup": 2})");
}

TEST(JsonSpan, RefusesWhatNlohmannRefuses) {
    for (const char* bad :
         {R"({"a": 1,})", R"({"a" 1})", R"({"a": "unterminated})", R"({"a": "\x"})", R"({"a": 01})",
          R"({"a": 1.})", R"({"a": -})", R"({"a": tru})", R"([1, 2)", R"({"a": "\ud83d"})",
          "{\"a\": \"ctl\x01\"}", R"({"a": 1} x)", R"()", R"({"a": 1e400})"}) {
        nlohmann::ordered_json out;
        std::string err;
        EXPECT_FALSE(parseJsonSpan(bad, out, err)) << bad;
        EXPECT_FALSE(err.empty()) << bad;
        EXPECT_FALSE(nlohmann::json::accept(bad)) << "nlohmann accepts " << bad;
    }
}
