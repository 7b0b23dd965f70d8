#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Step-time fidelity on real GPU runs: the simulator against every GPU trace we hold whose
run we can describe (model, plan, batch, sequence: tests/data/h200-*).

For each run it prints the measured step (the device time of a ProfilerStep: the span of
the work it launched) and the GPU's time per kernel class (GEMM, attention, memory-bound:
the trace's kernels by name, a middle step; memory-bound includes FSDP2's casts and copies
(device-to-device memcpys), memsets and AdamW's step), against `shardscope simulate`:

  before  with the cluster `calibrate --measure` wrote on that machine
  after   with that cluster calibrated on the trace's own kernels (`calibrate --from-trace`,
          which fits on ProfilerSteps 1 and 3 and holds back step 2)

and, where the run also timed steps without the profiler (unprofiled-steps.json, the median),
the simulated step against those: the step a user runs. The launch rates `calibrate` reads
off a trace are the profiled run's (the profiler records each op, annotation and CUDA call
on the host), so the "after" step is simulated twice: at the trace's pace against the traced
step, and with the profiler's share taken out against the unprofiled step. That share, the
host time per recorded event (profiler_ns_per_event), is fitted once, on one host-bound run
(Qwen3-8B under selective checkpointing, `calibrate --from-trace --step-ms`), and used for
every run; on that run's own row the unprofiled column is a fit, not a prediction.

    python scripts/step_fidelity.py            # the table (markdown)
    python scripts/step_fidelity.py --json     # the figures

