# SPDX-License-Identifier: Apache-2.0
"""The demo's predicted-against-measured report for the plans it ran for real.

    python scripts/demo_report.py OUT_DIR NAME [NAME...]

For each NAME, OUT_DIR holds what the demo's earlier stages wrote:
  NAME.run.json             `shardscope run --output`: measured (and predicted, with --cluster)
  NAME.measured-trace.json  `shardscope run --trace`: every rank's ops, steps and memory
  NAME.sim.json             `shardscope simulate --json`: the prediction
  NAME.sim-trace.json       `shardscope simulate --trace`
Writes OUT_DIR/comparison.md, OUT_DIR/comparison.json and OUT_DIR/memory-timeline.png (the
measured and simulated memory of every plan) and prints the table. Every number comes from
those files; tests/python/test_demo_e2e.py recomputes them from the traces.
"""
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as e:
        sys.exit("error: %s: %s (run the demo's earlier stages first)" % (path, e.strerror))
    except ValueError as e:
        sys.exit("error: %s: not valid JSON: %s" % (path, e))


def counter(trace, rank=None):
    """The "memory (bytes)" counter of one rank (or all): [(t_ns, allocated)] sorted.
    ShardScope traces write pid = rank + metadata.rank_pid_offset."""
    pid = None if rank is None else rank + trace.get("metadata", {}).get("rank_pid_offset", 0)
    pts = [(round(e["ts"] * 1000), e["args"]["allocated"]) for e in trace["traceEvents"]
           if e.get("ph") == "C" and e.get("name") == "memory (bytes)" and (pid is None or e.get("pid") == pid)]
    return sorted(pts)


def err(pred, meas):
    return (pred - meas) / meas if meas else None


def pct(x):
    return "-" if x is None else "%+.1f%%" % (100 * x)


def write_atomically(path, data, mode="w"):
    tmp = path + ".tmp"
    with open(tmp, mode) as f:
        f.write(data)
    os.replace(tmp, path)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, names = sys.argv[1], sys.argv[2:]
    rows = []
    for name in names:
        run = load(os.path.join(out, name + ".run.json"))
        sim = load(os.path.join(out, name + ".sim.json"))
        rows.append({
            "name": name,
            "plan": run["plan"],
            "world_size": run["world_size"],
            "micro_batch_size": run["micro_batch_size"],
            "seq_len": run["seq_len"],
            "measured_steps": run["steps"],
            "cluster": sim["cluster"],
            "predicted_step_time_ns": sim["step_time_ns"],
            "measured_step_time_ns": run["step_time_ns"],
            "step_time_error": err(sim["step_time_ns"], run["step_time_ns"]),
            "predicted_peak_allocated_bytes": sim["peak_allocated_bytes"],
            "measured_peak_allocated_bytes": run["peak_allocated_bytes"],
            "peak_allocated_error": err(sim["peak_allocated_bytes"], run["peak_allocated_bytes"]),
            "predicted_exposed_comm_ns": sim["exposed_comm_ns"],
            "measured_exposed_comm_ns": run["exposed_comm_ns"],
            "losses": run["losses"],
            "op_order_matches_program": run["op_order_matches_program"],
        })
    report = {"format": "shardscope.demo_report", "version": 1, "plans": rows}

    head = "| plan | step time predicted | measured | error | peak allocated predicted | measured | error | exposed comm predicted | measured |"
    lines = ["# Predicted against measured", "",
             "Simulated on `%s`; measured with `shardscope run` (%d CPU ranks, Gloo), %d measured steps, "
             "micro-batch %d x %d. Step time: the slowest rank's mean; peak allocated: the CPU allocator's "
             "peak on any rank; exposed communication: collective time no compute overlapped on rank 0's "
             "last step." % (rows[0]["cluster"], rows[0]["world_size"], rows[0]["measured_steps"],
                             rows[0]["micro_batch_size"], rows[0]["seq_len"]), "",
             head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append("| %s | %.2f ms | %.2f ms | %s | %.1f MiB | %.1f MiB | %s | %.2f ms | %.2f ms |" % (
            r["name"], r["predicted_step_time_ns"] / 1e6, r["measured_step_time_ns"] / 1e6, pct(r["step_time_error"]),
            r["predicted_peak_allocated_bytes"] / 2**20, r["measured_peak_allocated_bytes"] / 2**20,
            pct(r["peak_allocated_error"]), r["predicted_exposed_comm_ns"] / 1e6, r["measured_exposed_comm_ns"] / 1e6))
    if len(rows) == 2:
        a, b = rows
        dm = b["measured_peak_allocated_bytes"] - a["measured_peak_allocated_bytes"]
        dp = b["predicted_peak_allocated_bytes"] - a["predicted_peak_allocated_bytes"]
        lines += ["", "%s against %s: peak allocated %+.1f MiB measured, %+.1f MiB predicted; step time %+.2f ms "
                  "measured, %+.2f ms predicted." % (b["name"], a["name"], dm / 2**20, dp / 2**20,
                                                     (b["measured_step_time_ns"] - a["measured_step_time_ns"]) / 1e6,
                                                     (b["predicted_step_time_ns"] - a["predicted_step_time_ns"]) / 1e6)]
    lines += ["", "Recorded op order equals the step program's: " +
              ", ".join("%s %s" % (r["name"], "yes" if r["op_order_matches_program"] else "NO") for r in rows), ""]
    md = "\n".join(lines)
    write_atomically(os.path.join(out, "comparison.md"), md)
    write_atomically(os.path.join(out, "comparison.json"), json.dumps(report, indent=2) + "\n")
    print(md)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharey=True)
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for i, name in enumerate(names):
        meas = counter(load(os.path.join(out, name + ".measured-trace.json")), rank=0)
        sim = counter(load(os.path.join(out, name + ".sim-trace.json")))
        for ax, pts in ((top, meas), (bottom, sim)):
            if not pts:
                continue
            t0 = pts[0][0]
            ax.step([(t - t0) / 1e6 for t, _ in pts], [b / 2**20 for _, b in pts], where="post",
                    color=colours[i % len(colours)], label=name, linewidth=1.2)
    top.set_title("measured: CPU allocator, rank 0, %d steps" % rows[0]["measured_steps"])
    # The cluster's name can be long (a calibrated profile says what it was fitted to):
    # wrapped, so the title stays inside the figure.
    import textwrap
    bottom.set_title("\n".join(textwrap.wrap("simulated: one step on %s" % rows[0]["cluster"], 100)),
                     fontsize=10)
    for ax in (top, bottom):
        ax.set_xlabel("ms")
        ax.set_ylabel("allocated (MiB)")
        ax.legend(loc="lower right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    png = os.path.join(out, "memory-timeline.png")
    fig.savefig(png + ".tmp.png", dpi=110)
    os.replace(png + ".tmp.png", png)
    print("wrote %s, %s, %s" % (os.path.join(out, "comparison.md"), os.path.join(out, "comparison.json"), png))


if __name__ == "__main__":
    main()
