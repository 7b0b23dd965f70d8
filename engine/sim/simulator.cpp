// SPDX-License-Identifier: Apache-2.0
#include "engine/sim/simulator.h"

#include <algorithm>
#include <array>

#include "plans/core/intervals.h"

#include "engine/sim/allocator_model.h"
#include "engine/sim/cost_model.h"

namespace shardscope {

namespace {

bool isComputeKind(OpKind k) {
    return k == OpKind::Forward || k == OpKind::Backward || k == OpKind::Recompute;
}

// Start and end of every op; returns the step's end (the last op's end).
struct Times {
    std::vector<int64_t>&start, &end;
};
// `hostFirst`: CPU time an op spends before its kernel is launched (FSDP2's reduce-scatter
// copy-in building torch._chunk_cat's block table); empty when none is modelled.
int64_t schedule(const StepProgram& p, const ClusterSpec& c, const std::vector<int64_t>& dur,
                 const std::vector<int64_t>& launch, const std::vector<int64_t>& hostFirst,
                 Times r) {
    const size_t n = p.ops.size();
    r.start.resize(n);  // every entry is written below
    r.end.resize(n);
    std::array<int64_t, static_cast<size_t>(Stream::Count)> streamFree{};
    std::array<int64_t, 3> groupFree{};  // one NCCL communicator per process group
    int64_t cpu = 0;
    const auto issue = static_cast<int64_t>(c.sim.cpuIssueNs);
    // On a CPU device the "streams" other than the collectives' are the CPU thread itself:
    // it cannot run ahead of its own compute and copies (the engine's Gloo path runs them
    // synchronously; only the collectives run on Gloo's threads).
    const bool cpuDevice = c.device.isHost();
    int64_t last = 0;
    for (size_t i = 0; i < n; ++i) {
        const Op& op = p.ops[i];
        int64_t ready = 0;
        for (OpId w : op.waits)
            ready = std::max(ready, r.end[w.index()]);
        if (op.cpuBlocks) cpu = std::max(cpu, ready);  // the CPU waits on the event
        cpu += issue;
        if (!hostFirst.empty()) cpu += hostFirst[i];
        int64_t s = std::max({cpu, ready, streamFree[static_cast<size_t>(op.stream)]});
        const bool coll = isCollective(op.kind);
        const auto pg = static_cast<size_t>(op.processGroup);
        // FSDP2 over a group of one reduces by a device-to-device copy on its stream (no
        // NCCL kernel). On an H200 the compute stream's next kernel started as that copy
        // ended, though nothing the host issued made it wait (0.41 of 0.41 ms, 1.62 of 1.64,
        // 2.01 of 2.03): a bulk copy holds the device until its blocks drain
        // (scripts/gpu_stream_overlap.py: a cast or a GEMM queued behind an 872 MB copy on
        // another stream starts as it ends): it runs between the compute stream's kernels,
        // not beside them, and pushes the compute stream's work back by its time. So does an
        // all-gather's copy-in on its own stream: FSDP1's casts into the low-precision shard
        // ran beside 0-0.27 ms of other work in 0.30-0.80 ms on an H200 (a Llama-8B run over
        // one GPU), and the simulated forward had overlapped them whole. Such a copy starts
        // between two kernels, not after the compute op in flight (a whole layer's forward
        // here), so it does not hold back the all-gather that follows it.
        if (coll) s = std::max(s, groupFree[pg]);
        const bool holdsDevice = !cpuDevice && op.memBytes > 0 &&
                                 ((coll && op.groupSize <= 1) || op.kind == OpKind::CopyIn);
        r.start[i] = s;
        r.end[i] = s + dur[i];
        if (!launch.empty() && launch[i] > 0) {
            if (cpuDevice) {
                r.end[i] += launch[i];  // the host dispatches each kernel before running it
            } else {
                // The CPU launches the op's kernels one after another: the device cannot
                // finish them before the last is launched, and the CPU issues nothing else
                // meanwhile. A step whose launches outlast its kernels is CPU-bound.
                cpu += launch[i];
                r.end[i] = std::max(r.end[i], cpu);
            }
        }
        streamFree[static_cast<size_t>(op.stream)] = r.end[i];
        if (cpuDevice && !coll) cpu = r.end[i];
        if (coll) groupFree[pg] = r.end[i];
        if (holdsDevice) {
            int64_t& compute = streamFree[static_cast<size_t>(Stream::Compute)];
            compute = compute > s ? compute + dur[i] : std::max(compute, r.end[i]);
        }
        last = std::max(last, r.end[i]);
    }
    return last;
}

// A stretch of time with the SM and HBM shares the collectives running in it hold.
struct Occupied {
    int64_t start = 0, end = 0;
    double sm = 0, hbm = 0;
};

// A simulation's working storage, kept per thread: a search simulates thousands of steps in
// a row, and reusing it spares their allocations.
struct Scratch {
    std::vector<int64_t> dur, baseDur, mixNs, launch, hostFirst, handle, start, end;
    // What each collective holds while it runs (SM and HBM shares) and the fraction of each
    // compute op's time in memory-bound kernels, for the occupancy pass.
    std::vector<double> smShare, hbmShare, mixMemory;
    std::vector<Occupied> occupied;
    std::vector<std::pair<int64_t, int32_t>> edges, edgesMerged;
    std::vector<int32_t> computeOps;
    std::array<std::vector<int32_t>, static_cast<size_t>(Stream::Count)> collByStream;
    std::vector<Interval> runs, merged, compute, commU, computeU;
    std::vector<char> live;
};

// Compute beside running collectives slows by what they hold: a compute-bound kernel loses
// the SMs their CTAs occupy, a memory-bound one the HBM bandwidth their copies use. Over each
// stretch of time the collectives' shares add up (at most 0.9 of either); a compute op's time
// in it grows by share / (1 - share), weighted by the op's split between memory-bound and
// compute-bound kernels. Measured on the schedule without the slowdown (one pass).
template <typename MemoryFraction>
void occupancyStretch(
    const Times& t,
    const std::array<std::vector<int32_t>, static_cast<size_t>(Stream::Count)>& coll,
    const std::vector<int32_t>& computeOps, const std::vector<double>& smShare,
    const std::vector<double>& hbmShare, MemoryFraction memoryFraction, Scratch& w,
    std::vector<int64_t>& dur) {
    // Each stream runs its collectives one after another, so its starts and ends alternate
    // in time order: one sorted run of edges a stream, merged with the runs before.
    auto& edges = w.edges;
    auto& merged = w.edgesMerged;
    edges.clear();
    for (const auto& run : coll) {
        const auto mid = static_cast<std::ptrdiff_t>(edges.size());
        for (const int32_t k : run) {
            const auto i = static_cast<size_t>(k);
            if ((smShare[i] <= 0 && hbmShare[i] <= 0) || t.end[i] <= t.start[i]) continue;
            edges.push_back({t.start[i], k + 1});   // > 0: starts
            edges.push_back({t.end[i], -(k + 1)});  // < 0: ends
        }
        if (mid > 0 && static_cast<size_t>(mid) < edges.size()) {
            merged.resize(edges.size());
            std::merge(edges.begin(), edges.begin() + mid, edges.begin() + mid, edges.end(),
                       merged.begin());
            edges.swap(merged);
        }
    }
    auto& occ = w.occupied;
    occ.clear();
    if (edges.empty()) return;
    double sm = 0, hbm = 0;
    for (size_t e = 0; e < edges.size(); ++e) {
        const auto i = static_cast<size_t>(std::abs(edges[e].second) - 1);
        const double sign = edges[e].second > 0 ? 1 : -1;
        sm += sign * smShare[i];
        hbm += sign * hbmShare[i];
        const int64_t from = edges[e].first;
        const int64_t to = e + 1 < edges.size() ? edges[e + 1].first : from;
        if (to > from && (sm > 1e-9 || hbm > 1e-9))
            occ.push_back({from, to, std::min(sm, 0.9), std::min(hbm, 0.9)});
    }
    size_t at = 0;
    for (const int32_t k : computeOps) {
        const auto i = static_cast<size_t>(k);
        const int64_t s = t.start[i], e = t.end[i];
        if (dur[i] <= 0 || e <= s) continue;
        while (at < occ.size() && occ[at].end <= s)
            ++at;
        if (at == occ.size() || occ[at].start >= e) continue;
        const double mem = memoryFraction(i);
        double extra = 0;
        for (size_t j = at; j < occ.size() && occ[j].start < e; ++j) {
            const double ov =
                static_cast<double>(std::min(e, occ[j].end) - std::max(s, occ[j].start));
            extra += ov * ((1 - mem) * occ[j].sm / (1 - occ[j].sm) +
                           mem * occ[j].hbm / (1 - occ[j].hbm));
        }
        dur[i] += static_cast<int64_t>(extra);
    }
}

}  // namespace

namespace {
// The union of the collectives' intervals, into w.commU: each stream's come sorted, so the
// streams' runs merge (no sort).
void commUnion(const Times& t, Scratch& w) {
    std::vector<Interval>&v = w.runs, &merged = w.merged;
    v.clear();
    for (const auto& run : w.collByStream) {
        if (run.empty()) continue;
        const auto mid = static_cast<std::ptrdiff_t>(v.size());
        for (int32_t i : run)
            v.push_back({t.start[static_cast<size_t>(i)], t.end[static_cast<size_t>(i)]});
        if (mid > 0) {
            merged.resize(v.size());
            std::merge(v.begin(), v.begin() + mid, v.begin() + mid, v.end(), merged.begin());
            v.swap(merged);
        }
    }
    unionOfSorted(v, w.commU);
}

// The union of the compute ops' intervals, into w.computeU.
void computeUnion(const Times& t, Scratch& w) {
    std::vector<Interval>& compute = w.compute;
    compute.clear();
    for (const int32_t k : w.computeOps)
        compute.push_back({t.start[static_cast<size_t>(k)], t.end[static_cast<size_t>(k)]});
    // One stream's ops come sorted; compute ops on several (none today) would not.
    if (!std::is_sorted(compute.begin(), compute.end())) std::sort(compute.begin(), compute.end());
    unionOfSorted(compute, w.computeU);
}

// The overlap with `u` of each op of a stream, in issue order: starts only grow.
struct Sweep {
    const std::vector<Interval>& u;
    std::array<size_t, static_cast<size_t>(Stream::Count)> at{};
    int64_t operator()(Stream st, int64_t s, int64_t e) {
        size_t& k = at[static_cast<size_t>(st)];
        while (k < u.size() && u[k].second <= s)
            ++k;
        int64_t t = 0;
        for (size_t j = k; j < u.size() && u[j].first < e; ++j)
            t += std::min(e, u[j].second) - std::max(s, u[j].first);
        return t;
    }
};

// What the simulation of one step shares between its passes.
struct Step {
    const StepProgram& p;
    const ClusterSpec& c;
    const SimOptions& o;
    Scratch& w;
    SimResult& r;
    Times t;
    size_t n;
    // With NCCL's model the collectives' SM and HBM shares slow the compute beside them;
    // otherwise a cluster's flat overlap_slowdown does.
    bool occupancy;
    bool launches, chunkCatHost;

