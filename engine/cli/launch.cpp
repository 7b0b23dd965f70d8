// SPDX-License-Identifier: Apache-2.0
#include "engine/cli/launch.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "engine/cli/common.h"

namespace shardscope::cli {

namespace {

namespace fs = std::filesystem;

volatile sig_atomic_t g_interrupted = 0;
void onSignal(int sig) {
    g_interrupted = sig;
}

int freePort() {
    const int s = ::socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = -1;
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
        port = ntohs(a.sin_port);
    ::close(s);
    return port;
}

std::string tail(const fs::path& p, size_t lines) {
    std::ifstream in(p);
    std::vector<std::string> all;
    for (std::string l; std::getline(in, l);)
        all.push_back(l);
    std::string out;
    for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
        out += "    " + all[i] + "\n";
    return out;
}

// A rank's log ends in a collective timeout (Gloo's "Application timeout", NCCL's
// watchdog, c10d's "timed out").
bool timedOut(const fs::path& log) {
    std::string t = tail(log, 6);
    for (char& c : t)
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return t.find("timeout") != std::string::npos || t.find("timed out") != std::string::npos;
}

}  // namespace

Expected<fs::path> findEngine() {
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    const fs::path engine = self.parent_path() / "shardscope-engine";
    if (ec || !fs::exists(engine)) {
        const std::string msg = "shardscope-engine not found beside " + self.string() +
                                " (this build has no LibTorch engine; see `shardscope doctor`)";
        std::cerr << "error: " << msg << "\n";
        return Error{msg};
    }
    return engine;
}

Expected<int64_t> threadsPerRank(int64_t nproc, int64_t given) {
    constexpr int64_t kMaxRanks = 1024;
    if (nproc > kMaxRanks)
        return Error{"--nproc " + std::to_string(nproc) + ": more than " +
                     std::to_string(kMaxRanks) +
                     " local ranks; use a real launcher (torchrun) across machines"};
    const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
    const int64_t threads =
        given > 0 ? given : std::max<int64_t>(1, cores / std::max<int64_t>(1, nproc));
    if (threads > 4 * cores)
        return Error{"--threads " + std::to_string(threads) + ": this machine has " +
                     std::to_string(cores) + " cores; more than " + std::to_string(4 * cores) +
                     " threads per rank only contend for them"};
    return threads;
}

Expected<fs::path> makeRunFolder(const std::string& prefix) {
    // In $TMPDIR, as other tools put their temporary files.
    std::error_code tmpEc;
    std::string tmpl = (fs::temp_directory_path(tmpEc) / (prefix + "-XXXXXX")).string();
    if (tmpEc) tmpl = "/tmp/" + prefix + "-XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
        const std::string msg =
            "cannot create a temporary folder from " + tmpl + ": " + std::strerror(errno);
        std::cerr << "error: " << msg << "\n";
        return Error{msg};
    }
    return fs::path(tmpl);
}

// Starts rank `rk` of `nproc` as torchrun would (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT), its result to DIR/rank<rk>.json and its output to DIR/rank<rk>.log (rank 0
// keeps stdout). Returns its pid.
pid_t spawnRank(const std::vector<std::string>& common, int64_t rk, int64_t nproc,
                const fs::path& dir, int port, pid_t launcher) {
    std::vector<std::string> args = common;
    args.push_back("--out");
    args.push_back((dir / ("rank" + std::to_string(rk) + ".json")).string());
    const std::string log = (dir / ("rank" + std::to_string(rk) + ".log")).string();
    const pid_t pid = ::fork();
    if (pid == 0) {
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans if the launcher dies
        if (::getppid() != launcher) ::_exit(1);
        ::setpgid(0, 0);
        const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            if (rk != 0) ::dup2(fd, 1);
            ::dup2(fd, 2);
            ::close(fd);
        }
        ::setenv("RANK", std::to_string(rk).c_str(), 1);
        ::setenv("LOCAL_RANK", std::to_string(rk).c_str(), 1);
        ::setenv("WORLD_SIZE", std::to_string(nproc).c_str(), 1);
        ::setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
        ::setenv("MASTER_ADDR", "127.0.0.1", 1);
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        std::vector<char*> cargs;
        for (auto& s : args)
            cargs.push_back(s.data());
        cargs.push_back(nullptr);
        ::execv(cargs[0], cargs.data());
        ::_exit(127);
    }
    return pid;
}

// Says which rank failed first and how, which ones were stopped, and the last lines of
// every failed rank's log.
void reportFailure(int64_t firstFailure, const std::vector<int64_t>& stopped, int64_t grace,
                   int64_t timeoutS, const std::vector<int>& status, int64_t nproc,
                   const fs::path& dir) {
    if (!stopped.empty() && grace == 2) {
        // The first failure was a timeout waiting for the ranks that never finished.
        std::cerr << "error: rank";
        for (size_t i = 0; i < stopped.size(); ++i)
            std::cerr << (i ? ", " : " ") << stopped[i];
        std::cerr << " stopped responding (hung, or stopped by a signal): rank " << firstFailure
                  << " timed out waiting for " << (stopped.size() > 1 ? "them" : "it") << " after "
                  << timeoutS << " s; every rank was stopped.";
    } else {
        std::cerr << "error: rank " << firstFailure << " failed";
        const int st = status[static_cast<size_t>(firstFailure)];
        if (WIFSIGNALED(st)) std::cerr << " (killed by signal " << WTERMSIG(st) << ")";
        std::cerr << "; every rank was stopped.";
        for (int64_t rk : stopped)
            std::cerr << " Rank " << rk << " had not exited " << grace
                      << " s after that (hung? its log says where it was).";
    }
    std::cerr << " Last lines of each failed rank's log:\n";
    for (int64_t rk = 0; rk < nproc; ++rk) {
        const int s = status[static_cast<size_t>(rk)];
        if (WIFEXITED(s) && WEXITSTATUS(s) == 0) continue;
        std::cerr << "  rank " << rk << ":\n"
                  << tail(dir / ("rank" + std::to_string(rk) + ".log"), 4);
    }
}

