# SPDX-License-Identifier: Apache-2.0
"""`simulate --trace` writes traces Perfetto UI loads as meant (perfetto_rules.py), with one
thread per stream of the rank role, the memory counters by category and op ids, for plans
that use every stream: per-block FSDP2, HSDP with explicit prefetch, FSDP1, CPU offload and
int reshard. The checker itself is tested on traces that break each rule."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from peer import shardscope, SOURCE  # noqa: E402
import perfetto_rules  # noqa: E402

PLANS = [
    ("llama3-8b", "llama-per-block", "h100-sxm-8x8"),
    ("llama3-8b", "llama-hsdp-prefetch", "h100-sxm-8x8"),
    ("llama3-8b", "llama-fsdp1", "h100-sxm-8x8"),
    ("tiny-llama", "tiny-llama-2rank", "cpu-2core"),
    ("tiny-llama", "tiny-llama-2rank-keep", "cpu-2core"),
]


class SimulatedTraces(unittest.TestCase):
    def simulate(self, model, plan, cluster, *extra):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "t.json")
            shardscope("simulate", "-m", "samples/models/%s/config.json" % model,
                       "-p", "samples/plans/%s.json" % plan, "-c", "samples/clusters/%s.json" % cluster,
                       "--trace", out, *extra)
            with open(out) as f:
                return json.load(f)

    def check(self, trace, label):
        self.assertEqual(perfetto_rules.problems(trace), [], label)
        ev = trace["traceEvents"]
        threads = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
        self.assertTrue({"compute", "all_gather", "reduce_scatter"} <= threads, label)
        xs = [e for e in ev if e["ph"] == "X"]
        self.assertTrue(xs and all("op_id" in e["args"] for e in xs), label)
        counters = {e["name"] for e in ev if e["ph"] == "C"}
        self.assertIn("memory allocated by category (bytes)", counters, label)
        self.assertIn("memory (bytes)", counters, label)
        return xs

    def test_sample_plans(self):
        for model, plan, cluster in PLANS:
            self.check(self.simulate(model, plan, cluster), plan)

    def test_offload_and_int_reshard_use_their_streams(self):
        with open(os.path.join(SOURCE, "samples/plans/llama-per-block.json")) as f:
            plan = json.load(f)
        plan.setdefault("defaults", {})
        plan["defaults"]["offload"] = {"pin_memory": True}
        plan["defaults"]["reshard_after_forward"] = 8
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "plan.json")
            with open(path, "w") as f:
                json.dump(plan, f)
            out = os.path.join(d, "t.json")
            shardscope("simulate", "-m", "samples/models/llama3-8b/config.json", "-p", path,
                       "-c", "samples/clusters/h100-sxm-8x8.json", "--trace", out)
            with open(out) as f:
                trace = json.load(f)
        xs = self.check(trace, "offload + reshard 8")
        kinds = {e["args"]["kind"] for e in xs}
        self.assertTrue({"h2d", "d2h"} <= kinds, kinds)


class ExportedTraces(unittest.TestCase):
    """`trace export` makes Perfetto-ready JSON of PyTorch profiler traces (which use pid 0
    and share stream tids across GPUs)."""

    def test_shared_traces(self):
        shared = os.path.join(SOURCE, "..", "shared", "data", "traces")
        if not os.path.isdir(shared):
            self.skipTest("needs ../shared/data/traces beside the checkout")
        files = [os.path.join(d, f) for d, _, fs in os.walk(shared) for f in fs
                 if f.endswith((".json", ".json.gz"))]
        self.assertTrue(files)
        with tempfile.TemporaryDirectory() as d:
            for f in files:
                out = os.path.join(d, "x.json")
                shardscope("trace", "export", f, "-o", out)
                with open(out) as fh:
                    found = perfetto_rules.problems(json.load(fh), limit=10**6)
                # Events that partly overlap on one thread in the source trace itself (some
                # Kineto CPU ops do) are kept as they are: the export loses nothing.
                self.assertEqual([p for p in found if "partly overlaps" not in p], [], f)


class Rules(unittest.TestCase):
    """Each rule fires on a trace that breaks it (so a clean result means something)."""

    def base(self):
        return {"displayTimeUnit": "ns", "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1001, "args": {"name": "compute"}},
            {"ph": "X", "name": "a", "pid": 1, "tid": 1001, "ts": 0.0, "dur": 10.0},
            {"ph": "X", "name": "b", "pid": 1, "tid": 1001, "ts": 2.0, "dur": 3.0},
            {"ph": "X", "name": "c", "pid": 1, "tid": 1001, "ts": 10.0, "dur": 1.0},
            {"ph": "C", "name": "memory", "pid": 1, "tid": 1099, "ts": 0.0, "args": {"allocated": 5}},
        ]}

    def test_clean(self):
        self.assertEqual(perfetto_rules.problems(self.base()), [])

    def test_each_rule(self):
        breaks = [
            (lambda ev: ev[1].update(pid=0), "pid 0"),
            (lambda ev: ev[1].update(tid=0), "tid 0"),
            (lambda ev: ev.append({"ph": "X", "name": "d", "pid": 2, "tid": 1001, "ts": 20.0, "dur": 1.0}),
             "tid 1001 appears under pid 1 and pid 2"),
            (lambda ev: ev[2].update(dur=9.0), "partly overlaps"),
            (lambda ev: ev[4]["args"].update(allocated="5 MiB"), "not a number"),
            (lambda ev: ev[0]["args"].pop("name"), "without a string args.name"),
            (lambda ev: ev[1].update(dur=-1), "non-negative"),
            (lambda ev: ev[1].update(ph="Q"), "not a phase"),
        ]
        for mutate, expected in breaks:
            t = self.base()
            mutate(t["traceEvents"])
            found = perfetto_rules.problems(t)
            self.assertTrue(any(expected in p for p in found), (expected, found))


if __name__ == "__main__":
    unittest.main()