    // One walk over the ops prices them and lists what the passes below visit: the compute
    // ops, and the collectives stream by stream. Each stream runs its ops one after
    // another, so their intervals come sorted by start and end, per stream: the collectives'
    // union merges the streams' runs (no sort), and overlaps sweep a cursor per stream.
    // Returns the number of units.
    int32_t priceOps() {
        std::vector<int64_t>& dur = w.dur;
        std::vector<int64_t>& mixNs = w.mixNs;
        std::vector<int64_t>& launch = w.launch;
        std::vector<int64_t>& hostFirst = w.hostFirst;
        std::vector<int32_t>& computeOps = w.computeOps;
        auto& collByStream = w.collByStream;
        std::vector<double>&smShare = w.smShare, &hbmShare = w.hbmShare;
        struct Priced {
            const Op* op = nullptr;
            int64_t ns = 0;
            double sm = 0, hbm = 0;
        };
        std::array<Priced, 64> priced{};  // by a hash of what the price depends on
        auto sameCost = [](const Op& a, const Op& b) {
            return a.kind == b.kind && a.stream == b.stream && a.memBytes == b.memBytes &&
                   a.commBytes == b.commBytes && a.groupSize == b.groupSize &&
                   a.groupNodes == b.groupNodes && a.ranksPerNode == b.ranksPerNode;
        };
        auto slotOf = [](const Op& op) {
            uint64_t h = static_cast<uint64_t>(op.kind) * 0x9E3779B97F4A7C15ull;
            h ^= static_cast<uint64_t>(op.commBytes) + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
            h ^= static_cast<uint64_t>(op.memBytes) + 0x94D049BB133111EBull + (h << 6) + (h >> 2);
            h ^= static_cast<uint64_t>(op.groupSize) * 0xBF58476D1CE4E5B9ull;
            return static_cast<size_t>((h ^ (h >> 29)) & 63);
        };
        int32_t units = 0;
        for (size_t i = 0; i < n; ++i) {
            const Op& op = p.ops[i];
            units = std::max(units, op.unit.value + 1);
            if (isComputeKind(op.kind))
                computeOps.push_back(static_cast<int32_t>(i));
            else if (isCollective(op.kind))
                collByStream[static_cast<size_t>(op.stream)].push_back(static_cast<int32_t>(i));
            // The reduce that takes a copy-in's output gives its size and its chunks: a
            // reduce-scatter's group, or one chunk for an all-reduce (FSDP2 without sharding).
            if (chunkCatHost && (op.kind == OpKind::ReduceScatter || op.kind == OpKind::AllReduce))
                for (OpId wid : op.waits) {
                    const Op& ci = p.ops[wid.index()];
                    if (ci.kind != OpKind::ReduceScatterCopyIn || ci.flatGradCast ||
                        ci.memBytes <= 0)
                        continue;
                    const int64_t chunks =
                        op.kind == OpKind::ReduceScatter ? std::max<int64_t>(op.groupSize, 1) : 1;
                    const int64_t blocks = (op.commBytes / chunks + kChunkCatBytesPerBlock - 1) /
                                           kChunkCatBytesPerBlock;
                    hostFirst[wid.index()] = static_cast<int64_t>(
                        std::llround(c.sim.chunkCatHostNsPerBlock * static_cast<double>(blocks)));
                    r.chunkCatHostNs += hostFirst[wid.index()];
                }
            if (op.mix >= 0 && static_cast<size_t>(op.mix) < mixNs.size()) {
                int64_t& m = mixNs[static_cast<size_t>(op.mix)];
                if (m < 0) m = opDurationNs(c, op, &p);
                dur[i] = m;
                if (launches)
                    launch[i] = static_cast<int64_t>(
                        std::llround(cpuLaunchNsFor(c.sim, op.kind) *
                                     static_cast<double>(p.mixes[op.mix].kernels)));
            } else if (isComputeKind(op.kind)) {
                dur[i] = opDurationNs(c, op, &p);
            } else {
                Priced& slot = priced[slotOf(op)];
                if (!slot.op || !sameCost(*slot.op, op)) {
                    if (occupancy && isCollective(op.kind) && op.groupSize > 1 &&
                        op.commBytes > 0) {
                        // opDurationNs's price, with what the collective holds beside it.
                        const CollectiveCost cc = collectiveTime(
                            c, op.kind, op.commBytes, op.groupSize, op.groupNodes, op.ranksPerNode);
                        slot = {&op, cc.ns, cc.smShare, cc.hbmShare};
                    } else {
                        slot = {&op, opDurationNs(c, op, &p)};
                    }
                }
                dur[i] = slot.ns;
                if (occupancy) {
                    smShare[i] = slot.sm;
                    hbmShare[i] = slot.hbm;
                }
            }
        }
        return units;
    }

