#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The kernel-level fidelity table: how well a calibrated cluster predicts kernels it never saw.

    scripts/kernel_fidelity.py [--traces ../shared/data/traces] [--no-cpu]

For every real profiler trace we hold (../shared/data/traces: A100, V100, B200, MI250) and
a CPU training loop recorded here with torch.profiler, runs

    shardscope calibrate --from-trace TRACE --cluster BASE --output FITTED --json

which fits on alternate ProfilerSteps (or alternate occurrences of each kernel when the trace
has none) and predicts the held-back kernels with the base cluster and the fitted one. Prints
one row per trace and kernel class: held-back kernels, their measured total, the total's
error and the median per-kernel |error|, before and after. What a trace cannot price (no
record_shapes, convolutions, broadcasts) is named under it.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.environ.get("SHARDSCOPE_BIN", os.path.join(ROOT, "build", "engine", "shardscope"))

# (trace, base cluster, what ran): the base is the nearest sample cluster to the GPU.
GPU_TRACES = [
    ("HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz", "a100-80gb-8x8.json",
     "A100, 2 ranks, ResNet-style training (no record_shapes)"),
    ("HolisticTraceAnalysis/tests/data/df_index_resolver/df_index_resolver.json.gz", "a100-80gb-8x8.json",
     "V100, 2 ranks (no record_shapes, NCCL without size args)"),
    ("TraceLens/tests/traces/b200/eager_trace.json.gz", "h200-8x8.json",
     "B200, vLLM eager inference, bf16/fp8 (base: H200, no B200 sample)"),
    ("kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
     "a100-80gb-8x8.json", "V100, ResNet-50 training, 2021 legacy dialect"),
    ("HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
     "a100-80gb-8x8.json", "MI250, a toy model, one step"),
]

CPU_LOOP = r"""
import sys, torch
from torch.profiler import profile, ProfilerActivity, schedule
torch.manual_seed(0); torch.set_num_threads(2)
m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024),
                        torch.nn.LayerNorm(1024))
opt = torch.optim.AdamW(m.parameters())
x = torch.randn(512, 1024)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
             schedule=schedule(wait=0, warmup=1, active=6, repeat=1),
             on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as p:
    for _ in range(7):
        m(x).square().mean().backward(); opt.step(); opt.zero_grad(); p.step()
"""


def calibrate(trace, cluster, tmp):
    out = os.path.join(tmp, "fitted.json")
    r = subprocess.run([BIN, "calibrate", "--from-trace", trace, "-c", cluster, "-o", out, "--json"],
                       capture_output=True, text=True)
    try:
        return r.returncode, json.loads(r.stdout), r.stderr
    except json.JSONDecodeError:
        return r.returncode, None, r.stderr


def pct(v):
    return f"{100 * v:+.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=os.path.join(ROOT, "..", "shared", "data", "traces"),
                    help="folder of the real traces [../shared/data/traces]")
    ap.add_argument("--no-cpu", action="store_true", help="skip recording the CPU loop")
    a = ap.parse_args()
    if not os.path.exists(BIN):
        sys.exit(f"error: {BIN} is not built (cmake --build build)")
    tmp = tempfile.mkdtemp(prefix="shardscope-kfid-")
    rows = []
    # The H200 traces this repository holds (tests/data), each against the H200 sample.
    ours = [(os.path.join(ROOT, "tests", "data", "h200-llama8b-4layers", sub, "rank0.pt.trace.json.gz"),
             "h200-8x8.json", "H200, FSDP2 Llama-3.1-8B with 4 layers, one rank, " + what)
            for sub, what in (("", "1 x 4096"), ("seq8192", "1 x 8192"), ("ac-2x4096", "full AC, 2 x 4096"),
                              ("sac-2x4096", "selective AC, 2 x 4096"), ("sac-1x8192", "selective AC, 1 x 8192"),
                              ("attn-2x4096", "attention-only AC, 2 x 4096"),
                              ("attn-2x8192", "attention-only AC, 2 x 8192"),
                              ("fsdp1", "FSDP1, 1 x 4096"), ("fsdp1-flat", "FSDP1 flat, 1 x 4096"))]
    for rel, cluster, what in GPU_TRACES + ours:
        path = os.path.join(a.traces, rel)
        if not os.path.exists(path):
            print(f"skipped {rel}: not at {a.traces}", file=sys.stderr)
            continue
        rows.append((rel, what, *calibrate(path, os.path.join(ROOT, "samples", "clusters", cluster), tmp)))
    if not a.no_cpu:
        trace = os.path.join(tmp, "cpu.pt.trace.json")
        r = subprocess.run([sys.executable, "-c", CPU_LOOP, trace], capture_output=True, text=True)
        if r.returncode == 0:
            rows.append(("CPU loop recorded here", "2-layer MLP + LayerNorm, AdamW, 512x1024 fp32, 6 steps",
                         *calibrate(trace, os.path.join(ROOT, "samples", "clusters", "cpu-2core.json"), tmp)))
        else:
            print(f"skipped the CPU loop: {r.stderr.strip()[-300:]}", file=sys.stderr)
    print("| trace | class | fitted / held back | held-back measured | before: total, median abs | "
          "after: total, median abs |")
    print("|---|---|---|---|---|---|")
    for name, what, rc, res, err in rows:
        if res is None:
            lines = [l for l in err.splitlines() if l.startswith("error:")]
            msg = lines[-1] if lines else f"exit {rc}"
            print(f"| {name} ({what}) | - | - | - | {msg} | |")
            continue
        first = True
        for c in res["classes"]:
            label = f"{name} ({what})" if first else ""
            first = False
            held = f"{c['fitted']} / {c['held_out']}"
            meas = f"{c['held_out_measured_ns'] / 1e6:.3f} ms"
            if not c["priced"]:
                print(f"| {label} | {c['class']} | {held} | {meas} | not priced | |")
                continue
            if not c["held_out"]:
                print(f"| {label} | {c['class']} | {held} | - | - | - |")
                continue
            b, f = c["before"], c["after"]
            print(f"| {label} | {c['class']} | {held} | {meas} | {pct(b['total_error'])}, "
                  f"{100 * b['median_abs_error']:.1f}% | {pct(f['total_error'])}, {100 * f['median_abs_error']:.1f}% |")
        if res.get("skipped"):
            print(f"| | not priced: " + "; ".join(f"{n} {w}" for w, n in sorted(res["skipped"].items())) +
                  " | | | | |")


if __name__ == "__main__":
    main()