The CPU runs' table is scripts/bench_sim_vs_measured.py's.
"""
import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.environ.get("SHARDSCOPE_BIN", os.path.join(ROOT, "build", "engine", "shardscope"))
DATA = os.path.join(ROOT, "tests", "data")
CLUSTER = os.path.join(DATA, "h200-llama8b-4layers", "cluster-measured.json")
# The run the profiler's host time per event is fitted on (its unprofiled steps, --step-ms).
PROFILER_FIT_RUN = "h200-qwen3-8b-4layers-sac"

# (folder under tests/data, model config (None: the folder's config.json), what ran)
RUNS = [
    ("h200-llama8b-4layers", None, "Llama-3.1-8B, 4 layers, 1 x 4096"),
    ("h200-llama8b-4layers/seq8192", "h200-llama8b-4layers/config.json", "Llama-3.1-8B, 4 layers, 1 x 8192"),
    ("h200-llama8b-4layers/ac-2x4096", "h200-llama8b-4layers/config.json",
     "Llama-3.1-8B, 4 layers, full AC, no reshard, 2 x 4096"),
    ("h200-llama8b-4layers/sac-2x4096", "h200-llama8b-4layers/config.json",
     "Llama-3.1-8B, 4 layers, op-level selective AC (torchtitan's preset), no reshard, 2 x 4096"),
    ("h200-llama8b-4layers/fsdp1", "h200-llama8b-4layers/config.json", "Llama-3.1-8B, 4 layers, FSDP1, 1 x 4096"),
    ("h200-llama8b-4layers/attn-2x4096", "h200-llama8b-4layers/config.json",
     "Llama-3.1-8B, 4 layers, attention-only AC, no reshard, 2 x 4096"),
    ("h200-llama8b-4layers/attn-2x8192", "h200-llama8b-4layers/config.json",
     "Llama-3.1-8B, 4 layers, attention-only AC, 2 x 8192"),
    ("h200-mistral7b-4layers", None, "Mistral-7B, 4 layers, 1 x 8192 (sliding window 4096)"),
    ("h200-qwen3-8b-4layers-sac", None, "Qwen3-8B, 4 layers, selective AC, 1 x 4096"),
    ("h200-qwen3-8b-4layers", None, "Qwen3-8B, 4 layers, no AC, no reshard, 2 x 4096"),
    ("h200-llama8b-4layers/seq1024", "h200-llama8b-4layers/config.json", "Llama-3.1-8B, 4 layers, 1 x 1024"),
    ("h200-llama70b-2layers", None, "Llama-3.1-70B widths, 2 layers, 1 x 4096"),
    ("h200-llama70b-2layers/attn-1x8192", "h200-llama70b-2layers/config.json",
     "Llama-3.1-70B widths, 2 layers, attention-only AC, no reshard, 1 x 8192"),
]


def kernel_class(name):
    n = name.lower()
    if any(s in n for s in ("flash", "fmha", "attention", "sdpa", "cudnn::fusion", "dot_do_o", "dq_to_16")):
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas")):
        return "gemm"
    return "memory_bound"


def measured(trace):
    """Per-class kernel time (ms) and the device span (ms) of the middle ProfilerStep."""
    with gzip.open(trace, "rt") as f:
        ev = json.load(f)["traceEvents"]
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "user_annotation"
                   and e.get("name", "").startswith("ProfilerStep#"))
    s0, s1 = steps[len(steps) // 2]
    launched = {e["args"]["correlation"] for e in ev if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {}) and s0 <= e["ts"] < s1}
    dev = [e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
           and e.get("args", {}).get("correlation") in launched]
    by = {"gemm": 0.0, "attention": 0.0, "memory_bound": 0.0}
    for e in dev:
        # Copies and fills are memory-bound work too: FSDP2's copy into the unsharded
        # parameters and the gradients' copy after the reduce run as device-to-device
        # memcpys, and the simulated column counts FSDP's copy ops.
        by[kernel_class(e["name"]) if e.get("cat") == "kernel" else "memory_bound"] += e["dur"] / 1e3
    span = (max(e["ts"] + e["dur"] for e in dev) - min(e["ts"] for e in dev)) / 1e3
    return span, by


def unprofiled_ms(d):
    """The median of a run's steps timed without the profiler, or None where none were."""
    path = os.path.join(d, "unprofiled-steps.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return statistics.median(json.load(f)["step_ms"])


def shardscope(*args):
    r = subprocess.run([BIN, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"error: shardscope {' '.join(args)}:\n{r.stderr}")
    return json.loads(r.stdout)


def simulated(model, plan, cluster, tmp):
    """Step time and per-class device time: the compute ops' and the optimizer's kernels
    (its foreach kernels are in the step program's kernel lists on a GPU), and, as
    memory-bound, also FSDP2's copies (casts, chunk-cat) and its reduce over a group of one
    (a device copy), which are ops of their own in the step program but memory-bound work on
    the GPU."""
    trace = os.path.join(tmp, "sim.json")
    s = shardscope("simulate", "-m", model, "-p", plan, "-c", cluster, "--json", "--trace", trace)
    k = s["kernels"]
    by = {c: k[c]["device_ns"] / 1e6 for c in ("gemm", "attention", "memory_bound")}
    with open(trace) as f:
        for e in json.load(f)["traceEvents"]:
            a = e.get("args", {})
            # FSDP's copies, and a collective over a group of one: a device-to-device copy
            # (the trace's Memcpy DtoD on the reduce-scatter stream), no NCCL kernel.
            if e.get("ph") == "X" and (a.get("kind") in ("copy_in", "copy_out", "rs_copy_in")
                                       or (a.get("group_size") == 1 and a.get("bytes"))):
                by["memory_bound"] += e["dur"] / 1e3
    return s["step_time_ns"] / 1e6, by


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--cluster", default=CLUSTER,
                    help="the 'before' cluster (default: calibrate --measure's on the H200, the first; "
                         "tests/data/h200-llama8b-4layers/cluster-remeasured.json is the second, with "
                         "attention FLOPs counted as torch.utils.flop_counter counts them)")
    a = ap.parse_args()
    if not os.path.exists(BIN):
        sys.exit(f"error: {BIN} is not built (bash scripts/setup.sh build)")
    tmp = tempfile.mkdtemp(prefix="shardscope-stepfid-")
    # The profiler's host time per recorded event, fitted on one host-bound run, and a copy of
    # the base cluster that carries it (calibrate takes it out of the launch rates it reads).
    d = os.path.join(DATA, PROFILER_FIT_RUN)
    pf = shardscope("calibrate", "--from-trace", os.path.join(d, "rank0.pt.trace.json.gz"), "-c", a.cluster,
                    "-o", os.path.join(tmp, "profiler-fit.json"), "--json", "-m", os.path.join(d, "config.json"),
                    "-p", os.path.join(d, "plan.json"), "--step-ms", str(unprofiled_ms(d)))
    ns_per_event = pf["fitted"]["profiler_ns_per_event"]
    with open(a.cluster) as f:
        base = json.load(f)
    base["sim"]["profiler_ns_per_event"] = ns_per_event
    unprofiled_base = os.path.join(tmp, "base-unprofiled.json")
    with open(unprofiled_base, "w") as f:
        json.dump(base, f)
    rows = []
    for folder, model, what in RUNS:
        d = os.path.join(DATA, folder)
        trace = os.path.join(d, "rank0.pt.trace.json.gz")
        model = os.path.join(DATA, model) if model else os.path.join(d, "config.json")
        plan = os.path.join(d, "plan.json")
        span, meas = measured(trace)
        before = simulated(model, plan, a.cluster, tmp)
        fitted = os.path.join(tmp, folder.replace("/", "_") + ".json")
        # The model and plan that ran size the optimizer's foreach kernels (the trace does not).
        shardscope("calibrate", "--from-trace", trace, "-c", a.cluster, "-o", fitted, "--json",
                   "-m", model, "-p", plan)
        after = simulated(model, plan, fitted, tmp)
        # The same fit with the profiler's share taken out of the launch rates: the step a
        # user runs without the profiler.
        fitted_unprofiled = fitted.replace(".json", ".unprofiled.json")
        shardscope("calibrate", "--from-trace", trace, "-c", unprofiled_base, "-o", fitted_unprofiled,
                   "--json", "-m", model, "-p", plan)
        after_unprofiled = simulated(model, plan, fitted_unprofiled, tmp)
        # The same job's steps timed without the profiler, where the run recorded them: the
        # step a user runs (record_shapes and profile_memory slow the host; on the host-bound
        # 1 x 1024 run the traced step is 20 % longer).
        unprofiled = unprofiled_ms(d)
        rows.append({"run": what, "measured_step_ms": span, "unprofiled_step_ms": unprofiled,
                     "measured_ms": meas,
                     "before": {"step_ms": before[0], "ms": before[1]},
                     "after": {"step_ms": after[0], "ms": after[1],
                               "unprofiled_step_ms": after_unprofiled[0]},
                     "profiler_fit_run": folder == PROFILER_FIT_RUN})
    if a.json:
        print(json.dumps({"profiler_ns_per_event": ns_per_event, "profiler_fit_run": PROFILER_FIT_RUN,
                          "runs": rows}, indent=1))
        return
    print(f"The profiler's host time per recorded event: {ns_per_event / 1e3:.2f} us, fitted on "
          f"{PROFILER_FIT_RUN} (*).\n")
    pct = lambda p, m: f"{100 * (p / m - 1):+.1f}%" if m else "-"  # noqa: E731
    print("| run | | step | GEMM | attention | memory-bound | step without the profiler |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        m, u = r["measured_ms"], r["unprofiled_step_ms"]
        print(f"| {r['run']} | measured | {r['measured_step_ms']:.1f} ms | {m['gemm']:.1f} ms | "
              f"{m['attention']:.1f} ms | {m['memory_bound']:.1f} ms | "
              + (f"{u:.1f} ms |" if u else "not recorded |"))
        for when in ("before", "after"):
            p = r[when]
            # Without the profiler: "after" takes the profiler's share out of the launch
            # rates; "before" has no rates read off a trace.
            up = p.get("unprofiled_step_ms", p["step_ms"])
            star = " (*)" if when == "after" and r["profiler_fit_run"] else ""
            print(f"| | {when} | {p['step_ms']:.1f} ms ({pct(p['step_ms'], r['measured_step_ms'])}) | "
                  + " | ".join(f"{p['ms'][c]:.1f} ms ({pct(p['ms'][c], m[c])})"
                               for c in ("gemm", "attention", "memory_bound"))
                  + (f" | {up:.1f} ms ({pct(up, u)}){star} |" if u else " | |"))


if __name__ == "__main__":
    main()