    // Compute overlapped by collectives stretches (overlap_slowdown), and on a CPU device the
    // collectives overlapped by compute too (comm_overlap_slowdown: Gloo's threads share the
    // cores), by the overlaps of the schedule before. With both, each stretch moves the
    // other's overlaps: a few rounds from the unstretched times settle them. Returns whether
    // the collectives' union is stale.
    bool stretchOverlapped() {
        std::vector<int64_t>& dur = w.dur;
        const std::vector<int64_t>& launch = w.launch;
        const std::vector<int64_t>& hostFirst = w.hostFirst;
        const std::vector<int32_t>& computeOps = w.computeOps;
        const auto& collByStream = w.collByStream;
        std::vector<Interval>& commU = w.commU;
        bool commStale = true;
        if (occupancy) {
            // The op's time in memory-bound kernels, what HBM traffic beside it slows (a copy's
            // whole time; a kernel mix's by its parts, once per mix).
            w.mixMemory.assign(p.mixes.size(), -1);
            auto memoryFraction = [&](size_t i) {
                const Op& op = p.ops[i];
                if (op.mix < 0 || static_cast<size_t>(op.mix) >= p.mixes.size())
                    return op.memBytes > 0 ? 1.0 : 0.0;
                double& f = w.mixMemory[static_cast<size_t>(op.mix)];
                if (f < 0) {
                    const MixParts mp =
                        mixParts(c, p.mixes[static_cast<size_t>(op.mix)], op.computeDtype);
                    const double all = mp.computeSeconds + mp.memorySeconds;
                    f = all > 0 ? mp.memorySeconds / all : 0;
                }
                return f;
            };
            occupancyStretch(t, collByStream, computeOps, w.smShare, w.hbmShare, memoryFraction, w,
                             dur);
            r.stepNs = schedule(p, c, dur, launch, hostFirst, t);
        } else if (c.sim.overlapSlowdown > 0 || c.sim.commOverlapSlowdown > 0) {
            const int rounds = c.sim.commOverlapSlowdown > 0 ? 3 : 1;
            std::vector<int64_t>& base = w.baseDur;
            if (rounds > 1) base = dur;
            for (int round = 0; round < rounds; ++round) {
                bool changed = false;
                if (round > 0) dur = base;
                if (c.sim.commOverlapSlowdown > 0) {
                    computeUnion(t, w);
                    Sweep computeOverlap{w.computeU};
                    for (const auto& run : collByStream)
                        for (const int32_t k : run) {
                            const auto i = static_cast<size_t>(k);
                            const int64_t ov =
                                computeOverlap(p.ops[i].stream, t.start[i], t.end[i]);
                            if (ov > 0) {
                                dur[i] += static_cast<int64_t>(c.sim.commOverlapSlowdown *
                                                               static_cast<double>(ov));
                                changed = true;
                            }
                        }
                }
                if (c.sim.overlapSlowdown > 0) {
                    commUnion(t, w);
                    commStale = false;
                    Sweep overlap{commU};
                    for (const int32_t k : computeOps) {
                        const auto i = static_cast<size_t>(k);
                        if (dur[i] <= 0) continue;
                        const int64_t ov = overlap(p.ops[i].stream, t.start[i], t.end[i]);
                        if (ov > 0) {
                            dur[i] += static_cast<int64_t>(c.sim.overlapSlowdown *
                                                           static_cast<double>(ov));
                            changed = true;
                        }
                    }
                }
                if (!changed) break;
                r.stepNs = schedule(p, c, dur, launch, hostFirst, t);
                commStale = true;
            }
        }
        return commStale;
    }

