// SPDX-License-Identifier: Apache-2.0
// What `recommend` keeps fixed (--fix) and what else it may search (--allow).
#include "engine/cli/recommend_options.h"

#include <cstdlib>
#include <vector>

#include "plans/core/strings.h"

namespace shardscope::cli {

// --fix KEY=VALUE[,KEY=VALUE...]: the choices the user has made, which the search keeps.
Status applyFixes(const std::string& text, SearchOptions& o, FixedChoices& fixed) {
    static const std::vector<std::string> keys{"reduce_dtype", "api", "activation_checkpointing",
                                               "micro_batch"};
    for (const std::string& item : split(text, ',')) {
        const auto eq = item.find('=');
        const std::string key = trim(item.substr(0, eq));
        const std::string value = eq == std::string::npos ? "" : trim(item.substr(eq + 1));
        if (eq == std::string::npos || value.empty())
            return Error{"--fix " + item + ": expected KEY=VALUE, e.g. reduce_dtype=float32"};
        auto bad = [&](const std::string& expected) {
            return Error{"--fix " + key + "=" + value + ": expected " + expected};
        };
        if (key == "reduce_dtype") {
            const auto d = parseDType(value);
            if (!d || (*d != DType::Float32 && *d != DType::BFloat16))
                return bad("float32 or bfloat16 (the reduce-scatter's dtype)");
            o.reduceDtypes = {*d};
            fixed.reduceDtype = true;
        } else if (key == "api") {
            if (value != "fsdp1" && value != "fsdp2") return bad("fsdp1 or fsdp2");
            fixed.fsdp1 = value == "fsdp1";
        } else if (key == "activation_checkpointing") {
            if (value == "none")
                o.activationCheckpointing = AcMode::None;
            else if (value == "full")
                o.activationCheckpointing = AcMode::Full;
            else if (value == "selective_op")
                o.activationCheckpointing = AcMode::SelectiveOp;
            else
                return bad("none, full or selective_op");
        } else if (key == "micro_batch") {
            char* end = nullptr;
            const long long v = std::strtoll(value.c_str(), &end, 10);
            if (end == value.c_str() || *end != '\0' || v < 1) return bad("a positive integer");
            o.microBatch = v;
        } else {
            return Error{"--fix " + item + ": unknown choice \"" + key + "\"" +
                         didYouMean(key, keys) +
                         " (reduce_dtype, api, activation_checkpointing, micro_batch)"};
        }
    }
    return {};
}

Status applyAllow(const std::string& text, SearchOptions& o) {
    for (const std::string& item : split(text, ',')) {
        const std::string what = trim(item);
        if (what == "compile") {
            if (o.fsdp1Compatible) {
                return Error{
                    "--allow compile: the search compiles FSDP2 units (torchtitan's "
                    "per-block compile); FSDP1 and Lightning exports cannot apply it"};
            }
            o.compileModes = {CompileMode::None, CompileMode::PerBlock};
        } else if (what == "float8") {
            if (o.fsdp1Compatible) {
                return Error{
                    "--allow float8: float8 all-gather is FSDP2's; FSDP1 and Lightning's "
                    "FSDPStrategy exports cannot apply it"};
            }
            o.allowFloat8 = true;
        } else {
            return Error{"--allow " + what + ": expected compile or float8" +
                         didYouMean(what, {"compile", "float8"})};
        }
    }
    return {};
}

}  // namespace shardscope::cli
