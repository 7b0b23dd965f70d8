// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/process_groups.h"

#include "engine/exec/cuda_support.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace shardscope::exec {

c10d::Backend& Groups::postForwardGroup(int64_t k) const {
    for (const auto& [size, pg] : postForward)
        if (size == k) return *pg;
    throw std::logic_error("no post-forward group of size " + std::to_string(k));
}

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

int64_t envInt(const char* name) {
    const std::string v = env(name);
    if (v.empty())
        throw std::runtime_error(std::string("environment variable ") + name +
                                 " is not set (launch with `shardscope run`, torchrun, or set "
                                 "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)");
    try {
        size_t used = 0;
        const long long x = std::stoll(v, &used);
        if (used != v.size() || x < 0) throw std::invalid_argument(v);
        return x;
    } catch (const std::exception&) {
        throw std::runtime_error(std::string("environment variable ") + name +
                                 ": expected a non-negative integer, got \"" + v + "\"");
    }
}

c10::intrusive_ptr<c10d::Backend> gloo(const c10::intrusive_ptr<c10d::Store>& store,
                                       const std::string& prefix, int rank, int size,
                                       std::chrono::milliseconds timeout) {
    auto opts = c10d::ProcessGroupGloo::Options::create();
    const std::string ifname = env("GLOO_SOCKET_IFNAME");
    if (!ifname.empty())
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    else if (env("MASTER_ADDR") == "127.0.0.1" || env("MASTER_ADDR") == "localhost")
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    else
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    opts->timeout = timeout;
    auto ps = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(ps, rank, size, opts);
}

}  // namespace

namespace {
// Bounds the rendezvous (the store, then each group's connections): a client connected to a
// listener that is not a TCPStore (another program on MASTER_PORT) waits in recv with no
// timeout of its own. Past `limit` the rank says so and exits 1; a launcher sees it fail.
class RendezvousWatchdog {
public:
    explicit RendezvousWatchdog(std::chrono::milliseconds limit)
        : m_thread([this, limit] {
              std::unique_lock<std::mutex> lock(m_mutex);
              if (m_cv.wait_for(lock, limit, [this] { return m_done; })) return;
              const std::string addr =
                  (env("MASTER_ADDR").empty() ? std::string("127.0.0.1") : env("MASTER_ADDR")) +
                  ":" + env("MASTER_PORT");
              std::fprintf(stderr,
                           "shardscope-engine rank %s: error: the rendezvous at %s did not "
                           "complete within %lld s (is another program listening on "
                           "MASTER_PORT, or did a rank not start?)\n",
                           env("RANK").c_str(), addr.c_str(),
                           static_cast<long long>(limit.count() / 1000));
              std::fflush(stderr);
              std::_Exit(1);
          }) {}
    ~RendezvousWatchdog() {
        {
            std::lock_guard<std::mutex> lock(m_mutex);
            m_done = true;
        }
        m_cv.notify_all();
        m_thread.join();
    }
    RendezvousWatchdog(const RendezvousWatchdog&) = delete;
    RendezvousWatchdog& operator=(const RendezvousWatchdog&) = delete;

private:
    std::mutex m_mutex;
    std::condition_variable m_cv;
    bool m_done = false;
    std::thread m_thread;  // last: starts once the members it uses exist
};

// The collective timeout plus start-up slack: every rank must have joined by then.
std::chrono::milliseconds rendezvousLimit(std::chrono::milliseconds timeout) {
    return timeout + std::chrono::milliseconds(5000);
}

// A rendezvous address on this machine only: what `run --nproc N` sets, and a torchrun
// launch whose MASTER_ADDR is loopback.
bool isLoopback(const std::string& host) {
    return host == "localhost" || host.rfind("127.", 0) == 0;
}

// A socket listening on 127.0.0.1:port, for the store to serve on (TCPStoreOptions::
// masterListenFd): c10d's own listener binds every interface, and the store has no
// authentication, so a run whose ranks are all on this machine must not be reachable from
// another. The descriptor passes to the store, which closes it.
int loopbackListener(uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket(): ") + std::strerror(errno));
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(fd, SOMAXCONN) != 0) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        throw std::runtime_error("cannot listen on 127.0.0.1:" + std::to_string(port) +
                                 " for the rendezvous store: " + why);
    }
    return fd;
}

