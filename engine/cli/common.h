// SPDX-License-Identifier: Apache-2.0
#pragma once
// Pieces shared by the subcommands: loading inputs named on the command line with clear
// errors, writing outputs atomically, and plain-text tables.
#include <nlohmann/json.hpp>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "engine/cli/args.h"
#include "plans/cluster/cluster.h"
#include "plans/model/model_json.h"
#include "plans/plan/plan_json.h"
#include "profiler/import/kineto_import.h"

namespace shardscope::cli {

// Exit codes: 0 success, 1 the input is valid but the check failed (validate found
// errors), 2 bad usage or unreadable input.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// Prints "error: <message>" for a failed result and says so; commands then return
// kExitUsage.
template <typename T>
[[nodiscard]] bool failed(const Expected<T>& e, const std::string& prefix = "") {
    if (e.ok()) return false;
    std::cerr << "error: " << prefix << e.error() << "\n";
    return true;
}

// Options every command that reads a model takes.
std::vector<OptionSpec> modelOptions(bool required);
// Reads the integer options `names` (each at least its `mins`) into `out`, 0 where absent;
// prints the error and returns false on a bad value.
// Import options for the trace commands: progress lines on stderr ("reading the trace:
// 25% (1.2 s)", every quarter) for a file that takes more than a second, when stderr is a
// terminal or SHARDSCOPE_PROGRESS=1 (which also drops the one-second wait).
[[nodiscard]] KinetoImportOptions traceImportOptions();

[[nodiscard]] bool readIntOptions(const Args& a, const std::vector<const char*>& names,
                                  const std::vector<int64_t>& mins, std::vector<int64_t>& out);
[[nodiscard]] Expected<ModelGraph> loadModelArg(const Args& a);

// The set-up script's Python: $SHARDSCOPE_PYTHON, else the one the build was configured
// with, else python3.
[[nodiscard]] std::string setupPython();

// Runs argv (argv[0] searched on PATH) and waits for it. `stdoutToStderr`: its standard output
// joins standard error, so that a command's own output stays clean; `env` is set in the
// child where not already set. A child that cannot exec exits 127 after saying why.
struct ChildExit {
    bool started = false;  // forked and waited for
    bool exited = false;   // exited (not killed by a signal)
    int code = 0;          // its exit status, when it exited
};
[[nodiscard]] ChildExit runChild(const std::vector<std::string>& argv, bool stdoutToStderr,
                                 const std::vector<std::pair<std::string, std::string>>& env = {});
// A bundled sample named relative to the checkout ("samples/..."): found from the current
// folder, else under the source tree this binary was built from, so defaults work from
// anywhere.
// Where the bundled samples, scripts and oracles are, first found: $SHARDSCOPE_DATA_DIR, an
// installed tree next to the binary (bin/shardscope: share/shardscope), the checkout it was
// built in (build/engine/shardscope: the checkout), the source tree it was built from.
[[nodiscard]] std::vector<std::string> dataRoots();
// `path` (relative to the checkout: samples/..., scripts/...) under the first root that has
// it; under the source tree when none does.
[[nodiscard]] std::string dataPath(const std::string& path);
// A relative path as given when it exists here, else its bundled copy (dataPath).
[[nodiscard]] std::string samplePath(const std::string& path);
[[nodiscard]] Expected<std::optional<ClusterSpec>> loadClusterArg(const Args& a);
// A cluster named on the command line: a file, or the name of a bundled profile
// ("h100-sxm-80gb-ib" is samples/clusters/h100-sxm-80gb-ib.json).
[[nodiscard]] Expected<ClusterSpec> loadClusterNamed(const std::string& arg);

// Writes JSON to `path` atomically, or to stdout when path is "" or "-".
[[nodiscard]] Status emitJson(const nlohmann::json& j, const std::string& path);

class Table {
public:
    explicit Table(std::vector<std::string> headers, std::vector<bool> rightAlign = {});
    void row(std::vector<std::string> cells);
    void print(std::ostream& out) const;

private:
    std::vector<std::string> m_headers;
    std::vector<bool> m_right;
    std::vector<std::vector<std::string>> m_rows;
};

[[nodiscard]] std::string formatFlops(double flops);
// "12.34 ms" (decimals after the point), "61.0 MiB", and a relative error "+4.5%" of
// `value` against `reference` ("-" when the reference is 0).
[[nodiscard]] std::string formatMs(double ns, int decimals = 2);
[[nodiscard]] std::string formatMiB(double bytes);
[[nodiscard]] std::string formatError(double reference, double value);

}  // namespace shardscope::cli
