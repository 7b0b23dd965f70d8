// SPDX-License-Identifier: Apache-2.0
// `shardscope bench import` (trace import speed and memory) and `bench memory` (the memory
// fidelity table, run by the set-up script's Python).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "engine/cli/bench_cli.h"
#include "engine/cli/common.h"
#include "plans/core/atomic_write.h"
#include "profiler/import/kineto_import.h"
#include "profiler/import/synthetic_trace.h"

namespace shardscope::cli {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Uncompressed bytes of a trace file (gzip or plain).
int64_t uncompressedBytes(const std::string& path) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f) return -1;
    std::vector<char> buf(1 << 20);
    int64_t total = 0;
    for (int n; (n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0;)
        total += n;
    gzclose(f);
    return total;
}

// Imports `path` in a child process, so its peak resident memory is the import's alone.
bool measureImport(const std::string& path) {
    const int64_t bytes = uncompressedBytes(path);
    if (bytes < 0) {
        std::cerr << "error: " << path << ": cannot open file\n";
        return false;
    }
    int fds[2];
    if (::pipe(fds) != 0) return false;
    const pid_t child = ::fork();
    if (child == 0) {
        ::close(fds[0]);
        // Resident memory before the import: the process itself (binary, libraries).
        long baselineKiB = 0;
        if (FILE* st = std::fopen("/proc/self/status", "r")) {
            char l[256];
            while (std::fgets(l, sizeof l, st))
                if (std::sscanf(l, "VmRSS: %ld kB", &baselineKiB) == 1) break;
            std::fclose(st);
        }
        const auto t0 = Clock::now();
        auto t = importKinetoFile(path);
        const double s = secondsSince(t0);
        double inMemory = 0;
        int64_t events = 0;
        if (t) {
            // Everything the trace holds: columns, collectives, flows, lanes, memory
            // counters and interned strings with their index, at their capacity.
            events = static_cast<int64_t>(t->size());
            inMemory = static_cast<double>(t->memoryBytes());
        }
        char msg[128];
        const int n = std::snprintf(msg, sizeof msg, "%d %.6f %lld %.0f %ld", t ? 1 : 0, s,
                                    static_cast<long long>(events), inMemory, baselineKiB);
        if (::write(fds[1], msg, static_cast<size_t>(n)) < 0) _exit(1);
        _exit(0);
    }
    ::close(fds[1]);
    char msg[128] = {};
    const ssize_t got = ::read(fds[0], msg, sizeof msg - 1);
    ::close(fds[0]);
    int status = 0;
    rusage ru{};
    ::wait4(child, &status, 0, &ru);
    int ok = 0;
    double seconds = 0, inMemory = 0;
    long long events = 0;
    long baselineKiB = 0;
    if (got <= 0 ||
        std::sscanf(msg, "%d %lf %lld %lf %ld", &ok, &seconds, &events, &inMemory, &baselineKiB) !=
            5 ||
        !ok) {
        std::cerr << "error: " << path
                  << ": the import failed (shardscope trace summary says why)\n";
        return false;
    }
    const double peak = static_cast<double>(ru.ru_maxrss) * 1024.0;  // KiB on Linux
    const double base = static_cast<double>(baselineKiB) * 1024.0;
    std::printf(
        "  %s\n    %.1f MB of JSON, %lld events: %.2f s, %.0f MB/s (goal >= 400)\n"
        "    peak resident %.0f MB, of which the import %.0f MB (the process before it: "
        "%.0f MB) for a %.0f MB trace in memory: %.2fx (goal <= 2)\n",
        path.c_str(), static_cast<double>(bytes) / 1e6, events, seconds,
        static_cast<double>(bytes) / 1e6 / seconds, peak / 1e6, (peak - base) / 1e6, base / 1e6,
        inMemory / 1e6, (peak - base) / inMemory);
    return true;
}

}  // namespace

int runBenchImport(const Args& a) {
    auto mb = a.getInt("--size-mb", 1);
    if (!mb) {
        std::cerr << "error: " << mb.error() << "\n";
        return kExitUsage;
    }
    const std::string keep = a.get("--keep");
    std::string path = keep;
    if (keep.empty()) {
        auto tmp = makeTempFile("shardscope-bench-import", ".json");
        if (failed(tmp)) return kExitUsage;
        path = *tmp;
    }
    std::printf("shardscope bench import: the streaming Kineto importer, one core\n\n");
    SyntheticTraceOptions o;
    o.bytes = *mb * 1'000'000;
    try {
        const auto t0 = Clock::now();
        const int64_t n = writeSyntheticTrace(path, o);
        std::printf("  generated a %d-rank trace of %lld events (%.1f s)\n", o.ranks,
                    static_cast<long long>(n), secondsSince(t0));
    } catch (const std::exception& e) {
        std::cerr << "error: " << e.what() << "\n";
        return kExitUsage;
    }
    bool ok = measureImport(path);
    if (keep.empty()) std::filesystem::remove(path);
    if (a.has("--file")) ok = measureImport(a.get("--file")) && ok;
    return ok ? kExitOk : kExitUsage;
}

// `bench memory`: the memory fidelity table, PyTorch's FSDPMemTracker against the simulator
// on full-size models (tests/oracles/bench_memory.py, which needs torch and transformers: the
// set-up script's virtual environment).
int runBenchMemory(const Args& a) {
    const std::string python = setupPython();
    const std::string script = dataPath("tests/oracles/bench_memory.py");
    std::error_code ec;
    if (!std::filesystem::exists(script, ec)) {
        std::cerr << "error: " << script << " is not there (bench memory runs from a checkout)\n";
        return kExitUsage;
    }
    std::vector<std::string> argv = {python, script};
    if (a.flag("--quick")) argv.push_back("--quick");
    if (a.has("--filter")) argv.insert(argv.end(), {"--filter", a.get("--filter")});
    if (a.has("--json")) argv.insert(argv.end(), {"--json", a.get("--json")});
    std::cout << "shardscope bench memory: " << python << " " << script
              << (a.flag("--quick") ? " --quick" : "") << "\n"
              << std::flush;
    // The script runs this shardscope (not whatever build/ holds).
    const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    std::vector<std::pair<std::string, std::string>> env;
    if (!self.empty()) env.emplace_back("SHARDSCOPE_BIN", self);
    const ChildExit r = runChild(argv, /*stdoutToStderr=*/false, env);
    if (!r.started) {
        std::cerr << "error: cannot start " << python << "\n";
        return kExitUsage;
    }
    if (r.exited && r.code == 127) {
        std::cerr << "error: " << python
                  << " did not run the table (needs torch and transformers: run `bash "
                     "scripts/setup.sh build`, or set SHARDSCOPE_PYTHON)\n";
        return kExitUsage;
    }
    return r.exited ? r.code : kExitFailed;
}

}  // namespace shardscope::cli
