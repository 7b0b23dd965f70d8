# SPDX-License-Identifier: Apache-2.0
"""End to end: the README's main job (scripts/demo.sh) at a smaller size.

Runs every stage of the demo (with SHARDSCOPE_DEMO_SEQ=64, SHARDSCOPE_DEMO_STEPS=2) into a
temporary folder and checks that the artifacts exist, parse, and agree with each other: the
report's measured step time is the slowest rank's mean of the step spans in the measured
trace, its measured peak the maximum of the trace's memory counters, its predictions those
of `simulate --json` (with the CPU profile `calibrate` fitted to the first run) and of the
simulated trace.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402
import perfetto_rules  # noqa: E402

BIN, _ENGINE = peer.require_engine()
SOURCE = os.environ.get("SHARDSCOPE_SOURCE", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
try:
    import matplotlib  # noqa: F401
except ImportError:
    print("skipped: needs matplotlib (scripts/requirements.txt) for the demo's plot")
    sys.exit(77)

NAMES = ["tiny-llama.reshard-true", "tiny-llama.reshard-false"]


class DemoEndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = cls.tmp.name
        build = os.path.dirname(os.path.dirname(BIN))
        env = dict(os.environ, SHARDSCOPE_OUT=cls.out, SHARDSCOPE_DEMO_SEQ="64", SHARDSCOPE_DEMO_STEPS="2",
                   SHARDSCOPE_VENV=os.path.dirname(os.path.dirname(sys.executable)))
        cls.r = subprocess.run(["bash", os.path.join(SOURCE, "scripts/demo.sh"), build], cwd=SOURCE, env=env,
                               capture_output=True, text=True, timeout=900)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def load(self, name):
        with open(os.path.join(self.out, name)) as f:
            return json.load(f)

    def test_demo_succeeds_and_writes_every_artifact(self):
        self.assertEqual(self.r.returncode, 0, self.r.stderr[-3000:] + self.r.stdout[-3000:])
        self.assertIn("All stages passed", self.r.stdout)
        self.assertIn("shardscope-gui", self.r.stdout)
        for f in ["comparison.md", "comparison.json", "memory-timeline.png", "cpu-2core.calibrated.json",
                  "llama3-8b.64xH100.recommended.plan.json", "llama3-8b.64xH100.recommended.fsdp2.json",
                  "llama3-70b.512xH100.recommended.plan.json", "llama3-70b.512xH100.recommended.fsdp2.json",
                  "llama3-8b.64xH100.recommended.fsdp1.json", "llama3-8b.64xH100.recommended.lightning.json",
                  "llama3-8b-per-block.sim-trace.json"] + \
                [n + s for n in NAMES for s in (".run.json", ".measured-trace.json", ".sim.json", ".sim-trace.json")]:
            path = os.path.join(self.out, f)
            self.assertTrue(os.path.getsize(path) > 0, f)
            if f.endswith(".json"):
                self.load(f)  # parses
        with open(os.path.join(self.out, "memory-timeline.png"), "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_report_equals_the_traces(self):
        self.assertEqual(self.r.returncode, 0)
        report = {p["name"]: p for p in self.load("comparison.json")["plans"]}
        md = open(os.path.join(self.out, "comparison.md")).read()
        for name in NAMES:
            p = report[name]
            run, sim = self.load(name + ".run.json"), self.load(name + ".sim.json")
            measured = self.load(name + ".measured-trace.json")["traceEvents"]
            simulated = self.load(name + ".sim-trace.json")["traceEvents"]
            # Measured step time: the slowest rank's mean of its step spans.
            spans = {}
            for e in measured:
                if e.get("cat") == "step":
                    spans.setdefault(e["pid"], []).append(e["dur"] * 1000)
            self.assertEqual(len(spans), run["world_size"])
            self.assertTrue(all(len(v) == 2 for v in spans.values()))
            slowest = max(sum(v) / len(v) for v in spans.values())
            self.assertAlmostEqual(p["measured_step_time_ns"], slowest, delta=2)
            # Measured peak: the largest memory counter of any rank.
            peak = max(e["args"]["allocated"] for e in measured if e.get("name") == "memory (bytes)")
            self.assertEqual(p["measured_peak_allocated_bytes"], peak)
            # Predictions: simulate --json, its trace, and run --cluster's own simulation.
            self.assertEqual(p["predicted_step_time_ns"], sim["step_time_ns"])
            self.assertEqual(p["predicted_peak_allocated_bytes"], sim["peak_allocated_bytes"])
            # The predictions are the calibrated profile's.
            self.assertIn("calibrated on tiny-llama.reshard-true.measured-trace.json", sim["cluster"])
            self.assertEqual(p["cluster"], sim["cluster"])
            ends = [e["ts"] + e["dur"] for e in simulated if e.get("ph") == "X"]
            self.assertAlmostEqual(max(ends) * 1000, sim["step_time_ns"], delta=1000)
            sim_peak = max(e["args"]["allocated"] for e in simulated if e.get("name") == "memory (bytes)")
            self.assertEqual(sim_peak, sim["peak_allocated_bytes"])
            self.assertAlmostEqual(p["step_time_error"],
                                   (sim["step_time_ns"] - run["step_time_ns"]) / run["step_time_ns"], places=12)
            self.assertTrue(p["op_order_matches_program"])
            self.assertIn("| %s | %.2f ms | %.2f ms |" % (name, sim["step_time_ns"] / 1e6, run["step_time_ns"] / 1e6), md)


    def test_traces_load_in_perfetto_as_meant(self):
        # Multi-rank measured traces too: every rank's lanes keep their own tids and names.
        for name in NAMES:
            for kind in ("measured-trace", "sim-trace"):
                trace = self.load("%s.%s.json" % (name, kind))
                self.assertEqual(perfetto_rules.problems(trace), [], "%s.%s" % (name, kind))
            measured = self.load(name + ".measured-trace.json")["traceEvents"]
            names = {(e["pid"], e["args"]["name"]) for e in measured
                     if e["ph"] == "M" and e["name"] == "process_name"}
            self.assertEqual(names, {(1, "rank 0 (measured)"), (2, "rank 1 (measured)")})

    def test_trace_diff_joins_the_demo_traces(self):
        self.assertEqual(self.r.returncode, 0)
        report = {p["name"]: p for p in self.load("comparison.json")["plans"]}
        for name in NAMES:
            r = subprocess.run([BIN, "trace", "diff", os.path.join(self.out, name + ".measured-trace.json"),
                                os.path.join(self.out, name + ".sim-trace.json"), "--json"],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            d = json.loads(r.stdout)
            sim_ops = sum(1 for e in self.load(name + ".sim-trace.json")["traceEvents"] if e.get("ph") == "X")
            self.assertEqual(d["joined_ops"], sim_ops)
            self.assertEqual((d["only_in_a"], d["only_in_b"]), (0, 0))
            self.assertAlmostEqual(d["a"]["step_time_ns"], report[name]["measured_step_time_ns"], delta=2)
            self.assertAlmostEqual(d["b"]["step_time_ns"], report[name]["predicted_step_time_ns"], delta=1000)
            self.assertAlmostEqual(d["peak_allocated_error"], report[name]["peak_allocated_error"], places=9)

    def test_trace_overlap_accounts_for_every_collective(self):
        self.assertEqual(self.r.returncode, 0)
        name = NAMES[0] + ".measured-trace.json"
        r = subprocess.run([BIN, "trace", "overlap", os.path.join(self.out, name), "--json"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        o = json.loads(r.stdout)
        events = [e for e in self.load(name)["traceEvents"] if e.get("ph") == "X" and "op_id" in e.get("args", {})]
        comm = sum(e["dur"] * 1000 for e in events if e["args"]["kind"] in ("all_gather", "reduce_scatter", "all_reduce"))
        rank_steps = {(e["pid"], e["args"]["step"]) for e in events}
        self.assertEqual(o["rank_steps"], len(rank_steps))
        self.assertAlmostEqual(o["comm_ns_per_step"], comm / len(rank_steps), delta=len(events))
        self.assertLessEqual(o["exposed_ns_per_step"], o["comm_ns_per_step"])
        self.assertTrue(all(c["exposed_ns_per_step"] <= c["comm_ns_per_step"] + 1 for c in o["collectives"]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