    // Exposed communication over the step and per unit.
    void communication(int32_t units, bool commStale) {
        const std::vector<int64_t>& dur = w.dur;
        const std::vector<int32_t>& computeOps = w.computeOps;
        const auto& collByStream = w.collByStream;
        const std::vector<Interval>& commU = w.commU;
        for (const int32_t k : computeOps)
            r.computeNs += dur[static_cast<size_t>(k)];
        computeUnion(t, w);
        const std::vector<Interval>& computeU = w.computeU;
        if (commStale) commUnion(t, w);
        r.commNs = totalLength(commU);
        const int64_t both = intersectionLength(commU, computeU);
        r.exposedCommNs = r.commNs - both;
        r.overlapRatio =
            r.commNs > 0 ? static_cast<double>(both) / static_cast<double>(r.commNs) : 0.0;

        // Per-unit communication.
        r.units.assign(static_cast<size_t>(units), {});
        Sweep computeOverlap{computeU};
        for (const auto& run : collByStream)
            for (const int32_t k : run) {
                const auto i = static_cast<size_t>(k);
                const Op& op = p.ops[i];
                auto& u = r.units[op.unit.index()];
                if (op.kind == OpKind::AllGather)
                    u.allGatherBytes += op.commBytes;
                else
                    u.reduceScatterBytes += op.commBytes;
                u.commNs += dur[i];
                u.exposedCommNs +=
                    (t.end[i] - t.start[i]) - computeOverlap(op.stream, t.start[i], t.end[i]);
            }
    }

