// SPDX-License-Identifier: Apache-2.0
// `shardscope-engine measure`: the microbenchmarks behind `shardscope calibrate --measure`.
// Rank 0 times GEMMs (square, by size and dtype), device copies and an elementwise add (by
// bytes), causal attention and the cost of launching a tiny op, while the other ranks wait;
// then every rank joins a collective sweep (all-gather, reduce-scatter, all-reduce by size)
// over the local ranks on Gloo (CPU) or NCCL (CUDA). Each point is timed `--reps` times, as
// that many "steps", so the fit can hold some back. Rank 0 writes the samples as JSON in the
// terms `calibrate --from-trace` fits (class, FLOPs or bytes, dtype, duration).
#include "engine/exec/measure.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "engine/exec/cuda_support.h"
#include "engine/exec/fsdp_runtime.h"
#include "engine/exec/worker.h"
#include "plans/core/atomic_write.h"

namespace shardscope::exec {

namespace {

struct Options {
    std::string out;
    std::string device = "cpu";
    int64_t threads = 1, reps = 4, timeoutS = 120;
    bool quick = false;
};

Options parse(const std::vector<std::string>& argv) {
    Options o;
    for (size_t i = 0; i < argv.size(); ++i) {
        const std::string& f = argv[i];
        if (f == "--quick") {
            o.quick = true;
            continue;
        }
        if (i + 1 >= argv.size()) throw std::runtime_error(f + " needs a value");
        const std::string& v = argv[++i];
        if (f == "--out")
            o.out = v;
        else if (f == "--device")
            o.device = v;
        else if (f == "--threads")
            o.threads = flagInt(f, v, 1);
        else if (f == "--reps")
            o.reps = flagInt(f, v, 2);
        else if (f == "--timeout-s")
            o.timeoutS = flagInt(f, v, 1);
        else
            throw std::runtime_error("unknown option " + f);
    }
    if (o.device != "cpu" && o.device != "cuda")
        throw std::runtime_error("--device: expected cpu or cuda, got \"" + o.device + "\"");
    return o;
}

std::string cpuName() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string l; std::getline(in, l);)
        if (l.rfind("model name", 0) == 0) {
            const auto c = l.find(':');
            if (c != std::string::npos) return l.substr(c + 2);
        }
    return "CPU";
}

class Timer {
public:
    Timer(bool cuda, double minSeconds) : m_cuda(cuda), m_min(minSeconds) {}
    // Seconds per call of `fn`: one call to warm up, then batches doubling until one takes
    // at least the minimum time.
    double perCall(const std::function<void()>& fn) const {
        fn();
        sync();
        for (int64_t n = 1;; n *= 2) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int64_t i = 0; i < n; ++i)
                fn();
            sync();
            const double s =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (s >= m_min || n >= (int64_t{1} << 20)) return s / static_cast<double>(n);
        }
    }

private:
    void sync() const {
        if (m_cuda) synchronizeCuda();
    }
    bool m_cuda;
    double m_min;
};

nlohmann::json sample(const char* cls, const std::string& op, int64_t rep, double seconds) {
    return {{"class", cls},
            {"op", op},
            {"step", rep},
            {"dur_ns", static_cast<int64_t>(seconds * 1e9 + 0.5)}};
}

}  // namespace

namespace {
// The kernels and collectives `calibrate --measure` times on this machine, each a list of
// samples in the format `calibrate --from-trace` fits.
struct Microbenchmarks {
    const Options& o;
    const Timer& timer;
    at::TensorOptions opts;
    bool cuda;
    int64_t rank;
    nlohmann::json& samples;

    void say(const std::string& what) const {
        if (rank == 0) std::cerr << "measure: " << what << "\n" << std::flush;
    }

