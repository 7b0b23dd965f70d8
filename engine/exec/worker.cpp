// SPDX-License-Identifier: Apache-2.0
// One rank of `shardscope run` (or of torchrun/SLURM/mpirun launching shardscope-engine
// directly): loads the model and plan, joins the process groups from the torchrun
// environment, trains for warm-up plus measured steps with the FSDP runtime while
// recording every op and the CPU allocator's bytes, and writes its results as JSON.
#include "engine/exec/worker.h"

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "engine/exec/cuda_support.h"
#include "engine/exec/fsdp_runtime.h"
#include "engine/exec/llama.h"
#include "engine/exec/proxy_model.h"
#include "plans/core/atomic_write.h"
#include "plans/model/hf_config.h"
#include "plans/model/model_json.h"
#include "plans/plan/plan_json.h"
#include "profiler/record/device_activity.h"
#if defined(SHARDSCOPE_HAVE_CUPTI)
#include "profiler/record/cupti_recorder.h"
#endif

namespace shardscope::exec {

int64_t flagInt(const std::string& flag, const std::string& v, int64_t minimum) {
    try {
        size_t used = 0;
        const long long x = std::stoll(v, &used);
        if (used == v.size() && x >= minimum) return x;
    } catch (const std::exception&) {
    }
    throw std::runtime_error(flag + ": expected an integer >= " + std::to_string(minimum) +
                             ", got \"" + v + "\"");
}

namespace {

// Counts the bytes the CPU allocator hands out: the engine's "allocated" memory on CPU
// (there is no caching allocator on CPU, so nothing is reserved beyond it). Each block
// carries a 64-byte header (keeping c10's 64-byte alignment) with its size and the inner
// allocation, so counting takes no lock; the data pointer is the context, as raw_allocate
// requires. The timeline keeps a sample whenever the total has moved 64 KiB since the last
// one, plus the exact peak with its time: what a trace needs, at a fraction of the cost.
class CountingAllocator final : public c10::Allocator {
public:
    static constexpr size_t kHeader = 64;
    static constexpr int64_t kSampleBytes = 64 * 1024;
    explicit CountingAllocator(c10::Allocator* inner) : m_inner(inner) { s_self = this; }
    c10::DataPtr allocate(size_t n) override {
        if (n == 0) return m_inner->allocate(0);
        c10::DataPtr inner = m_inner->allocate(n + kHeader);
        char* base = static_cast<char*>(inner.get());
        if (!base) return inner;
        auto* h = reinterpret_cast<Header*>(base);
        h->deleter = inner.get_deleter();
        h->bytes = static_cast<int64_t>(n);
        h->ctx = inner.release_context();  // freed by release() through the header
        void* data = base + kHeader;
        m_allocations.fetch_add(1, std::memory_order_relaxed);
        add(static_cast<int64_t>(n));
        return {data, data, &CountingAllocator::release, c10::Device(c10::kCPU)};
    }
    c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::release; }
    void copy_data(void* dest, const void* src, size_t count) const override {
        default_copy_data(dest, src, count);
    }
    void resetPeak() { m_peak = m_cur.load(); }
    int64_t peak() const { return m_peak; }
    int64_t current() const { return m_cur; }
    int64_t allocations() const { return m_allocations.load(); }
    void startTimeline() {
        std::lock_guard lock(m_mutex);
        m_timeline.clear();
        const int64_t now = m_cur.load();
        m_timeline.push_back({nowNs(), now});
        m_lastSample = now;
        m_windowPeak = now;
        m_windowPeakAt = nowNs();
        m_recording = true;
    }
    std::vector<std::pair<int64_t, int64_t>> stopTimeline() {
        std::lock_guard lock(m_mutex);
        m_recording = false;
        m_timeline.push_back({m_windowPeakAt.load(), m_windowPeak.load()});
        std::stable_sort(m_timeline.begin(), m_timeline.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
        return std::move(m_timeline);
    }

private:
    struct Header {
        c10::DeleterFnPtr deleter;
        void* ctx;
        int64_t bytes;
    };
    static_assert(sizeof(Header) <= kHeader);
    static void release(void* data) {
        if (!data) return;
        auto* h = reinterpret_cast<Header*>(static_cast<char*>(data) - kHeader);
        const Header copy = *h;
        s_self->add(-copy.bytes);
        if (copy.deleter) copy.deleter(copy.ctx);
    }
    void add(int64_t n) {
        const int64_t now = m_cur.fetch_add(n) + n;
        int64_t p = m_peak.load();
        while (now > p && !m_peak.compare_exchange_weak(p, now)) {
        }
        if (!m_recording) return;
        int64_t wp = m_windowPeak.load();
        while (now > wp && !m_windowPeak.compare_exchange_weak(wp, now)) {
        }
        if (now > wp) m_windowPeakAt = nowNs();
        if (std::llabs(now - m_lastSample.load()) < kSampleBytes) return;
        std::lock_guard lock(m_mutex);
        if (!m_recording) return;
        m_timeline.push_back({nowNs(), now});
        m_lastSample = now;
    }
    static inline CountingAllocator* s_self = nullptr;
    c10::Allocator* m_inner;
    std::atomic<int64_t> m_cur{0}, m_peak{0}, m_lastSample{0}, m_windowPeak{0}, m_windowPeakAt{0};
    std::atomic<bool> m_recording{false};
    std::atomic<int64_t> m_allocations{0};
    std::mutex m_mutex;
    std::vector<std::pair<int64_t, int64_t>> m_timeline;
};

// What this rank is doing, for the message it prints when the launcher stops it (read in
// a signal handler: a fixed buffer, written whole before the length is published).
char g_doing[256] = "start-up";
volatile sig_atomic_t g_doingLen = 8;
int g_rank = 0;

void onStop(int sig) {
    char msg[400];
    int n = std::snprintf(msg, sizeof msg,
                          "shardscope-engine rank %d: stopped by signal %d while in ", g_rank, sig);
    if (n < 0) n = 0;
    const int doing = g_doingLen;
    const int len = std::min(doing, static_cast<int>(sizeof msg) - n - 2);
    std::memcpy(msg + n, g_doing, static_cast<size_t>(len));
    n += len;
    msg[n++] = '\n';
    (void)!::write(2, msg, static_cast<size_t>(n));
    ::_exit(128 + sig);
}

// SHARDSCOPE_FAULT="RANK:LABEL:MODE" makes rank RANK exit (MODE exit), abort (crash) or hang
// (hang) when it reaches the op LABEL ("model.layers.1 all-gather"): the fault tests use it.
struct Fault {
    int64_t rank = -1;
    std::string label, mode;
};
Fault parseFault() {
    const char* v = std::getenv("SHARDSCOPE_FAULT");
    Fault f;
    if (!v) return f;
    const std::string s = v;
    const size_t a = s.find(':'), b = s.rfind(':');
    if (a == std::string::npos || b == a)
        throw std::runtime_error("SHARDSCOPE_FAULT: expected RANK:LABEL:MODE, got \"" + s + "\"");
    f.rank = std::atoll(s.substr(0, a).c_str());
    f.label = s.substr(a + 1, b - a - 1);
    f.mode = s.substr(b + 1);
    if (f.mode != "exit" && f.mode != "crash" && f.mode != "hang")
        throw std::runtime_error("SHARDSCOPE_FAULT: MODE must be exit, crash or hang");
    return f;
}

CountingAllocator* installCountingAllocator(bool install) {
    static CountingAllocator a(c10::GetDefaultCPUAllocator());
    if (install) c10::SetCPUAllocator(&a, /*priority=*/100);
    return &a;  // not installed: its counters stay at zero
}

struct Options {
    std::string model, plan, out, dumpParams, dumpInitial;
    int64_t steps = 3, warmup = 1, batch = 0, seq = 0, microBatches = 0, timeoutS = 60, threads = 0,
            reference = 0;  // reference: world size of the unsharded run
    uint64_t seed = 1234;
    bool record = true;          // --no-record: neither ops nor allocations are recorded
    std::string device = "cpu";  // cpu or cuda (cuda:LOCAL_RANK)
    bool deviceTrace = true;     // --no-device-trace: no CUPTI recording on CUDA
    bool blocking = false;       // --collectives blocking: as FSDP2 on a CPU device
};

Options parse(const std::vector<std::string>& a) {
    Options o;
    for (size_t i = 0; i < a.size(); ++i) {
        const std::string& f = a[i];
        if (f == "--no-record") {  // the flags without a value
            o.record = false;
            continue;
        }
        if (f == "--no-device-trace") {
            o.deviceTrace = false;
            continue;
        }
        if (i + 1 >= a.size()) throw std::runtime_error(f + ": missing value");
        const std::string& v = a[++i];
        if (f == "--model")
            o.model = v;
        else if (f == "--plan")
            o.plan = v;
        else if (f == "--out")
            o.out = v;
        else if (f == "--dump-params")
            o.dumpParams = v;
        else if (f == "--dump-initial")
            o.dumpInitial = v;
        else if (f == "--steps")
            o.steps = flagInt(f, v, 1);
        else if (f == "--warmup")
            o.warmup = flagInt(f, v, 0);
        else if (f == "--batch")
            o.batch = flagInt(f, v, 1);
        else if (f == "--seq")
            o.seq = flagInt(f, v, 2);
        else if (f == "--micro-batches")
            o.microBatches = flagInt(f, v, 1);
        else if (f == "--timeout-s")
            o.timeoutS = flagInt(f, v, 1);
        else if (f == "--threads")
            o.threads = flagInt(f, v, 1);
        else if (f == "--seed")
            o.seed = static_cast<uint64_t>(flagInt(f, v, 0));
        else if (f == "--reference")
            o.reference = flagInt(f, v, 1);
        else if (f == "--device") {
            if (v != "cpu" && v != "cuda")
                throw std::runtime_error("--device: expected cpu or cuda, got \"" + v + "\"");
            o.device = v;
        } else if (f == "--collectives") {
            if (v != "overlapped" && v != "blocking")
                throw std::runtime_error("--collectives: expected overlapped or blocking, got \"" +
                                         v + "\"");
            o.blocking = v == "blocking";
        } else
            throw std::runtime_error("unknown option " + f);
    }
    if (o.model.empty() || o.plan.empty())
        throw std::runtime_error("--model and --plan are required");
    return o;
}

nlohmann::json readJson(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error(path + ": cannot open");
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded()) throw std::runtime_error(path + ": invalid JSON");
    return j;
}

// Compares the recorded ops of one step with the step program, op by op.
nlohmann::json compareOrder(const StepProgram& prog, const ResolvedPlan& r,
                            const std::vector<RecordedOp>& ops, int32_t step,
                            std::vector<int64_t>& opIds) {
    std::vector<size_t> idx;
    for (size_t i = 0; i < ops.size(); ++i)
        if (ops[i].step == step) idx.push_back(i);
    const size_t n = std::min(idx.size(), prog.ops.size());
    for (size_t k = 0; k < n; ++k) {
        const RecordedOp& a = ops[idx[k]];
        const Op& b = prog.ops[k];
        if (a.kind != b.kind || a.phase != b.phase || a.unit != b.unit.value ||
            a.microBatch != b.microBatch) {
            Op ra;
            ra.kind = a.kind;
            ra.unit = UnitId(a.unit);
            return {{"matches", false},
                    {"step", step},
                    {"first_mismatch", k},
                    {"recorded", opLabel(r, ra) + " (" + phaseName(a.phase) + ", mb" +
                                     std::to_string(a.microBatch) + ")"},
                    {"program", opLabel(r, b) + " (" + phaseName(b.phase) + ", mb" +
                                    std::to_string(b.microBatch) + ")"}};
        }
        opIds[idx[k]] = static_cast<int64_t>(k);
    }
    if (idx.size() != prog.ops.size())
        return {{"matches", false},
                {"step", step},
                {"first_mismatch", n},
                {"recorded", idx.size() > n ? "an extra op" : "end of step"},
                {"program", prog.ops.size() > n ? opLabel(r, prog.ops[n]) : "end of step"}};
    return {{"matches", true}, {"step", step}, {"ops", prog.ops.size()}};
}

}  // namespace