    // Plans that cannot fit: allocated bytes alone exceed the budget, so the (costlier)
    // caching-allocator model would only confirm it. Returns whether that is the answer.
    bool overBudget(int64_t worldSize) {
        if (o.reservedBudget > 0 && !o.keepTimeline) {
            int64_t alloc = 0, peak = 0;
            for (int k = 0; k < static_cast<int>(MemCategory::Count); ++k)
                if (p.persistentBytes[k] > 0)
                    alloc += AllocatorModel::roundSize(p.persistentBytes[k]);
            std::vector<char>& live = w.live;
            live.assign(p.buffers.size(), 0);
            for (const Op& op : p.ops) {
                auto allocOne = [&](BufferId b) {
                    if (p.buffers[b.index()].bytes > 0) {
                        live[b.index()] = 1;
                        alloc += AllocatorModel::roundSize(p.buffers[b.index()].bytes);
                    }
                };
                auto freeOne = [&](BufferId b) {
                    if (live[b.index()]) {
                        live[b.index()] = 0;
                        alloc -= AllocatorModel::roundSize(p.buffers[b.index()].bytes);
                    }
                };
                const size_t early = earlyFrees(op);
                for (size_t k = 0; k < early; ++k)
                    freeOne(op.frees[k]);
                allocsThenLateFrees(op, allocOne, freeOne, [&] { peak = std::max(peak, alloc); });
            }
            if (peak > o.reservedBudget) {
                r.peakAllocated = peak;
                r.peakReserved = peak;
                r.reservedIsLowerBound = true;
                r.oom = peak > c.device.memoryBytes;
                const double seconds = static_cast<double>(r.stepNs) * 1e-9;
                if (seconds > 0)
                    r.tokensPerS = static_cast<double>(p.tokensPerRank * worldSize) / seconds;
                return true;
            }
        }
        return false;
    }