    void gemms() {
        // GEMMs: n x n x n by dtype.
        std::vector<int64_t> sizes = cuda ? std::vector<int64_t>{256, 512, 1024, 2048, 4096, 8192}
                                          : std::vector<int64_t>{128, 256, 512, 1024, 2048};
        if (o.quick) sizes.resize(sizes.size() - 1);
        const std::pair<at::ScalarType, const char*> dtypes[] = {{at::kFloat, "float32"},
                                                                 {at::kBFloat16, "bfloat16"}};
        for (const auto& [dt, name] : dtypes) {
            say(std::string("GEMMs, ") + name);
            for (int64_t n : sizes) {
                // bf16 on a CPU is emulated and slow: its large sizes add time, not insight.
                if (!cuda && dt == at::kBFloat16 && n > 1024) continue;
                const at::Tensor a = at::randn({n, n}, opts.dtype(dt));
                const at::Tensor b = at::randn({n, n}, opts.dtype(dt));
                at::Tensor c = at::empty({n, n}, opts.dtype(dt));
                for (int64_t r = 0; r < o.reps; ++r) {
                    auto s =
                        sample("gemm", "aten::mm", r, timer.perCall([&] { at::mm_out(c, a, b); }));
                    s["flops"] = 2.0 * static_cast<double>(n) * static_cast<double>(n) *
                                 static_cast<double>(n);
                    s["dtype"] = name;
                    s["shape"] = {n, n, n};
                    samples.push_back(s);
                }
            }
        }
    }

    void memoryBound() {
        // Memory-bound: a copy (read + write) and an add (two reads + a write), fp32.
        say("copies and elementwise adds");
        std::vector<int64_t> bytes = cuda
                                         ? std::vector<int64_t>{int64_t{1} << 16, int64_t{1} << 20,
                                                                int64_t{1} << 24, int64_t{1} << 28}
                                         : std::vector<int64_t>{int64_t{1} << 14, int64_t{1} << 18,
                                                                int64_t{1} << 22, int64_t{1} << 26};
        if (o.quick) bytes.resize(bytes.size() - 1);
        for (int64_t b : bytes) {
            const int64_t n = b / 4;
            const at::Tensor x = at::randn({n}, opts.dtype(at::kFloat));
            const at::Tensor y = at::randn({n}, opts.dtype(at::kFloat));
            at::Tensor z = at::empty({n}, opts.dtype(at::kFloat));
            for (int64_t r = 0; r < o.reps; ++r) {
                auto c =
                    sample("memory-bound", "aten::copy_", r, timer.perCall([&] { z.copy_(x); }));
                c["bytes"] = 2.0 * static_cast<double>(b);
                samples.push_back(c);
                auto s = sample("memory-bound", "aten::add", r,
                                timer.perCall([&] { at::add_out(z, x, y); }));
                s["bytes"] = 3.0 * static_cast<double>(b);
                samples.push_back(s);
            }
        }
    }