namespace {
// Each label the recorder enters is what a stop signal reports, and where an injected fault
// (SHARDSCOPE_FAULT) fires on its rank.
void installFaultHook(Recorder& rec, int64_t rank) {
    const Fault fault = parseFault();
    rec.setHook([fault, rank](const std::string& what) {
        const size_t n = std::min(what.size(), sizeof g_doing - 1);
        std::memcpy(g_doing, what.data(), n);
        g_doingLen = static_cast<sig_atomic_t>(n);
        if (rank != fault.rank || what != fault.label) return;
        std::fprintf(stderr, "shardscope-engine rank %lld: injected fault (%s) at %s\n",
                     static_cast<long long>(rank), fault.mode.c_str(), what.c_str());
        if (fault.mode == "exit") std::_Exit(3);
        if (fault.mode == "crash") std::abort();
        for (;;)
            std::this_thread::sleep_for(std::chrono::seconds(1));
    });
}

// What the training loop measured on this rank.
struct Measured {
    std::vector<double> losses;
    std::vector<int64_t> stepNs;
    int64_t measuredStart = 0, lastStepStart = 0, lastStepT0 = 0;
    std::vector<std::pair<int64_t, int64_t>> stepSpans;  // measured steps: [t0, t1]
    std::vector<std::pair<int64_t, int64_t>> timeline;
    // On CUDA: the caching allocator's figures, and the CUPTI trace of the measured steps.
    int64_t cudaPeak = 0, cudaPeakReserved = 0, cudaLastPeak = 0;
    std::optional<record::DeviceActivity> deviceActivityOps;
    std::string deviceTraceNote;
    int64_t allocationsAtStart = 0;
};

// Warm-up and measured steps over synthetic tokens with a fixed seed: the same global batch
// on every rank, each rank taking its slice, so the unsharded reference can replay all of
// them.
struct TrainingLoop {
    const Options& o;
    const Plan& plan;
    Groups& groups;
    FsdpRuntime& rt;
    Recorder& rec;
    CountingAllocator* mem;
    LlamaModel* llama;
    ProxyModel* proxy;
    c10::Device device;
    bool cuda;
    int64_t world, vocab;

