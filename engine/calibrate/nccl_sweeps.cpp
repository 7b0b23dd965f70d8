// SPDX-License-Identifier: Apache-2.0
#include "engine/calibrate/nccl_sweeps.h"

#include <algorithm>
#include <cmath>

#include "plans/core/json_reader.h"

namespace shardscope {

namespace {

std::optional<OpKind> collectiveKind(const std::string& name) {
    if (name == "all_gather") return OpKind::AllGather;
    if (name == "reduce_scatter") return OpKind::ReduceScatter;
    if (name == "all_reduce") return OpKind::AllReduce;
    return std::nullopt;
}

OpKind readKind(const JsonReader& r) {
    const std::string name = r.asString();
    const auto k = collectiveKind(name);
    if (!k)
        r.fail("expected \"all_gather\", \"reduce_scatter\" or \"all_reduce\", got \"" + name +
               "\"");
    return *k;
}

// nccl-tests' bus bandwidth factor: busbw = algbw x factor.
double busFactor(OpKind k, int n) {
    const double f = static_cast<double>(n - 1) / n;
    return k == OpKind::AllReduce ? 2 * f : f;
}

SweepPoint readPoint(const JsonReader& p, std::optional<OpKind> kind, int ranks) {
    p.allowOnly({"collective", "ranks", "bytes", "time_us", "busbw_GBps", "nccl_env"});
    SweepPoint pt;
    if (auto c = p.find("collective")) kind = readKind(*c);
    if (!kind) p.fail("no collective: give it on the sweep or on the point");
    pt.kind = *kind;
    pt.ranks = ranks;
    if (auto r = p.find("ranks")) pt.ranks = static_cast<int>(r->asIntAtLeast(2));
    if (pt.ranks < 2) p.fail("no ranks: give them on the sweep or on the point (at least 2)");
    pt.bytes = p.at("bytes").asIntAtLeast(1);
    const auto t = p.find("time_us");
    const auto bw = p.find("busbw_GBps");
    if (t && bw) p.fail("give time_us or busbw_GBps, not both");
    if (t) {
        pt.measuredUs = t->asPositiveNumber();
    } else if (bw) {
        const double algbw = bw->asPositiveNumber() / busFactor(pt.kind, pt.ranks);
        pt.measuredUs = static_cast<double>(pt.bytes) / (algbw * 1e3);
    } else {
        p.fail("give the point's time_us or busbw_GBps");
    }
    if (auto env = p.find("nccl_env")) {
        env->allowOnly({"NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE"});
        const std::string algo = env->optString("NCCL_ALGO").value_or("");
        const std::string proto = env->optString("NCCL_PROTO").value_or("");
        const std::string nvls = env->optString("NCCL_NVLS_ENABLE").value_or("");
        auto e = parseNcclEnv(algo, proto, nvls);
        if (!e) env->fail(e.error());
        pt.env = *e;
        for (const auto& [k, v] : {std::pair<const char*, std::string>{"NCCL_ALGO", algo},
                                   {"NCCL_PROTO", proto},
                                   {"NCCL_NVLS_ENABLE", nvls}})
            if (!v.empty())
                pt.envText += (pt.envText.empty() ? "" : " ") + std::string(k) + "=" + v;
    }
    return pt;
}

}  // namespace

SweepBand sweepBand(int64_t bytes) {
    if (bytes <= (int64_t{1} << 20)) return SweepBand::Small;
    if (bytes >= (int64_t{16} << 20)) return SweepBand::Large;
    return SweepBand::Middle;
}

const char* sweepBandName(SweepBand b) {
    switch (b) {
        case SweepBand::Small:
            return "<= 1 MiB";
        case SweepBand::Middle:
            return "1-16 MiB";
        case SweepBand::Large:
            return ">= 16 MiB";
    }
    return "";
}

Expected<SweepFile> loadNcclSweeps(const std::string& path, const std::string& clusterDir) {
    auto j = readJsonFile(path);
    if (!j) return Error{j.error()};
    SweepFile out;
    auto parsed = catchJsonErrors<SweepFile>([&] {
        JsonReader r(*j, path);
        r.checkFormat(kNcclSweepsFormat, 1);
        r.allowOnly({"format", "version", "about", "sweeps"});
        SweepFile f;
        const JsonReader list = r.at("sweeps");
        for (size_t i = 0; i < list.size(); ++i) {
            const JsonReader s = list[i];
            s.allowOnly({"id", "collective", "ranks", "cluster", "tool", "timing", "nccl", "tuner",
                         "held_out", "source", "quote", "points"});
            Sweep w;
            w.id = s.getString("id");
            for (const Sweep& o : f.sweeps)
                if (o.id == w.id) s.at("id").fail("two sweeps have the id \"" + w.id + "\"");
            w.source = s.getString("source");
            w.quote = s.optString("quote").value_or("");
            w.tool = s.getString("tool");
            const std::string timing = s.getString("timing");
            if (timing != "async" && timing != "blocking")
                s.at("timing").fail(
                    "expected \"async\" (nccl-tests' default: calls queued back "
                    "to back) or \"blocking\" (each call waited for), got \"" +
                    timing + "\"");
            w.blocking = timing == "blocking";
            w.tuner = s.optString("tuner").value_or("");
            w.heldOut = s.optBool("held_out").value_or(false);
            w.clusterName = s.getString("cluster");
            std::optional<OpKind> kind;
            if (auto c = s.find("collective"); c && !c->isNull()) kind = readKind(*c);
            int ranks = 0;
            if (auto n = s.find("ranks"); n && !n->isNull())
                ranks = static_cast<int>(n->asIntAtLeast(2));
            if (auto v = s.find("nccl"); v && !v->isNull()) {
                const std::string ver = v->asString();
                if (ncclTableFor(ver).empty())
                    v->fail("expected an NCCL version 2.23 or later, got \"" + ver + "\"");
                w.ncclVersion = ver;
            }
            const JsonReader pts = s.at("points");
            for (size_t k = 0; k < pts.size(); ++k)
                w.points.push_back(readPoint(pts[k], kind, ranks));
            if (w.points.empty()) pts.fail("a sweep needs at least one point");
            f.sweeps.push_back(std::move(w));
        }
        return f;
    });
    if (!parsed) return Error{parsed.error()};
    out = std::move(*parsed);
    for (Sweep& w : out.sweeps) {
        const std::string file = clusterDir + "/" + w.clusterName + ".json";
        auto c = loadClusterFile(file);
        if (!c) return Error{path + ": sweep \"" + w.id + "\": " + c.error()};
        if (!c->nccl)
            return Error{path + ": sweep \"" + w.id + "\": " + file +
                         " has no nccl section: its collectives are not priced by NCCL's model"};
        w.cluster = std::move(*c);
        if (!w.ncclVersion.empty()) w.cluster.nccl->version = w.ncclVersion;
        for (const SweepPoint& p : w.points)
            if (p.ranks > w.cluster.worldSize())
                return Error{path + ": sweep \"" + w.id + "\": " + std::to_string(p.ranks) +
                             " ranks, but " + file + " has " +
                             std::to_string(w.cluster.worldSize()) + " devices"};
    }
    return out;
}

std::vector<SweepPointResult> evaluateSweep(const Sweep& s) {
    std::vector<SweepPointResult> out;
    for (const SweepPoint& p : s.points) {
        const RankPlacement at = placeRanks(s.cluster, p.ranks);
        auto e =
            ncclCollective(s.cluster, *s.cluster.nccl, p.kind, p.bytes, p.ranks, at.nodes, p.env);
        SweepPointResult r;
        r.point = p;
        if (e) r.estimate = *e;
        r.predictedUs = r.estimate.us;
        r.error = (r.predictedUs - p.measuredUs) / p.measuredUs;
        out.push_back(r);
    }
    return out;
}

BandSummary summarize(const std::vector<SweepPointResult>& r, SweepBand b) {
    std::vector<double> e;
    for (const auto& x : r)
        if (sweepBand(x.point.bytes) == b) e.push_back(std::abs(x.error));
    BandSummary s;
    s.points = static_cast<int>(e.size());
    if (e.empty()) return s;
    std::sort(e.begin(), e.end());
    const size_t m = e.size() / 2;
    s.medianAbsError = e.size() % 2 ? e[m] : (e[m - 1] + e[m]) / 2;
    s.maxAbsError = e.back();
    return s;
}

namespace {

double medianAbs(std::vector<double> v) {
    if (v.empty()) return 0;
    for (double& x : v)
        x = std::abs(x);
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Sum of |log(predicted / measured)| over the sweeps' points that `take` selects.
template <typename Take>
double loss(const SweepFile& f, Take take) {
    double sum = 0;
    for (const Sweep& s : f.sweeps)
        if (!s.heldOut)
            for (const SweepPointResult& r : evaluateSweep(s))
                if (take(s, r)) sum += std::abs(std::log(r.predictedUs / r.point.measuredUs));
    return sum;
}

// Golden-section search of a one-dimensional loss on [lo, hi].
template <typename F>
double minimize(F f, double lo, double hi) {
    const double g = (std::sqrt(5.0) - 1) / 2;
    double a = lo, b = hi, c = b - g * (b - a), d = a + g * (b - a);
    double fc = f(c), fd = f(d);
    for (int i = 0; i < 40; ++i) {
        if (fc < fd) {
            b = d;
            d = c;
            fd = fc;
            c = b - g * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + g * (b - a);
            fd = f(d);
        }
    }
    return (a + b) / 2;
}

bool crossesNodes(const Sweep& s, const SweepPointResult& r) {
    return placeRanks(s.cluster, r.point.ranks).nodes > 1;
}

}  // namespace

NcclSweepFit fitNcclCorrections(SweepFile& f) {
    NcclSweepFit out;
    std::vector<std::string> names;
    for (const Sweep& s : f.sweeps)
        if (!s.heldOut && std::find(names.begin(), names.end(), s.clusterName) == names.end())
            names.push_back(s.clusterName);
    auto errorsOf = [&](const std::string& name) {
        std::vector<double> e;
        for (const Sweep& s : f.sweeps)
            if (s.clusterName == name && !s.heldOut)
                for (const auto& r : evaluateSweep(s))
                    e.push_back(r.error);
        return e;
    };
    auto setAll = [&](const std::string& name, auto apply) {
        for (Sweep& s : f.sweeps)
            if (s.clusterName == name) apply(*s.cluster.nccl);
    };
    std::vector<double> before(names.size());
    for (size_t i = 0; i < names.size(); ++i)
        before[i] = medianAbs(errorsOf(names[i]));
    auto hasNet = [&](const std::string& name) {
        for (const Sweep& s : f.sweeps)
            if (s.clusterName == name)
                for (const SweepPoint& p : s.points)
                    if (placeRanks(s.cluster, p.ranks).nodes > 1) return true;
        return false;
    };
    // Per profile: alternate the one-dimensional fits a few rounds (they interact only
    // weakly: the time per call matters for small sizes, the efficiencies for large ones).
    auto fitProfiles = [&] {
        for (const std::string& name : names) {
            for (int round = 0; round < 3; ++round) {
                auto netPoint = [&](const Sweep& s, const SweepPointResult& r) {
                    return s.clusterName == name && crossesNodes(s, r);
                };
                auto anyPoint = [&](const Sweep& s, const SweepPointResult&) {
                    return s.clusterName == name;
                };
                const double launch = minimize(
                    [&](double x) {
                        setAll(name, [x](NcclSpec& n) { n.launchUs = x; });
                        return loss(f, anyPoint);
                    },
                    0, 1000);
                setAll(name, [launch](NcclSpec& n) { n.launchUs = launch; });
                // The net plugin's latency (NCCL adds it per network step, twice for Simple):
                // what a fabric's plugin reports is rarely published, so it is fitted where the
                // profile's sweeps cross nodes.
                if (hasNet(name)) {
                    const double lat = minimize(
                        [&](double x) {
                            setAll(name, [x](NcclSpec& n) { n.netLatencyUs = x; });
                            return loss(f, netPoint);
                        },
                        0, 500);
                    setAll(name, [lat](NcclSpec& n) { n.netLatencyUs = lat; });
                }
                // The three bandwidth classes: Ring/Tree within a node, across nodes, and
                // whatever NVLink SHARP carries (NVLS, NVLSTree).
                for (int cls = 0; cls < 3; ++cls) {
                    // Efficiencies from the points their bandwidth term governs (16 MiB and
                    // up): below, latency and the time per call decide.
                    auto inClass = [&, cls](const Sweep& s, const SweepPointResult& r) {
                        if (s.clusterName != name || r.point.bytes < (int64_t{16} << 20))
                            return false;
                        const bool nvls = r.estimate.algo == NcclAlgo::NVLS ||
                                          r.estimate.algo == NcclAlgo::NVLSTree;
                        if (cls == 2) return nvls;
                        return !nvls && crossesNodes(s, r) == (cls == 1);
                    };
                    auto field = [cls](NcclSpec& n) -> double& {
                        return cls == 0   ? n.nvlinkEfficiency
                               : cls == 1 ? n.netEfficiency
                                          : n.nvlsEfficiency;
                    };
                    if (loss(f, inClass) == 0) continue;  // no point of this class
                    const double eff = minimize(
                        [&](double x) {
                            setAll(name, [&](NcclSpec& n) { field(n) = x; });
                            return loss(f, inClass);
                        },
                        0.3, 1.3);
                    setAll(name, [&](NcclSpec& n) { field(n) = eff; });
                }
            }
        }
    };
    // The slices filled, for every sweep together: the profiles fitted at each candidate.
    auto all = [](const Sweep&, const SweepPointResult&) { return true; };
    double bestLoss = 0, bestSlices = NcclSpec::kDefaultFillSlices;
    bool first = true;
    for (double slices : {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0}) {
        for (Sweep& s : f.sweeps)
            s.cluster.nccl->fillSlices = slices;
        fitProfiles();
        const double l = loss(f, all);
        if (first || l < bestLoss) {
            first = false;
            bestLoss = l;
            bestSlices = slices;
        }
    }
    for (Sweep& s : f.sweeps)
        s.cluster.nccl->fillSlices = bestSlices;
    fitProfiles();
    out.fillSlices = bestSlices;
    for (size_t i = 0; i < names.size(); ++i) {
        NcclProfileFit p;
        p.clusterName = names[i];
        for (const Sweep& s : f.sweeps)
            if (s.clusterName == names[i] && !s.heldOut) {
                p.launchUs = s.cluster.nccl->launchUs;
                p.nvlinkEfficiency = s.cluster.nccl->nvlinkEfficiency;
                p.netEfficiency = s.cluster.nccl->netEfficiency;
                p.netLatencyUs = s.cluster.nccl->netLatencyUs;
                p.nvlsEfficiency = s.cluster.nccl->nvlsEfficiency;
                for (const auto& r : evaluateSweep(s)) {
                    ++p.points;
                    if (r.estimate.algo == NcclAlgo::NVLS || r.estimate.algo == NcclAlgo::NVLSTree)
                        ++p.nvlsPoints;
                    else
                        (crossesNodes(s, r) ? p.netPoints : p.nodePoints) += 1;
                }
            }
        p.medianAbsErrorBefore = before[i];
        p.medianAbsErrorAfter = medianAbs(errorsOf(names[i]));
        out.profiles.push_back(p);
    }
    return out;
}

}  // namespace shardscope
