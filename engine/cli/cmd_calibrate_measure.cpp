// SPDX-License-Identifier: Apache-2.0
// `shardscope calibrate --measure`: microbenchmarks of this machine, fitted like a trace's
// kernels.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "engine/calibrate/calibrate.h"
#include "engine/calibrate/kernel_fit.h"
#include "engine/calibrate/kernel_report.h"
#include "engine/calibrate/kernel_samples.h"
#include "engine/cli/calibrate_cli.h"
#include "engine/cli/calibrate_report.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/cli/fsdp_trace_cli.h"
#include "engine/cli/launch.h"
#include "engine/measure/step_trace.h"
#include "engine/measure/trace_diff.h"
#include "engine/schedule/step_program.h"
#include "engine/sim/cost_model.h"
#include "engine/sim/simulator.h"
#include "plans/core/atomic_write.h"
#include "plans/core/strings.h"
#include "plans/plan/resolve.h"
#include "profiler/analysis/trace_loader.h"

namespace shardscope::cli {

// `calibrate --measure`: microbenchmarks of this machine (shardscope-engine measure on local
// ranks), fitted like a trace's kernels, from --cluster or from a cluster made of what was
// measured (the best GEMM rate per dtype as the peak, the best copy rate as the memory
// bandwidth, the local ranks as one node).
int runCalibrateMeasure(const Args& a) {
    const std::string device = a.has("--device") ? a.get("--device") : "cpu";
    if (device != "cpu" && device != "cuda") {
        std::cerr << "error: --device: expected cpu or cuda, got \"" << device << "\"\n";
        return kExitUsage;
    }
    std::vector<int64_t> ints;
    if (!readIntOptions(a, {"--nproc", "--threads", "--reps", "--timeout-s"}, {1, 1, 2, 1}, ints))
        return kExitUsage;
    const int64_t nproc = ints[0] ? ints[0] : device == "cuda" ? 1 : 2;
    const auto rankThreads = threadsPerRank(nproc, ints[1]);
    if (!rankThreads) {
        std::cerr << "error: " << rankThreads.error() << "\n";
        return kExitUsage;
    }
    const int64_t threads = *rankThreads;
    std::optional<ClusterSpec> given;
    if (a.has("--cluster")) {
        auto c = loadClusterNamed(a.get("--cluster"));
        if (failed(c)) return kExitUsage;
        given = std::move(*c);
    }
    auto engine = findEngine();
    if (failed(engine)) return kExitFailed;
    auto dir = makeRunFolder("shardscope-measure");
    if (failed(dir)) return kExitFailed;
    const int64_t timeoutS = ints[3] ? ints[3] : 300;
    std::vector<std::string> args{engine->string(), "measure",
                                  "--device",       device,
                                  "--threads",      std::to_string(threads),
                                  "--reps",         std::to_string(ints[2] ? ints[2] : 4),
                                  "--timeout-s",    std::to_string(timeoutS)};
    if (a.flag("--quick")) args.push_back("--quick");
    std::cerr << "shardscope calibrate --measure: " << nproc << " rank" << (nproc > 1 ? "s" : "")
              << " on " << (device == "cuda" ? "cuda:0.." : "this CPU") << ", " << threads
              << " thread" << (threads > 1 ? "s" : "") << " each; logs in " << dir->string()
              << "\n";
    if (const int rc =
            launchLocalRanks(args, nproc, *dir, timeoutS, "shardscope calibrate --measure");
        rc != 0)
        return rc;
    const std::string file = (*dir / "rank0.json").string();
    std::ifstream inFile(file);
    const auto m = nlohmann::json::parse(inFile, nullptr, false);
    if (m.is_discarded() || !m.is_object() || !m.contains("samples") || !m["samples"].is_array()) {
        std::cerr << "error: " << file << ": the measurement is not readable JSON with samples\n";
        return kExitFailed;
    }
    KernelSamples samples;
    std::map<DType, double> bestFlops;
    double bestBytes = 0;
    for (const auto& j : m["samples"]) {
        KernelSample k;
        const std::string cls = j.value("class", "");
        k.cls = cls == "gemm"           ? KernelClass::Gemm
                : cls == "memory-bound" ? KernelClass::MemoryBound
                : cls == "collective"   ? KernelClass::Collective
                : cls == "attention"    ? KernelClass::Attention
                                        : KernelClass::Other;
        k.step = j.value("step", 0);
        k.durNs = j.value("dur_ns", int64_t{0});
        k.flops = j.value("flops", 0.0);
        k.bytes = j.value("bytes", 0.0);
        k.groupSize = j.value("group_size", 0);
        k.collective = j.value("collective", "");
        k.op = k.kernel = j.value("op", "");
        if (auto d = parseDType(j.value("dtype", "float32")); d) k.dtype = *d;
        // A GEMM's [M, N, K] (shardscope-engine measure writes them): its shape's own
        // efficiency is fitted, as a trace's are (gemm_efficiency_by_shape). Without them a
        // CPU whose bf16 and fp32 GEMMs scale differently by size (AMX on a Xeon: small bf16
        // GEMMs at a tenth of its peak, fp32 at a third) had both priced by one curve.
        if (const auto sh = j.find("shape");
            k.cls == KernelClass::Gemm && sh != j.end() && sh->is_array() && sh->size() == 3 &&
            std::all_of(sh->begin(), sh->end(), [](const nlohmann::json& x) {
                return x.is_number_integer() && x.get<int64_t>() > 0;
            })) {
            k.m = (*sh)[0].get<int64_t>();
            k.n = (*sh)[1].get<int64_t>();
            k.k = (*sh)[2].get<int64_t>();
        }
        if (k.durNs <= 0) continue;
        const double secs = static_cast<double>(k.durNs) * 1e-9;
        if (k.cls == KernelClass::Gemm)
            bestFlops[k.dtype] = std::max(bestFlops[k.dtype], k.flops / secs);
        if (k.cls == KernelClass::MemoryBound) bestBytes = std::max(bestBytes, k.bytes / secs);
        samples.samples.push_back(std::move(k));
    }
    const auto& dj = m.value("device", nlohmann::json::object());
    const std::string deviceName = dj.value("name", std::string("this machine"));
    const std::string when =
        "measured by `shardscope calibrate --measure` (" + std::to_string(nproc) + " local ranks)";
    ClusterSpec base;
    if (given) {
        base = *given;
        if (!sameDevice(deviceName, base.device.name))
            std::cerr << "warning: measured " << deviceName << ", and " << a.get("--cluster")
                      << " describes " << base.device.name << "\n";
    } else {
        if (bestFlops.empty() || bestBytes <= 0) {
            std::cerr << "error: " << file
                      << ": no GEMM or copy was measured; nothing to make a cluster from\n";
            return kExitFailed;
        }
        base.name = "this machine: " + deviceName + " x " + std::to_string(nproc);
        base.nodes = 1;
        base.device.name = deviceName;
        base.device.kind = dj.value("kind", std::string("cpu")) == "gpu" ? "gpu" : "cpu";
        base.device.memoryBytes = dj.value("memory_bytes", int64_t{0});
        base.device.peakFlops = bestFlops;
        base.device.hbmBandwidth = bestBytes;
        base.node.devicesPerNode = nproc;
        // Placeholders the collective fit replaces (one node: the network is not used).
        base.node.intraBandwidth = bestBytes;
        base.network.nicBandwidth = bestBytes;
        base.host.linkBandwidth = bestBytes;
        for (const char* f : {"/device/peak_flops", "/device/hbm_bandwidth_bytes_per_s",
                              "/device/memory_bytes", "/node/devices_per_node"})
            base.sources[f] =
                when + (std::string(f) == "/device/peak_flops" ? ": the best GEMM rate per dtype"
                        : std::string(f) == "/device/hbm_bandwidth_bytes_per_s"
                            ? ": the best copy or add rate"
                            : "");
        base.sources["/network/nic_bandwidth_bytes_per_s"] =
            "not measured (one node): the memory bandwidth as a placeholder";
        base.sources["/host/link_bandwidth_bytes_per_s"] =
            "not measured: the memory bandwidth as a placeholder";
    }
    std::cerr << "measured " << samples.samples.size() << " points on " << deviceName
              << "; launching one tiny op costs " << static_cast<int64_t>(m.value("launch_ns", 0.0))
              << " ns\n";
    KernelFitInputs in;
    in.inputs = {file};
    in.source = when + " on " + deviceName;
    in.baseLabel = given ? a.get("--cluster") : "the measured peaks";
    in.clusterName = given ? given->name + ", calibrated on this machine" : base.name;
    in.headline = "Measured " + deviceName + " (" + std::to_string(nproc) + " rank" +
                  (nproc > 1 ? "s" : "") + ", " + std::to_string(threads) + " thread" +
                  (threads > 1 ? "s" : "") + " each)";
    const int rc = finishKernelCalibration(a, samples, base, in);
    if (rc == kExitOk) {
        std::error_code ec;
        std::filesystem::remove_all(*dir, ec);
    }
    return rc;
}

}  // namespace shardscope::cli