    Measured run() {
        Measured x;
        const int64_t total = o.warmup + o.steps, m = plan.microBatches;
        auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
        const at::Tensor data =
            at::randint(0, vocab, {total, world, m, plan.microBatchSize, plan.seqLen}, gen,
                        at::TensorOptions(at::kLong));
#if defined(SHARDSCOPE_HAVE_CUPTI)
        std::unique_ptr<record::CuptiRecorder> cupti;
#endif
        try {
            for (int64_t step = 0; step < total; ++step) {
                if (step == o.warmup) {
                    if (!o.reference) groups.world->barrier()->wait();

                    mem->resetPeak();
                    if (cuda) {
                        synchronizeCuda();
                        resetCudaPeaks();
                    }
#if defined(SHARDSCOPE_HAVE_CUPTI)
                    if (cuda && o.record && o.deviceTrace) {
                        cupti = std::make_unique<record::CuptiRecorder>(&nowNs);
                        if (Status st = cupti->start(); st) {
                            rec.setLaunchLabels(&record::CuptiRecorder::pushOp,
                                                &record::CuptiRecorder::popOp);
                        } else {
                            x.deviceTraceNote = st.error();
                            std::fprintf(stderr,
                                         "shardscope-engine rank %lld: no device trace: %s\n",
                                         static_cast<long long>(groups.rank), st.error().c_str());
                            cupti.reset();
                        }
                    }
#endif
                    x.measuredStart = nowNs();
                    x.allocationsAtStart = mem->allocations();
                    mem->startTimeline();  // every measured step, for the trace's counter
                }
                if (step == total - 1) {
                    x.lastStepStart = mem->current();
                    if (cuda) {  // the peaks so far, then the last step's own
                        const CudaMemory cm = cudaMemory();
                        x.lastStepStart = cm.allocated;
                        x.cudaPeak = std::max(x.cudaPeak, cm.peakAllocated);
                        x.cudaPeakReserved = std::max(x.cudaPeakReserved, cm.peakReserved);
                        resetCudaPeaks();
                    }
                    x.lastStepT0 = nowNs();
                }
                rec.setStep(static_cast<int32_t>(step));
                const int64_t t0 = nowNs();
                at::Tensor lossSum;
                const int64_t ranksHere = o.reference ? world : 1;
                for (int64_t rk = 0; rk < ranksHere; ++rk)
                    for (int64_t mb = 0; mb < m; ++mb) {
                        const int64_t dataRank = o.reference ? rk : groups.rank;
                        rt.beginMicroBatch(static_cast<int32_t>(mb),
                                           mb + 1 == m || plan.syncEveryMicroBatch, mb + 1 == m);
                        const at::Tensor tokens = data[step][dataRank][mb].to(device);
                        const at::Tensor loss = llama ? llama->loss(tokens) : proxy->loss(tokens);
                        // Summed on the device: reading it each micro-batch would stall a GPU.
                        const at::Tensor l64 = loss.detach().to(at::kDouble);
                        lossSum = lossSum.defined() ? lossSum + l64 : l64;
                        rt.backward(loss / static_cast<double>(m * ranksHere));
                    }
                rt.optimizerStep();
                if (cuda) synchronizeCuda();  // the step ends when the GPU has finished it
                const int64_t t1 = nowNs();
                if (step >= o.warmup) {
                    x.stepNs.push_back(t1 - t0);
                    x.stepSpans.push_back({t0, t1});
                }
                if (step == total - 1) {
                    x.timeline = mem->stopTimeline();
                    if (cuda) {
                        const CudaMemory cm = cudaMemory();
                        x.cudaLastPeak = cm.peakAllocated;
                        x.cudaPeak = std::max(x.cudaPeak, cm.peakAllocated);
                        x.cudaPeakReserved = std::max(x.cudaPeakReserved, cm.peakReserved);
                    }
#if defined(SHARDSCOPE_HAVE_CUPTI)
                    if (cupti) {
                        auto activity = cupti->stop();
                        rec.setLaunchLabels(nullptr, nullptr);
                        if (activity) {
                            x.deviceActivityOps = std::move(*activity);
                        } else {
                            x.deviceTraceNote = activity.error();
                        }
                        cupti.reset();
                    }
#endif
                }
                // This rank's loss. The ranks' mean is taken once after the last step: an
                // all-reduce here would line the ranks up at every step boundary, which a training
                // loop does not (PyTorch's ranks enter the next step's first all-gather as far
                // apart as their optimizer steps left them, and that wait is part of its exposed
                // time).
                x.losses.push_back(
                    (lossSum.cpu() / static_cast<double>(m * ranksHere)).item<double>());
                if (groups.rank == 0)
                    std::fprintf(
                        stderr,
                        "[shardscope-engine] step %lld/%lld loss %.6f on rank 0 (%.1f ms)\n",
                        static_cast<long long>(step + 1), static_cast<long long>(total),
                        x.losses.back(), static_cast<double>(t1 - t0) * 1e-6);
            }
            if (!o.reference && !x.losses.empty()) {
                at::Tensor l = at::tensor(x.losses, at::TensorOptions(at::kDouble));
                std::vector<at::Tensor> t{l};
                groups.world->allreduce(t)->wait();
                l.div_(static_cast<double>(world));
                const double* v = l.const_data_ptr<double>();
                x.losses.assign(v, v + l.numel());
            }
        } catch (const c10::Error& e) {
            throw std::runtime_error(
                "rank " + std::to_string(groups.rank) + " failed in " +
                (rec.current().empty() ? std::string("start-up") : rec.current()) + ": " +
                e.what_without_backtrace());
        } catch (const std::exception& e) {
            throw std::runtime_error(
                "rank " + std::to_string(groups.rank) + " failed in " +
                (rec.current().empty() ? std::string("start-up") : rec.current()) + ": " +
                e.what());
        }
        return x;
    }
};

// The rank's result document (format shardscope.rank_result): its losses and step times,
// memory figures, the recorded ops joined with the step program and their order.
nlohmann::json rankResult(const Options& o, const ResolvedPlan& r, const Plan& plan,
                          const Groups& groups, const FsdpRuntime& rt, const Recorder& rec,
                          CountingAllocator* mem, Measured& x, int64_t world, bool asLlama,
                          bool cuda, const c10::Device& device) {
    const int64_t total = o.warmup + o.steps, m = plan.microBatches;
    // Op order of every step against the step program.
    StepOptions so = stepOptionsFor(plan, world);
    so.recomputeEarlyStop = false;  // its checkpoint is reentrant: all of forward again
    const StepProgram prog = buildStepProgram(r, so);
    const auto ops = rec.ops();
    std::vector<int64_t> opIds(ops.size(), -1);
    nlohmann::json order = nlohmann::json::array();
    bool allMatch = true;
    if (!o.reference && o.record)
        for (int64_t s = 0; s < total; ++s) {
            order.push_back(compareOrder(prog, r, ops, static_cast<int32_t>(s), opIds));
            allMatch = allMatch && order.back()["matches"].get<bool>();
        }

    nlohmann::json j;
    j["format"] = "shardscope.rank_result";
    j["version"] = 1;
    j["rank"] = groups.rank;
    j["world_size"] = world;
    j["shard_rank"] = groups.shardRank;
    j["replicate_rank"] = groups.replicateRank;
    j["plan"] = r.plan.name;
    j["model_kind"] = asLlama ? "llama" : "proxy";
    j["micro_batch_size"] = plan.microBatchSize;
    j["seq_len"] = plan.seqLen;
    j["micro_batches"] = m;
    j["warmup_steps"] = o.warmup;
    j["losses"] = x.losses;
    j["step_time_ns"] = x.stepNs;
    j["device"] = cuda ? "cuda:" + std::to_string(device.index()) : std::string("cpu");
    // On CUDA the caching allocator's peaks (torch.cuda.max_memory_allocated/_reserved);
    // on CPU the engine's allocator hook (no cache: reserved is what is allocated).
    j["peak_allocated_bytes"] = cuda ? x.cudaPeak : mem->peak();
    // What the CPU recorder handled per measured step (scripts/bench_recorder_overhead.py
    // multiplies these by `shardscope-engine recorder-cost`).
    const double measuredSteps = static_cast<double>(std::max<int64_t>(1, o.steps));
    j["allocations_per_step"] =
        static_cast<double>(mem->allocations() - x.allocationsAtStart) / measuredSteps;
    if (cuda) {
        j["peak_reserved_bytes"] = x.cudaPeakReserved;
        j["host_peak_allocated_bytes"] = mem->peak();
    }
    j["sharded_param_bytes"] = rt.shardedBytes();
    j["measured_start_ns"] = x.measuredStart;
    j["recorded"] = o.record;
    j["op_order_matches_program"] = allMatch;
    j["op_order"] = order;
    j["units"] = nlohmann::json::array();
    for (const auto& u : r.units)
        j["units"].push_back(u.displayName());
    nlohmann::json jo = nlohmann::json::array();
    std::vector<int64_t> emitted(ops.size(), -1);  // recorder index -> index in "ops"
    for (size_t i = 0; i < ops.size(); ++i) {
        const auto& op = ops[i];
        if (op.step < o.warmup) continue;
        emitted[i] = static_cast<int64_t>(jo.size());
        jo.push_back({{"op_id", opIds[i]},
                      {"step", op.step},
                      {"kind", opKindName(op.kind)},
                      {"phase", phaseName(op.phase)},
                      {"stream", streamName(op.stream)},
                      {"unit", op.unit},
                      {"micro_batch", op.microBatch},
                      {"start_ns", op.startNs},
                      {"end_ns", op.endNs},
                      {"bytes", opIds[i] >= 0 ? prog.ops[static_cast<size_t>(opIds[i])].commBytes
                                              : int64_t{0}}});
    }
    j["recorded_ops_per_step"] = static_cast<double>(jo.size()) / measuredSteps;
    j["ops"] = std::move(jo);
    // GPU work from CUPTI, each op's "fsdp_op" pointing into "ops" (the op that launched it).
    if (x.deviceActivityOps) {
        for (auto& dop : x.deviceActivityOps->ops)
            if (dop.external >= 0)
                dop.external = static_cast<size_t>(dop.external) < emitted.size()
                                   ? emitted[static_cast<size_t>(dop.external)]
                                   : record::kNoExternalId;
        j["device_activity"] = record::toJson(*x.deviceActivityOps);
    }
    if (!x.deviceTraceNote.empty()) j["device_trace_note"] = x.deviceTraceNote;
    j["collectives"] = o.blocking ? "blocking" : "overlapped";
    nlohmann::json tl = nlohmann::json::array();
    for (const auto& [t, b] : x.timeline)
        tl.push_back({t, b});
    j["memory_timeline"] = std::move(tl);
    // The last step's working memory: what it allocated above what it started with.
    int64_t lastPeak = cuda ? x.cudaLastPeak : x.lastStepStart;
    if (!cuda)
        for (const auto& [t, b] : x.timeline)
            if (t >= x.lastStepT0) lastPeak = std::max(lastPeak, b);
    nlohmann::json spans = nlohmann::json::array();
    for (const auto& [a, b] : x.stepSpans)
        spans.push_back({a, b});
    j["step_spans_ns"] = std::move(spans);
    j["last_step_start_allocated_bytes"] = x.lastStepStart;
    j["last_step_peak_allocated_bytes"] = lastPeak;
    return j;
}
}  // namespace