int launchLocalRanks(const std::vector<std::string>& common, int64_t nproc, const fs::path& dir,
                     int64_t timeoutS, const std::string& who) {
    const int port = freePort();
    struct sigaction sa {};
    sa.sa_handler = onSignal;
    sigemptyset(&sa.sa_mask);
    struct sigaction oldInt {
    }, oldTerm{};
    sigaction(SIGINT, &sa, &oldInt);
    sigaction(SIGTERM, &sa, &oldTerm);
    const pid_t launcher = ::getpid();
    std::vector<pid_t> pids;
    for (int64_t rk = 0; rk < nproc; ++rk) {
        const pid_t pid = spawnRank(common, rk, nproc, dir, port, launcher);
        pids.push_back(pid);
    }
    auto killAll = [&](int sig) {
        for (pid_t p : pids)
            if (p > 0) ::kill(p, sig);
    };
    std::vector<int> status(static_cast<size_t>(nproc), -1);
    int64_t firstFailure = -1;
    auto failedAt = std::chrono::steady_clock::now();
    size_t running = pids.size();
    bool killed = false;
    std::vector<int64_t> stopped;  // ranks still running long after the first failure
    int64_t grace = -1;            // seconds the others get after the first failure
    const auto started = std::chrono::steady_clock::now();
    int64_t lastReport = -1;
    // Collects one exited rank, if any: its status, and the first failure and when.
    auto reap = [&]() {
        int st = 0;
        const pid_t p = ::waitpid(-1, &st, WNOHANG);
        if (p <= 0) return false;
        for (size_t i = 0; i < pids.size(); ++i)
            if (pids[i] == p) {
                status[i] = st;
                pids[i] = -1;
                --running;
                const bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
                if (!ok && firstFailure < 0) {
                    firstFailure = static_cast<int64_t>(i);
                    failedAt = std::chrono::steady_clock::now();
                }
            }
        return true;
    };
    while (running > 0) {
        if (reap()) continue;
        if (g_interrupted && !killed) {
            std::cerr << "\n" + who + ": interrupted; stopping every rank\n";
            killAll(SIGTERM);
            std::this_thread::sleep_for(std::chrono::seconds(2));
            killAll(SIGKILL);
            killed = true;
        }
        // After a failure the others should fail in their collectives within the timeout;
        // any that are still there after it (plus a grace period) are killed. When the first
        // failure was itself a collective timeout, every rank has waited that long already:
        // one still running 2 s later is the culprit (hung, or stopped with SIGSTOP).
        if (firstFailure >= 0 && grace < 0)
            grace =
                timedOut(dir / ("rank" + std::to_string(firstFailure) + ".log")) ? 2 : timeoutS + 2;
        if (firstFailure >= 0 && !killed &&
            std::chrono::steady_clock::now() - failedAt > std::chrono::seconds(grace)) {
            std::cerr << who + ": stopping the ranks still running " << grace << " s after rank "
                      << firstFailure << " failed\n";
            for (size_t i = 0; i < pids.size(); ++i)
                if (pids[i] > 0) stopped.push_back(static_cast<int64_t>(i));
            killAll(SIGTERM);  // each prints the op it was in
            killAll(SIGCONT);  // a stopped rank handles its SIGTERM only once it runs
            const auto termAt = std::chrono::steady_clock::now();
            while (std::chrono::steady_clock::now() - termAt < std::chrono::seconds(2)) {
                if (reap()) {
                    if (running == 0) break;
                    continue;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
            killAll(SIGKILL);
            killed = true;
        }
        const auto el = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::steady_clock::now() - started)
                            .count();
        if (el >= 10 && el % 10 == 0 && el != lastReport && firstFailure < 0) {
            lastReport = el;
            std::cerr << who + ": " << el << " s, " << running << " of " << nproc
                      << " ranks running\n";
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    sigaction(SIGINT, &oldInt, nullptr);
    sigaction(SIGTERM, &oldTerm, nullptr);
    if (g_interrupted) {
        std::cerr << who + ": stopped by signal; logs in " << dir.string() << "\n";
        return 128 + g_interrupted;  // the shell's convention: 130 for SIGINT, 143 for SIGTERM
    }
    if (firstFailure >= 0) {
        reportFailure(firstFailure, stopped, grace, timeoutS, status, nproc, dir);
        return kExitFailed;
    }
    return kExitOk;
}

}  // namespace shardscope::cli