    void attention() {
        // Causal attention with grouped-query keys and values, as decoder layers call SDPA
        // (enable_gqa, 4 query heads to a key/value head): on a GPU 32 query heads of 128 (a
        // Llama-3-8B layer) from 1,024 to 8,192 tokens, 1.7e10 to 1.1e12 FLOPs a call, the
        // sizes of the layers the simulator prices, forward and backward; on a CPU 8 heads of
        // 64, shorter sequences, forward. FLOPs as torch.utils.flop_counter counts SDPA (4 b h
        // s^2 d forward, 10 b h s^2 d backward, the causal mask not halving them), as
        // `calibrate --from-trace` and the simulator count them: the fitted efficiency of a
        // causal kernel may pass 1.
        say("attention");
        const int64_t heads = cuda ? 32 : 8, kvHeads = heads / 4, headDim = cuda ? 128 : 64;
        for (int64_t seq : cuda ? std::vector<int64_t>{1024, 2048, 4096, 8192}
                                : std::vector<int64_t>{256, 512, 1024}) {
            const auto dt = cuda ? at::kBFloat16 : at::kFloat;
            const at::Tensor q = at::randn({1, heads, seq, headDim}, opts.dtype(dt));
            const at::Tensor k = at::randn({1, kvHeads, seq, headDim}, opts.dtype(dt));
            const at::Tensor v = at::randn({1, kvHeads, seq, headDim}, opts.dtype(dt));
            const double fwdFlops = 4.0 * static_cast<double>(heads) * static_cast<double>(seq) *
                                    static_cast<double>(seq) * static_cast<double>(headDim);
            at::Tensor qg, kg, vg, out, grad;
            if (cuda) {  // a graph to run backward through, again and again
                qg = q.detach().requires_grad_(true);
                kg = k.detach().requires_grad_(true);
                vg = v.detach().requires_grad_(true);
                out =
                    at::scaled_dot_product_attention(qg, kg, vg, {}, 0.0, true, std::nullopt, true);
                grad = at::randn_like(out);
            }
            for (int64_t r = 0; r < o.reps; ++r) {
                auto s =
                    sample("attention", "aten::scaled_dot_product_attention", r, timer.perCall([&] {
                        at::NoGradGuard ng;
                        (void)at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, std::nullopt,
                                                               true);
                    }));
                s["flops"] = fwdFlops;
                s["dtype"] = cuda ? "bfloat16" : "float32";
                s["shape"] = {1, heads, seq, headDim};
                samples.push_back(s);
                if (!cuda) continue;
                auto b = sample("attention", "aten::_scaled_dot_product_attention_backward", r,
                                timer.perCall([&] {
                                    (void)torch::autograd::grad({out}, {qg, kg, vg}, {grad},
                                                                /*retain_graph=*/true);
                                }));
                b["flops"] = 2.5 * fwdFlops;
                b["dtype"] = "bfloat16";
                b["shape"] = {1, heads, seq, headDim};
                samples.push_back(b);
            }
        }
    }

    // All-gather, reduce-scatter and all-reduce over every rank, by shard size.
    void collectives(Groups& groups, int64_t world) {
        groups.world->barrier()->wait();
        say("collectives over " + std::to_string(world) + " ranks");
        std::vector<int64_t> shardBytes =
            cuda ? std::vector<int64_t>{int64_t{1} << 14, int64_t{1} << 18, int64_t{1} << 22,
                                        int64_t{1} << 26}
                 : std::vector<int64_t>{int64_t{1} << 12, int64_t{1} << 16, int64_t{1} << 20,
                                        int64_t{1} << 23};
        if (o.quick) shardBytes.resize(shardBytes.size() - 1);
        c10d::Backend& g = *groups.shard;
        for (int64_t b : shardBytes) {
            const int64_t n = b / 4;
            at::Tensor shard = at::randn({n}, opts.dtype(at::kFloat));
            at::Tensor full = at::randn({n * world}, opts.dtype(at::kFloat));
            const struct {
                const char* name;
                std::function<void()> run;
                double bytes;  // NCCL's size S
            } kinds[] = {
                {"allgather", [&] { g._allgather_base(full, shard)->wait(); },
                 static_cast<double>(b * world)},
                {"reduce_scatter",
                 [&] { g._reduce_scatter_base(shard, full, c10d::ReduceScatterOptions())->wait(); },
                 static_cast<double>(b * world)},
                {"allreduce",
                 [&] {
                     std::vector<at::Tensor> t{shard};
                     g.allreduce(t)->wait();
                 },
                 static_cast<double>(b)},
            };
            for (const auto& k : kinds)
                for (int64_t r = 0; r < o.reps; ++r) {
                    // Every rank runs the same number of calls: the first rank to decide on
                    // a batch size decides for all (a rank never waits in a collective alone).
                    k.run();
                    groups.world->barrier()->wait();
                    int64_t calls = 1;
                    double seconds = 0;
                    for (;;) {
                        const auto t0 = std::chrono::steady_clock::now();
                        for (int64_t i = 0; i < calls; ++i)
                            k.run();
                        if (cuda) synchronizeCuda();
                        seconds =
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                                .count();
                        // Agree on whether to go on: rank 0's view, broadcast.
                        std::vector<at::Tensor> more{
                            at::full({1}, rank == 0 && seconds < (o.quick ? 0.004 : 0.02) ? 1 : 0,
                                     at::TensorOptions().dtype(at::kLong))};
                        groups.world->broadcast(more)->wait();
                        if (more[0].item<int64_t>() == 0) break;
                        calls *= 2;
                    }
                    auto s = sample("collective", std::string("c10d::") + k.name, r,
                                    seconds / static_cast<double>(calls));
                    s["collective"] = k.name;
                    s["bytes"] = k.bytes;
                    s["group_size"] = world;
                    s["dtype"] = "float32";
                    samples.push_back(s);
                }
        }
    }
};