int runWorker(const std::vector<std::string>& argv) {
    const Options o = parse(argv);
    CountingAllocator* mem = installCountingAllocator(o.record);
    auto graph = loadModelFile(o.model);
    if (!graph) throw std::runtime_error(graph.error());
    auto plan = loadPlanFile(o.plan);
    if (!plan) throw std::runtime_error(plan.error());
    if (o.batch) plan->microBatchSize = o.batch;
    if (o.seq) {
        plan->seqLen = o.seq;
        plan->seqLenDefaulted = false;
    }
    if (o.microBatches) plan->microBatches = o.microBatches;
    const int64_t envWorld = o.reference                 ? o.reference
                             : std::getenv("WORLD_SIZE") ? std::atoll(std::getenv("WORLD_SIZE"))
                                                         : 1;
    if (plan->meshShape.empty()) plan->meshShape = {envWorld};
    const ResolvedPlan r = resolvePlan(*graph, *plan, nullptr, o.plan);
    if (r.hasErrors()) {
        std::string msg = "the plan has errors:";
        for (const auto& p : r.problems)
            msg += "\n  " + p.toString();
        throw std::runtime_error(msg);
    }
    // Llama-style Hugging Face configs are built layer by layer; any other model (a model
    // JSON, other families) runs as a proxy sized from its graph.
    const nlohmann::json modelJson = readJson(o.model);
    const std::string modelType = modelJson.is_object() ? modelJson.value("model_type", "") : "";
    const bool asLlama = looksLikeHfConfig(modelJson) &&
                         (modelType == "llama" || modelType == "mistral" || modelType == "qwen2");
    const LlamaConfig cfg = asLlama ? llamaConfigFromHf(modelJson, o.model) : LlamaConfig{};
    const int64_t vocab = asLlama ? cfg.vocab : 1000;

    // --device cuda: this rank's GPU is cuda:LOCAL_RANK, as torchrun assigns them.
    c10::Device device = c10::kCPU;
    const bool cuda = o.device == "cuda";
    if (cuda) {
        const char* lr = std::getenv("LOCAL_RANK");
        const int local = lr ? std::atoi(lr) : 0;
        useCudaDevice(local);
        device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local));
    }
    const auto timeout = std::chrono::milliseconds(o.timeoutS * 1000);
    Groups groups = o.reference ? singleProcessGroups() : makeGroups(r, timeout, device);
    const int64_t world = o.reference ? o.reference : groups.worldSize;
    at::set_num_threads(static_cast<int>(o.threads ? o.threads : 1));

    Recorder rec;
    rec.setEnabled(o.record);
    g_rank = static_cast<int>(groups.rank);
    installFaultHook(rec, groups.rank);
    std::signal(SIGTERM, onStop);
    std::signal(SIGINT, onStop);
    RuntimeOptions ro;
    ro.fsdp = !o.reference;
    ro.seed = o.seed;
    ro.device = device;
    ro.blockingCollectives = o.blocking;
    FsdpRuntime rt(r, &groups, &rec, ro);
    std::unique_ptr<LlamaModel> llama;
    std::unique_ptr<ProxyModel> proxy;
    if (asLlama)
        llama = std::make_unique<LlamaModel>(cfg, *graph, rt);
    else
        proxy = std::make_unique<ProxyModel>(*graph, rt, o.seed);

    // Full parameters as JSON {name: [values...]} (all-gathered; rank 0 writes).
    auto dump = [&](const std::string& path) {
        auto full = rt.fullParameters();
        if (groups.rank != 0) return;
        nlohmann::json pj = nlohmann::json::object();
        for (size_t i = 0; i < full.size(); ++i) {
            const at::Tensor t = full[i].reshape({-1}).to(at::kCPU).to(at::kDouble).contiguous();
            pj[graph->params()[i].name] =
                std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
        }
        if (Status st = writeFileAtomically(path, pj.dump() + "\n"); !st)
            throw std::runtime_error(st.error());
    };
    if (!o.dumpInitial.empty()) dump(o.dumpInitial);

    Measured x = TrainingLoop{o,           *plan,       groups, rt,   rec,   mem,
                              llama.get(), proxy.get(), device, cuda, world, vocab}
                     .run();
    nlohmann::json j =
        rankResult(o, r, *plan, groups, rt, rec, mem, x, world, asLlama, cuda, device);
    if (!o.dumpParams.empty()) dump(o.dumpParams);
    if (!o.reference) groups.world->barrier()->wait();
    const std::string text = j.dump() + "\n";
    std::string outPath = o.out;
    if (const size_t at = outPath.find("{rank}"); at != std::string::npos)
        outPath.replace(at, 6, std::to_string(groups.rank));
    if (outPath.empty() || outPath == "-") {
        std::fwrite(text.data(), 1, text.size(), stdout);
    } else if (Status st = writeFileAtomically(outPath, text); !st) {
        throw std::runtime_error(st.error());
    }
    return 0;
}

