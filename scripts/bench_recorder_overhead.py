# SPDX-License-Identifier: Apache-2.0
"""Benchmark: what recording costs a run (op ranges and every CPU allocation).

Alternates `shardscope run` with and without `--no-record` on the same model and plan
(default: the tiny Llama on 2 CPU ranks) and prints each pair's step times and the
recorder's overhead, (recorded - unrecorded) / unrecorded of the slowest rank's mean step.
Pairs run back to back because the machine's speed drifts. On a shared machine the pairs
spread over +-10% and more, so the recorder's own work is also timed directly: its cost per
allocation and per op (`shardscope-engine recorder-cost`) times the allocations and ops a
rank handles in a measured step, against the step time.

  python scripts/bench_recorder_overhead.py [--pairs N] [--steps S] [--seq S]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(bin_, model, plan, steps, seq, record):
    cmd = [bin_, "run", "-m", model, "-p", plan, "--steps", str(steps), "--warmup", "1", "--seq", str(seq), "--json"]
    if not record:
        cmd.append("--no-record")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("error: %s failed:\n%s" % (" ".join(cmd), r.stderr))
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/engine/shardscope"))
    ap.add_argument("--model", default=os.path.join(ROOT, "samples/models/tiny-llama/config.json"))
    ap.add_argument("--plan", default=os.path.join(ROOT, "samples/plans/tiny-llama-2rank.json"))
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seq", type=int, default=128)
    a = ap.parse_args()
    print("%s, %s: %d pairs of %d measured steps, recorded against --no-record"
          % (os.path.relpath(a.model, ROOT), os.path.relpath(a.plan, ROOT), a.pairs, a.steps), flush=True)
    overheads, recorded = [], None
    for i in range(a.pairs):
        # Alternate which runs first so drift does not favour one side.
        order = [True, False] if i % 2 == 0 else [False, True]
        out = {rec: run(a.bin, a.model, a.plan, a.steps, a.seq, rec) for rec in order}
        recorded = out[True]
        t = {rec: o["step_time_ns"] for rec, o in out.items()}
        overheads.append((t[True] - t[False]) / t[False])
        print("pair %d: recorded %.2f ms, not recorded %.2f ms, overhead %+.1f%%"
              % (i + 1, t[True] / 1e6, t[False] / 1e6, 100 * overheads[-1]), flush=True)
    print("\nrecorder overhead (median of %d pairs): %+.1f%% of step time (spread %+.1f%% to %+.1f%%)"
          % (len(overheads), 100 * statistics.median(overheads), 100 * min(overheads), 100 * max(overheads)))

    # The pairs cannot resolve a few percent on a shared machine; the recorder's own work can
    # be timed: per allocation and per op (shardscope-engine recorder-cost), times how many
    # of each a rank handles in a measured step.
    engine = os.path.join(os.path.dirname(a.bin), "shardscope-engine")
    r = subprocess.run([engine, "recorder-cost"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("error: %s recorder-cost failed:\n%s" % (engine, r.stderr))
    cost = json.loads(r.stdout)
    worst = 0.0
    for rank in recorded["ranks"]:
        allocs, ops = rank["allocations_per_step"], rank["recorded_ops_per_step"]
        ns = allocs * cost["allocation_overhead_ns"] + ops * cost["op_ns"]
        share = ns / rank["step_time_ns"]
        worst = max(worst, share)
        print("rank %d: %.0f allocations x %.0f ns + %.0f ops x %.0f ns = %.1f us per step = %.3f%% of %.2f ms"
              % (rank["rank"], allocs, cost["allocation_overhead_ns"], ops, cost["op_ns"], ns / 1e3, 100 * share,
                 rank["step_time_ns"] / 1e6))
    print("recorder overhead, timed directly: %.3f%% of step time at most (goal < 2%%)" % (100 * worst))


if __name__ == "__main__":
    main()