// This rank's place and the rendezvous store, from the torchrun environment.
c10::intrusive_ptr<c10d::Store> joinStore(Groups& gr, std::chrono::milliseconds timeout) {
    gr.rank = envInt("RANK");
    gr.worldSize = envInt("WORLD_SIZE");
    const int64_t port = envInt("MASTER_PORT");
    const std::string host = env("MASTER_ADDR").empty() ? "127.0.0.1" : env("MASTER_ADDR");
    if (gr.rank >= gr.worldSize)
        throw std::runtime_error("RANK " + std::to_string(gr.rank) + " is not below WORLD_SIZE " +
                                 std::to_string(gr.worldSize));
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    // Under torchrun the agent already serves the store on MASTER_PORT.
    so.isServer = gr.rank == 0 && env("TORCHELASTIC_USE_AGENT_STORE") != "True";
    so.numWorkers = static_cast<size_t>(gr.worldSize);
    so.waitWorkers = true;
    so.timeout = timeout;
    // Every rank on this machine: serve on loopback only. Another MASTER_ADDR (torchrun or
    // SLURM across machines) keeps PyTorch's listener, which the other machines reach.
    if (so.isServer && isLoopback(host)) so.masterListenFd = loopbackListener(so.port);
    return c10::make_intrusive<c10d::TCPStore>(host, so);
}
}  // namespace

Groups makeFlatGroups(std::chrono::milliseconds timeout, c10::Device device) {
    RendezvousWatchdog dog(rendezvousLimit(timeout));
    Groups gr;
    auto store = joinStore(gr, timeout);
    const auto r32 = [](int64_t v) { return static_cast<int>(v); };
    gr.world = gloo(store, "world/", r32(gr.rank), r32(gr.worldSize), timeout);
    gr.shard = device.is_cuda()
                   ? makeNcclBackend(store, "nccl/flat/", r32(gr.rank), r32(gr.worldSize), timeout)
                   : gloo(store, "flat/", r32(gr.rank), r32(gr.worldSize), timeout);
    gr.replicate = gr.shard;
    gr.shardRank = gr.rank;
    gr.shardSize = gr.worldSize;
    return gr;
}

Groups makeGroups(const ResolvedPlan& plan, std::chrono::milliseconds timeout, c10::Device device) {
    RendezvousWatchdog dog(rendezvousLimit(timeout));
    Groups gr;
    auto store = joinStore(gr, timeout);
    if (gr.worldSize != plan.worldSize)
        throw std::runtime_error("WORLD_SIZE is " + std::to_string(gr.worldSize) +
                                 " but the plan's mesh has " + std::to_string(plan.worldSize) +
                                 " ranks");
    gr.shardSize = plan.shardSize;
    gr.replicateSize = plan.hsdp || plan.noShard ? plan.replicateSize : 1;
    // Mesh [replicate, shard], row-major: rank = replica * shard_size + shard index.
    const int64_t replica = gr.rank / gr.shardSize, idx = gr.rank % gr.shardSize;
    gr.shardRank = idx;
    gr.replicateRank = replica;
    const auto r32 = [](int64_t v) { return static_cast<int>(v); };
    // The FSDP groups: NCCL on a GPU, Gloo on CPU. The world group stays on Gloo.
    const auto fsdpGroup = [&](const std::string& prefix, int64_t rank, int64_t size) {
        return device.is_cuda()
                   ? makeNcclBackend(store, "nccl/" + prefix, r32(rank), r32(size), timeout)
                   : gloo(store, prefix, r32(rank), r32(size), timeout);
    };
    gr.world = gloo(store, "world/", r32(gr.rank), r32(gr.worldSize), timeout);
    gr.shard = fsdpGroup("shard/" + std::to_string(replica) + "/", idx, gr.shardSize);
    gr.replicate = gr.replicateSize > 1 ? fsdpGroup("replicate/" + std::to_string(idx) + "/",
                                                    replica, gr.replicateSize)
                                        : gr.shard;
    std::vector<int64_t> ks;
    for (const auto& u : plan.units)
        if (u.reshard == Reshard::Int && std::find(ks.begin(), ks.end(), u.reshardK) == ks.end())
            ks.push_back(u.reshardK);
    for (int64_t k : ks)
        gr.postForward.push_back(
            {k, fsdpGroup("pf" + std::to_string(k) + "/" + std::to_string(replica) + "/" +
                              std::to_string(idx / k) + "/",
                          idx % k, k)});
    return gr;
}

Groups singleProcessGroups() {
    return Groups{};
}

}  // namespace shardscope::exec