int runRecorderCost() {
    // Sizes cycled through: small tensors, activations, gathered parameters.
    const size_t sizes[] = {256, 4096, 65536, 1 << 20};
    constexpr int kPairs = 400000;
    c10::Allocator* plain = c10::GetDefaultCPUAllocator();
    auto timeAllocs = [&](c10::Allocator* a) {
        const int64_t t0 = nowNs();
        for (int i = 0; i < kPairs; ++i) {
            c10::DataPtr p = a->allocate(sizes[i % 4]);
            static_cast<char*>(p.get())[0] = 1;  // touch it, as a tensor would
        }
        return static_cast<double>(nowNs() - t0) / kPairs;
    };
    CountingAllocator counting(plain);
    counting.startTimeline();  // as during measured steps: samples and the peak
    timeAllocs(plain);         // warm the allocator's caches for both
    const double plainNs = timeAllocs(plain);
    const double hookedNs = timeAllocs(&counting);
    (void)counting.stopTimeline();
    Recorder rec;
    constexpr int kOps = 200000;
    const int64_t t0 = nowNs();
    for (int i = 0; i < kOps; ++i)
        rec.end(rec.begin(OpKind::Forward, Phase::Forward, Stream::Compute, 0, 0));
    const double opNs = static_cast<double>(nowNs() - t0) / kOps;
    nlohmann::json j{{"allocation_plain_ns", plainNs},
                     {"allocation_recorded_ns", hookedNs},
                     {"allocation_overhead_ns", std::max(0.0, hookedNs - plainNs)},
                     {"op_ns", opNs}};
    const std::string text = j.dump(2) + "\n";
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
}

}  // namespace shardscope::exec