    void replayMemory() {
        // Memory: issue order; frees of a copy-out (the previous all-gather buffer is released
        // before copying out) come first, otherwise allocations first.
        // One model per thread, emptied for each step: its storage outlives the call.
        thread_local AllocatorModel alloc;
        alloc.reset(o.expandableSegments);
        alloc.setCapacity(c.device.memoryBytes);
        alloc.reserve(2 * p.buffers.size() + static_cast<size_t>(MemCategory::Count));
        std::vector<int64_t>& handle = w.handle;
        handle.assign(p.buffers.size(), -1);
        std::array<int64_t, static_cast<size_t>(MemCategory::Count)> cat{};
        int64_t allocated = 0;
        for (int k = 0; k < static_cast<int>(MemCategory::Count); ++k) {
            const int64_t b = p.persistentBytes[k];
            if (b <= 0) continue;
            alloc.allocate(b, 0);
            cat[static_cast<size_t>(k)] += AllocatorModel::roundSize(b);
            allocated += AllocatorModel::roundSize(b);
        }
        auto allocOne = [&](BufferId b) {
            const Buffer& buf = p.buffers[b.index()];
            if (buf.bytes <= 0) return;
            handle[b.index()] = alloc.allocate(buf.bytes, static_cast<int>(buf.stream));
            const int64_t sz = AllocatorModel::roundSize(buf.bytes);
            allocated += sz;
            cat[static_cast<size_t>(buf.category)] += sz;
        };
        auto freeOne = [&](BufferId b) {
            if (handle[b.index()] < 0) return;
            const Buffer& buf = p.buffers[b.index()];
            alloc.free(handle[b.index()]);
            handle[b.index()] = -1;
            const int64_t sz = AllocatorModel::roundSize(buf.bytes);
            allocated -= sz;
            cat[static_cast<size_t>(buf.category)] -= sz;
        };
        auto doAllocs = [&](const Op& op) {
            for (BufferId b : op.allocs)
                allocOne(b);
        };
        auto doFrees = [&](const Op& op, size_t from, size_t to) {
            for (size_t k = from; k < to; ++k)
                freeOne(op.frees[k]);
        };
        size_t phase = 0;
        // The allocator sees allocations in issue order; an op issued later than another but
        // started earlier on an idle stream (the CPU runs ahead) is placed no earlier than the
        // samples before it, so the memory timeline never goes back in time.
        int64_t lastSample = 0;
        auto sample = [&](int64_t t) {
            t = std::max(t, lastSample);
            lastSample = t;
            r.peakAllocatedByPhase[phase] = std::max(r.peakAllocatedByPhase[phase], allocated);
            if (allocated > r.peakAllocated) {
                r.peakAllocated = allocated;
                r.atPeak = cat;
            }
            r.peakReserved = std::max(r.peakReserved, alloc.reserved());
            if (o.keepTimeline) r.timeline.push_back({t, allocated, alloc.reserved(), cat});
        };
        sample(0);
        // Without a timeline, only a sample that can raise a peak is taken: after allocations,
        // and at the first op of a phase (its peak starts at the level it is entered with).
        // Frees never raise one (reserved bytes are never returned).
        for (size_t i = 0; i < n; ++i) {
            const Op& op = p.ops[i];
            const bool newPhase = static_cast<size_t>(op.phase) != phase;
            phase = static_cast<size_t>(op.phase);
            const size_t early = earlyFrees(op);
            doFrees(op, 0, early);
            if (op.interleaved) {
                allocsThenLateFrees(op, allocOne, freeOne, [&] { sample(t.start[i]); });
                if (o.keepTimeline) sample(t.start[i]);
                continue;
            }
            doAllocs(op);
            if (op.kind == OpKind::CopyOut && early == op.frees.size()) {  // one sample after
                sample(t.start[i]);
                continue;
            }
            if (o.keepTimeline || newPhase || !op.allocs.empty()) sample(t.start[i]);
            doFrees(op, early, op.frees.size());
            if (o.keepTimeline) sample(t.start[i]);
        }
    }
};
}  // namespace

SimResult simulate(const StepProgram& p, const ClusterSpec& c, int64_t worldSize,
                   const SimOptions& o) {
    SimResult r;
    const size_t n = p.ops.size();
    thread_local Scratch w;
    // Per-op start and end: in the result, or (a search's) in the scratch.
    Times t{o.keepOpTimes ? r.start : w.start, o.keepOpTimes ? r.end : w.end};
    std::vector<int64_t>& dur = w.dur;
    dur.resize(n);  // every entry is written below
    // Decoder layers share their kernel mixes: price each mix once. Their collectives and
    // copies repeat too (a few distinct ones a layer): each distinct one is priced once.
    w.mixNs.assign(p.mixes.size(), -1);
    // CPU time to launch each op's kernels: per kernel of its mix, at the rate of the thread
    // that launches them (cpuLaunchNsFor).
    const bool launches =
        c.sim.cpuLaunchNs > 0 || c.sim.cpuLaunchForwardNs > 0 || c.sim.cpuLaunchBackwardNs > 0;
    if (launches)
        w.launch.assign(n, 0);
    else
        w.launch.clear();
    // CPU time before a reduce-scatter copy-in's kernel: torch._chunk_cat lists a block index
    // for every 2 KiB (kChunkCatBytesPerBlock) of one chunk of its output on the host and copies
    // the list to the device before launching (ATen's TensorShape.cu, get_chunk_cat_metadata);
    // FSDP2 makes one chunk per rank of the reduce-scatter group (foreach_reduce's
    // num_chunks = world_size), so over many ranks the list is short. FSDP1's flat gradient
    // cast and a CPU device's composite _chunk_cat build no such list.
    const bool chunkCatHost = c.sim.chunkCatHostNsPerBlock > 0 && !c.device.isHost();
    if (chunkCatHost)
        w.hostFirst.assign(n, 0);
    else
        w.hostFirst.clear();
    w.computeOps.clear();
    for (auto& run : w.collByStream)
        run.clear();
    const bool occupancy = c.nccl.has_value() && !c.device.isHost();
    if (occupancy) {
        w.smShare.assign(n, 0);
        w.hbmShare.assign(n, 0);
    }
    Step step{p, c, o, w, r, t, n, occupancy, launches, chunkCatHost};
    const int32_t units = step.priceOps();
    r.stepNs = schedule(p, c, w.dur, w.launch, w.hostFirst, t);
    // Second pass: compute overlapped by collectives runs slower.
    const bool commStale = step.stretchOverlapped();
    step.communication(units, commStale);
    if (step.overBudget(worldSize)) return r;
    step.replayMemory();
    r.oom = r.peakReserved > c.device.memoryBytes;
    const double seconds = static_cast<double>(r.stepNs) * 1e-9;
    if (seconds > 0) {
        r.tokensPerS = static_cast<double>(p.tokensPerRank * worldSize) / seconds;
        DType dt = DType::Float32;
        for (const Op& op : p.ops)
            if (isComputeKind(op.kind)) {
                dt = op.computeDtype;
                break;
            }
        r.mfu = p.modelFlopsPerRank / (seconds * c.device.peakFor(dt));
    }
    return r;
}

}  // namespace shardscope