nlohmann::json deviceOf(bool cuda) {
    nlohmann::json deviceJson;
    if (cuda) {
        const CudaDeviceInfo info = cudaDeviceInfo();
        deviceJson = {{"kind", "gpu"}, {"name", info.name}, {"memory_bytes", info.memoryBytes}};
    } else {
        const int64_t mem = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) *
                            static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
        deviceJson = {{"kind", "cpu"}, {"name", cpuName()}, {"memory_bytes", mem}};
    }
    return deviceJson;
}

}  // namespace

int runMeasure(const std::vector<std::string>& argv) {
    const Options o = parse(argv);
    if (o.out.empty()) throw std::runtime_error("--out FILE is required");
    const bool cuda = o.device == "cuda";
    const char* ws = std::getenv("WORLD_SIZE");
    const int64_t world = ws ? std::max<int64_t>(1, std::atoll(ws)) : 1;
    const char* lr = std::getenv("LOCAL_RANK");
    if (cuda) useCudaDevice(lr ? std::atoi(lr) : 0);
    at::set_num_threads(static_cast<int>(o.threads));
    const c10::Device dev =
        cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(lr ? std::atoi(lr) : 0))
             : c10::Device(c10::kCPU);
    Groups groups;
    if (world > 1) groups = makeFlatGroups(std::chrono::seconds(o.timeoutS), dev);
    const int64_t rank = groups.rank;
    const Timer timer(cuda, o.quick ? 0.004 : 0.02);
    const auto opts = at::TensorOptions().device(dev);
    nlohmann::json samples = nlohmann::json::array();
    double launchNs = 0;

    if (rank == 0) {
        Microbenchmarks bench{o, timer, opts, cuda, rank, samples};
        bench.gemms();
        bench.memoryBound();
        bench.attention();
        // The cost of one tiny op, launch included.
        bench.say("launch cost");
        const at::Tensor one = at::ones({1}, opts.dtype(at::kFloat));
        at::Tensor out = at::empty({1}, opts.dtype(at::kFloat));
        launchNs = 1e9 * timer.perCall([&] { at::add_out(out, one, one); });
    }

    if (world > 1) Microbenchmarks{o, timer, opts, cuda, rank, samples}.collectives(groups, world);
    const nlohmann::json deviceJson = deviceOf(cuda);
    const nlohmann::json result{{"format", "shardscope.measure"},
                                {"version", 1},
                                {"rank", rank},
                                {"world_size", world},
                                {"threads", o.threads},
                                {"reps", o.reps},
                                {"device", deviceJson},
                                {"launch_ns", launchNs},
                                {"samples", rank == 0 ? samples : nlohmann::json::array()}};
    std::string path = o.out;
    if (const auto at = path.find("{rank}"); at != std::string::npos)
        path.replace(at, 6, std::to_string(rank));
    if (Status st = writeFileAtomically(path, result.dump(1) + "\n"); !st)
        throw std::runtime_error(st.error());
    if (groups.world) groups.world->barrier()->wait();
    return 0;
}

}  // namespace shardscope::exec
