#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the bundled GPU profiles' kernel tables (samples/clusters/*-sxm*.json device files)
from measurements, and states each derivation in the file's `sources`.

  H200 SXM        calibrate --from-trace on the fifteen real FSDP2/FSDP1 H200 runs in
                  tests/data (GEMMs by shape and size, attention, memory-bound kernels by
                  operator and size, AdamW's foreach kernels, the host's launch rates with the
                  profiler's share taken out, fitted on the Qwen3 run timed without it).
  H100 SXM 80GB   the same GH100 die at the same 700 W: H200's compute tables; memory-bound
                  kernels re-timed for HBM3's 3.35 TB/s.
  H100 96GB 500W  Meta's Grand Teton H100 (HBM2e, 2.4 TB/s, 500 W power limit): H200's
                  tables with the SM clock a power limit allows and HBM2e's bandwidth.
  A100 80/40GB    H200's tables re-timed for A100's measured matmul ceiling and HBM2e/HBM2.
  B200            calibrate --from-trace on TraceLens's B200 trace (when ../shared holds it).

A kernel's time on the measured GPU splits into a part that runs at the device's rate (work
over the ceiling the largest kernels reach) and the rest (launch, tail, latency). A derived
GPU runs the first part at its own rate and keeps the rest, scaled by its clock where the
clock changes. Run from the checkout after building:

    python3 scripts/derive_profiles.py [--shardscope build/engine/shardscope] [--check]

--check writes nothing and exits 1 when a committed profile differs from what this derives
(tests/python/test_profiles.py runs it).
"""
import argparse
import gzip
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTERS = os.path.join(ROOT, "samples", "clusters")
DATA = os.path.join(ROOT, "tests", "data")
SHARED_B200 = os.path.join(ROOT, "..", "shared", "data", "traces", "TraceLens", "tests", "traces",
                           "b200", "eager_trace.json.gz")

# Datasheet peaks, dense (NVIDIA's H100/H200, A100 and HGX B200 datasheets).
PEAKS_HOPPER = {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12, "float8_e4m3fn": 1979e12}
PEAKS_A100 = {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12}
# stas00/ml-engineering compute/accelerator README, "Maximum Achievable Matmul FLOPS": the
# best bf16 matmul found on A100 SXM, 267.9 TFLOP/s (85.9 % of 312).
A100_MAMF = 267.9e12
# The SM clock a 500 W limit allows against 700 W, for power-bound kernels: dynamic power
# ~ f V^2 with V ~ f, so f ~ (P - P0)^(1/3), with P0 = 100 W the board's power that does not
# scale with the SM clock (HBM, idle). ((500 - 100) / (700 - 100))^(1/3) = 0.874.
POWER_500W_CLOCK = ((500 - 100) / (700 - 100)) ** (1 / 3)

COMPUTE_CURVES = ("compute_efficiency", "attention_efficiency", "masked_attention_efficiency")


def run(shardscope, *args):
    """shardscope from the checkout's root: the paths given (and written into the fitted
    sources) are the checkout's own, the same in every clone."""
    r = subprocess.run([os.path.abspath(shardscope), *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"shardscope {' '.join(args)} failed:\n{r.stderr}{r.stdout}")
    return r.stdout


def sig(x, digits=6):
    """A float rounded to `digits` significant digits, so the files stay readable."""
    if x == 0 or not math.isfinite(x):
        return x
    return float(f"{x:.{digits}g}")


def rounded(j):
    if isinstance(j, float):
        return sig(j)
    if isinstance(j, list):
        return [rounded(x) for x in j]
    if isinstance(j, dict):
        return {k: rounded(v) for k, v in j.items()}
    return j


def fit_h200(shardscope, tmp):
    """calibrate --from-trace on every H200 run, the profiler's share per event fitted first
    on the Qwen3-8B selective-checkpointing run (host-bound) against its unprofiled steps."""
    data = os.path.relpath(DATA, ROOT)
    gqa = os.path.join(data, "h200-llama8b-4layers", "cluster-measured-gqa.json")
    q = os.path.join(data, "h200-qwen3-8b-4layers-sac")
    with open(os.path.join(ROOT, q, "unprofiled-steps.json")) as f:
        step_ms = statistics.median(json.load(f)["step_ms"])
    out = json.loads(run(shardscope, "calibrate", "--from-trace", os.path.join(q, "rank0.pt.trace.json.gz"),
                         "--cluster", gqa, "-o", os.path.join(tmp, "q.json"), "--json",
                         "-m", os.path.join(q, "config.json"), "-p", os.path.join(q, "plan.json"),
                         "--step-ms", repr(step_ms)))
    with open(os.path.join(ROOT, gqa)) as f:
        base = json.load(f)
    base["sim"]["profiler_ns_per_event"] = out["fitted"]["profiler_ns_per_event"]
    with open(os.path.join(tmp, "base.json"), "w") as f:
        json.dump(base, f)
    traces = sorted(os.path.relpath(os.path.join(d, "rank0.pt.trace.json.gz"), ROOT) for d, _, files in os.walk(DATA)
                    if "rank0.pt.trace.json.gz" in files and "/h200-" in d + "/")
    run(shardscope, "calibrate", "--from-trace", *traces, "--cluster", os.path.join(tmp, "base.json"),
        "-o", os.path.join(tmp, "h200.json"))
    with open(os.path.join(tmp, "h200.json")) as f:
        return json.load(f), traces


def to_datasheet(fit, peaks):
    """The fitted cluster's compute re-expressed against datasheet peaks: calibrate raises a
    peak to the fastest kernel; the efficiencies are scaled so every time is unchanged. The
    bandwidth stays the copy rate calibrate --measure measured, which the memory-bound
    efficiencies are fractions of."""
    sim = fit["sim"]
    fp = fit["device"]["peak_flops"]
    k = fp["bfloat16"] / peaks["bfloat16"]

    def scale(curve, f):
        return [[w, e * f] for w, e in curve]

    for c in COMPUTE_CURVES:
        if c in sim:
            sim[c] = scale(sim[c], k)
    for g in sim.get("gemm_efficiency_by_shape", []):
        g["efficiency"] *= fp.get(g.get("dtype", "bfloat16"), fp["bfloat16"]) / peaks.get(
            g.get("dtype", "bfloat16"), peaks["bfloat16"])
    return sim, k


def retime(curve, ceiling, s_rate, s_fixed):
    """A curve of (work, efficiency) re-timed: each bin's time on the measured device splits
    into work / ceiling (in units of its peak) and the rest; the derived device runs the first
    s_rate times as fast and the rest s_fixed times as fast. Efficiencies stay fractions of
    the same nominal peak."""
    out = []
    for w, e in curve:
        if e <= 0:
            out.append([w, e])
            continue
        t = 1.0 / e  # time in units of work / peak
        through = 1.0 / ceiling
        rest = max(0.0, t - through)
        out.append([w, 1.0 / (through / s_rate + rest / s_fixed)])
    return out


def derive(sim, *, compute_rate, compute_fixed, mem_rate, mem_fixed, compute_ceiling, mem_ceiling,
           compute_peak_ratio=1.0, mem_peak_ratio=1.0):
    """H200's tables for another GPU: compute kernels at compute_rate of H200's throughput
    (their fixed part at compute_fixed), memory-bound kernels at mem_rate (fixed: mem_fixed).
    Efficiencies become fractions of the derived GPU's own peaks: *_peak_ratio is H200's
    nominal peak (or bandwidth) over the derived GPU's."""
    sim = json.loads(json.dumps(sim))

    def compute(curve):
        return [[w, e * compute_peak_ratio] for w, e in retime(curve, compute_ceiling, compute_rate, compute_fixed)]

    def memory(curve):
        return [[w, min(1.0, e * mem_peak_ratio)] for w, e in retime(curve, mem_ceiling, mem_rate, mem_fixed)]

    for c in COMPUTE_CURVES:
        if c in sim:
            sim[c] = compute(sim[c])
    for g in sim.get("gemm_efficiency_by_shape", []):
        g["efficiency"] = compute([[0, g["efficiency"]]])[0][1]
    sim["memory_efficiency"] = memory([[0, sim["memory_efficiency"]]])[0][1]
    sim["memory_efficiency_by_bytes"] = memory(sim["memory_efficiency_by_bytes"])
    for op, curve in sim.get("memory_efficiency_by_op", {}).items():
        sim["memory_efficiency_by_op"][op] = memory(curve)
    return sim


def device_file(name, device, node, sim, sources, nccl, host=None):
    j = {"format": "shardscope.cluster", "version": 1, "name": name, "nodes": 1, "device": device,
         "node": node,
         "network": {"nic_bandwidth_bytes_per_s": 50e9, "latency_ns": 9600},
         "host": host or {"link_bandwidth_bytes_per_s": 54.8e9},
         "sim": sim, "nccl": nccl, "sources": sources}
    return rounded(j)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shardscope", default=os.path.join(ROOT, "build", "engine", "shardscope"))
    ap.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    fit, traces = fit_h200(a.shardscope, tmp)
    sim, k = to_datasheet(fit, PEAKS_HOPPER)
    hbm = fit["device"]["hbm_bandwidth_bytes_per_s"]  # H200's measured copy rate
    fitted_sources = {p: s for p, s in fit.get("sources", {}).items() if p.startswith("/sim/")}
    # Ceilings: the fraction of the nominal peak the largest kernels reach on the H200.
    compute_ceiling = max(e for w, e in sim["compute_efficiency"] if w >= 1e11)
    mem_ceiling = max(e for w, e in sim["memory_efficiency_by_bytes"] if w >= 1e8)
    # Collectives are NCCL's model (the nccl section), and so is what they take from the
    # compute beside them (the SM and HBM shares its CTAs and copies hold).
    for key in ("protocols", "intra_efficiency", "network_efficiency", "overlap_slowdown"):
        sim.pop(key, None)
    sim.pop("profiler_ns_per_event", None)  # a profile describes a run without the profiler
    hopper_node = {"devices_per_node": 8, "intra_bandwidth_bytes_per_s": 450e9, "intra_latency_ns": 3400}
    hopper_nccl = {"version": "2.28.9", "compute_capability": 90, "nvlinks": 18, "nvls": True,
                   "nics_per_node": 8, "gpu_nic_bandwidth_bytes_per_s": 48e9, "cpu_vendor": "intel"}
    measured = ("calibrate --from-trace on the fifteen H200 FSDP runs of tests/data (" + ", ".join(
        sorted({t.split("/")[2] for t in traces})) + "), the profiler's host share per event fitted on "
        "h200-qwen3-8b-4layers-sac against its steps timed without the profiler; re-expressed against "
        f"the datasheet peak (the largest GEMMs ran at {k * 989:.0f} TFLOP/s bf16, {k:.3f} of 989)")
    files = {}
    files["h200-sxm.json"] = device_file(
        "NVIDIA H200 SXM 141GB, one node of 8 (NVSwitch)",
        {"name": "NVIDIA H200 SXM 141GB", "kind": "gpu", "memory_bytes": fit["device"]["memory_bytes"],
         "peak_flops": PEAKS_HOPPER, "hbm_bandwidth_bytes_per_s": hbm},
        hopper_node, sim,
        {"/sim": measured, **{p: "H200 runs: " + s for p, s in fitted_sources.items()},
         "/device/memory_bytes": "torch.cuda.get_device_properties(0).total_memory on the lent H200",
         "/device/peak_flops": "dense tensor-core peaks, NVIDIA H200 datasheet",
         "/device/hbm_bandwidth_bytes_per_s": "the device-to-device copy rate calibrate --measure measured on "
                                              "the lent H200 (the datasheet says 4.8 TB/s HBM3e); the memory-bound "
                                              "efficiencies are fractions of it",
         "/node": "HGX H200: 18 NVLink 4 links per GPU, 900 GB/s bidirectional"},
        hopper_nccl)
    h100 = derive(sim, compute_rate=1, compute_fixed=1, mem_rate=3.35 / 4.8, mem_fixed=1,
                  compute_ceiling=compute_ceiling, mem_ceiling=mem_ceiling, mem_peak_ratio=hbm / 3.35e12)
    files["h100-sxm-80gb.json"] = device_file(
        "NVIDIA H100 SXM 80GB, one node of 8 (NVSwitch)",
        {"name": "NVIDIA H100 SXM5 80GB", "kind": "gpu", "memory_bytes": 85520809984,
         "peak_flops": PEAKS_HOPPER, "hbm_bandwidth_bytes_per_s": 3.35e12},
        hopper_node, h100,
        {"/sim": "derived from h200-sxm.json (" + measured + "): the same GH100 die at the same 700 W, so the "
                 "GEMM and attention tables are H200's; memory-bound kernels re-timed for 3.35 TB/s HBM3 "
                 f"(each bin's time: bytes at {mem_ceiling:.3f} of the bandwidth, which the largest kernels reach "
                 "on the H200, runs at 3.35/4.8 of H200's rate; the rest of its time is kept); "
                 "scripts/derive_profiles.py",
         "/device/memory_bytes": "81,559 MiB as nvidia-smi reports for H100 SXM5 80GB",
         "/device/peak_flops": "dense tensor-core peaks, NVIDIA H100 datasheet",
         "/device/hbm_bandwidth_bytes_per_s": "3.35 TB/s HBM3, NVIDIA H100 SXM datasheet",
         "/node": "HGX H100: 18 NVLink 4 links per GPU, 900 GB/s bidirectional"},
        hopper_nccl)
    r = POWER_500W_CLOCK
    gt = derive(sim, compute_rate=r, compute_fixed=r, mem_rate=2.4 / 4.8, mem_fixed=r,
                compute_ceiling=compute_ceiling, mem_ceiling=mem_ceiling, mem_peak_ratio=hbm / 2.4e12)
    files["h100-96gb-hbm2e-500w.json"] = device_file(
        "NVIDIA H100 96GB HBM2e at 500 W (Meta Grand Teton), one node of 8",
        {"name": "NVIDIA H100 96GB HBM2e (500 W)", "kind": "gpu", "memory_bytes": 102047993456,
         "peak_flops": PEAKS_HOPPER, "hbm_bandwidth_bytes_per_s": 2.4e12},
        hopper_node, gt,
        {"/sim": "derived from h200-sxm.json (" + measured + f"): the GH100 die at a 500 W power limit: compute "
                 f"kernels at {r:.3f} of H200's rate (the SM clock 500 W allows against 700 W: dynamic power ~ f^3, "
                 "100 W of the board's power not scaling with the clock, ((500-100)/(700-100))^(1/3); an "
                 "assumption, not a measurement: no published GEMM rate at 500 W was found), their fixed part "
                 "too; memory-bound kernels at 2.4/4.8 of H200's bandwidth, their fixed part at the lower "
                 "clock; scripts/derive_profiles.py",
         "/device/memory_bytes": "95.0396 GiB, the device memory torchtitan PR #165 reports its percentages against",
         "/device/peak_flops": "dense tensor-core peaks, NVIDIA H100 datasheet (the power limit enters through /sim)",
         "/device/hbm_bandwidth_bytes_per_s": "\"Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak "
                                              "memory bandwidth\" (torchtitan benchmarks/llama3_h100_202412_torchtitan.md)",
         "/node": "Grand Teton: \"8 NVIDIA H100 GPUs fully connected with NVLink\""},
        hopper_nccl)
    a100_rate = A100_MAMF / (compute_ceiling * PEAKS_HOPPER["bfloat16"])
    ampere_node = {"devices_per_node": 8, "intra_bandwidth_bytes_per_s": 300e9, "intra_latency_ns": 3400}
    ampere_nccl = {"version": "2.28.9", "compute_capability": 80, "nvlinks": 12, "nvls": False,
                   "nics_per_node": 8, "gpu_nic_bandwidth_bytes_per_s": 24e9, "cpu_vendor": "amd"}
    for mem_gb, memory_bytes, bw, hbm_text in [
            (80, 85198045184, 2.039e12, "2,039 GB/s HBM2e, NVIDIA A100 80GB SXM datasheet"),
            (40, 42505273344, 1.555e12, "1,555 GB/s HBM2, NVIDIA A100 40GB SXM datasheet")]:
        a100 = derive(sim, compute_rate=a100_rate, compute_fixed=1, mem_rate=bw / 4.8e12, mem_fixed=1,
                      compute_ceiling=compute_ceiling, mem_ceiling=mem_ceiling,
                      compute_peak_ratio=PEAKS_HOPPER["bfloat16"] / PEAKS_A100["bfloat16"],
                      mem_peak_ratio=hbm / bw)
        files[f"a100-sxm-{mem_gb}gb.json"] = device_file(
            f"NVIDIA A100 SXM4 {mem_gb}GB, one node of 8 (NVSwitch)",
            {"name": f"NVIDIA A100 SXM4 {mem_gb}GB", "kind": "gpu", "memory_bytes": memory_bytes,
             "peak_flops": PEAKS_A100, "hbm_bandwidth_bytes_per_s": bw},
            ampere_node, a100,
            {"/sim": "derived from h200-sxm.json (" + measured + "): no A100 trace we hold records shapes, so "
                     f"GEMM and attention kernels run at {a100_rate:.3f} of H200's rate (A100's best bf16 matmul, "
                     f"267.9 TFLOP/s, stas00/ml-engineering's MAMF table, against the H200's {compute_ceiling * 989:.0f}), "
                     f"their fixed part kept; memory-bound kernels at {bw / 1e12:.3f}/4.8 of H200's bandwidth; "
                     "scripts/derive_profiles.py",
             "/device/memory_bytes": f"{memory_bytes / 2**30:.2f} GiB, the total capacity PyTorch's out-of-memory "
                                     f"message reports on an A100 {mem_gb}GB",
             "/device/peak_flops": "dense tensor-core peaks, NVIDIA A100 datasheet",
             "/device/hbm_bandwidth_bytes_per_s": hbm_text,
             "/node": "HGX A100: 12 NVLink 3 links per GPU, 600 GB/s bidirectional"},
            ampere_nccl, host={"link_bandwidth_bytes_per_s": 25e9})
    bad = []
    for name, j in files.items():
        path = os.path.join(CLUSTERS, name)
        text = json.dumps(j, indent=2) + "\n"
        if a.check:
            old = open(path).read() if os.path.exists(path) else ""
            if old != text:
                bad.append(name)
            continue
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path, ROOT)}")
    if bad:
        print("differs from what scripts/derive_profiles.py derives: " + ", ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
