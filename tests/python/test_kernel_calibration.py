# SPDX-License-Identifier: Apache-2.0
"""`shardscope calibrate --from-trace` against what someone else counted.

1. A CPU training loop recorded here with torch.profiler (record_shapes, with_flops): every
   matmul op ShardScope prices as a GEMM, with PyTorch's own FLOP count (FunctionEvent.flops,
   torch/utils/flop_counter formulas) as the oracle: the same number of GEMMs and the same
   total FLOPs. The fit is held out on alternate ProfilerSteps; GEMMs of one shape take the
   same time from step to step, so the held-back GEMM total must come within 20 % after
   calibrating from a base cluster 10x off. The written cluster must load in `simulate`.
2. The real GPU traces in ../shared/data/traces (when beside the checkout): the B200 trace's
   GEMM kernels, each tied to its launching op through Kineto's correlation ids and priced
   2*M*N*K from that op's Input Dims, counted here independently; the A100 trace's NCCL
   all-reduces with their "In msg nelems" sizes.
3. Bad input: --trace with --from-trace, a trace with nothing to price.
4. A memory-bound op's bytes: broadcast and expanded inputs (RMSNorm's x * rsqrt, a weight,
   an expand) against the real tensors' nbytes.
"""
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")

TRACES = os.environ.get("SHARDSCOPE_SHARED_TRACES",
                        os.path.join(peer.SOURCE, "..", "shared", "data", "traces"))
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")

RECORD = r"""
import json, sys, torch
from torch.profiler import profile, ProfilerActivity, schedule
out, oracle = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
torch.set_num_threads(2)
m = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                        torch.nn.Linear(2048, 512, bias=False), torch.nn.LayerNorm(512))
opt = torch.optim.AdamW(m.parameters())
x = torch.randn(256, 512)
a, b, c = torch.randn(8, 64, 128), torch.randn(8, 128, 64), torch.randn(8, 64, 64)
counted = []
def ready(p):
    p.export_chrome_trace(out)
    counted.extend({"name": e.name, "flops": e.flops} for e in p.events()
                   if e.name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"))
with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True,
             schedule=schedule(wait=0, warmup=1, active=6, repeat=1), on_trace_ready=ready) as p:
    for _ in range(7):
        y = m(x)
        z = torch.bmm(a, b) + torch.baddbmm(c, a, b)
        (y.square().mean() + z.mean()).backward()
        opt.step()
        opt.zero_grad()
        p.step()
json.dump(counted, open(oracle, "w"))
"""


run = peer.run


read_csv = peer.read_csv


class CpuTrace(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="shardscope-kfit-")
        cls.trace = os.path.join(cls.dir, "cpu.pt.trace.json")
        oracle = os.path.join(cls.dir, "oracle.json")
        r = subprocess.run([sys.executable, "-c", RECORD, cls.trace, oracle],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise AssertionError(r.stderr)
        with open(oracle) as f:
            cls.counted = json.load(f)
        # A base cluster 10x off in compute and memory: the fit must find this machine.
        with open(peer.sample("clusters", "cpu-2core.json")) as f:
            base = json.load(f)
        base["device"]["peak_flops"] = {k: v * 10 for k, v in base["device"]["peak_flops"].items()}
        base["device"]["hbm_bandwidth_bytes_per_s"] *= 10
        cls.base = os.path.join(cls.dir, "base.json")
        with open(cls.base, "w") as f:
            json.dump(base, f)
        cls.out = os.path.join(cls.dir, "fitted.json")
        cls.csv = os.path.join(cls.dir, "samples.csv")
        r = run("calibrate", "--from-trace", cls.trace, "-c", cls.base, "-o", cls.out,
                "--samples", cls.csv, "--json")
        if r.returncode != 0:
            raise AssertionError(r.stderr + r.stdout)
        cls.result = json.loads(r.stdout)
        cls.rows = read_csv(cls.csv)

    def test_gemms_match_pytorch_flop_count(self):
        gemms = [r for r in self.rows if r["class"] == "gemm"]
        ours = sum(float(r["flops"]) for r in gemms)
        theirs = sum(c["flops"] for c in self.counted)
        print(f"GEMMs: ShardScope {len(gemms)} kernels, {ours:.6g} FLOPs; "
              f"PyTorch's FLOP counter {len(self.counted)} ops, {theirs:.6g} FLOPs")
        self.assertEqual(len(gemms), len(self.counted))
        self.assertGreater(theirs, 0)
        self.assertAlmostEqual(ours / theirs, 1.0, places=9)
        for op in MATMULS:
            self.assertEqual(sum(r["op"] == op for r in gemms),
                             sum(c["name"] == op for c in self.counted), op)

    def test_held_out_gemms_after_calibration(self):
        self.assertIn("ProfilerSteps", self.result["split"])
        g = next(c for c in self.result["classes"] if c["class"] == "gemm")
        print(f"held-back GEMMs: {g['held_out']}; total error before {g['before']['total_error']:+.1%}, "
              f"after {g['after']['total_error']:+.1%}; median |error| before "
              f"{g['before']['median_abs_error']:.1%}, after {g['after']['median_abs_error']:.1%}")
        self.assertEqual(g["fitted"], g["held_out"])
        self.assertLess(g["before"]["total_error"], -0.7)  # the base cluster is 10x fast
        self.assertLess(abs(g["after"]["total_error"]), 0.20)
        self.assertLess(g["after"]["median_abs_error"], 0.25)
        m = next(c for c in self.result["classes"] if c["class"] == "memory-bound")
        print(f"held-back memory-bound kernels: {m['held_out']}; total error after "
              f"{m['after']['total_error']:+.1%}, median |error| {m['after']['median_abs_error']:.1%}")
        self.assertGreater(m["held_out"], 0)
        self.assertLess(abs(m["after"]["total_error"]), abs(m["before"]["total_error"]))

    def test_written_cluster_simulates(self):
        with open(self.out) as f:
            fitted = json.load(f)
        self.assertIn("memory_efficiency_by_bytes", fitted["sim"])
        self.assertIn("/sim/compute_efficiency", fitted["sources"])
        r = run("simulate", "-m", peer.sample("models", "tiny-llama", "config.json"),
                "-p", peer.sample("plans", "tiny-llama-2rank.json"), "-c", self.out, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertGreater(json.loads(r.stdout)["step_time_ns"], 0)

    def test_bad_input(self):
        r = run("calibrate", "--from-trace", self.trace, "--trace", self.trace, "-c", self.base,
                "-o", os.path.join(self.dir, "x.json"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("not several", r.stderr)
        empty = os.path.join(self.dir, "empty.json")
        with open(empty, "w") as f:
            json.dump({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "x",
                                        "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}, f)
        r = run("calibrate", "--from-trace", empty, "-c", self.base, "-o", os.path.join(self.dir, "y.json"))
        self.assertEqual(r.returncode, 1)
        self.assertIn(empty, r.stderr)
        self.assertIn("no kernel could be priced", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "y.json")))


BROADCAST = r"""
import json, sys, torch
from torch.profiler import profile, ProfilerActivity, schedule
out, oracle = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
x = torch.randn(16, 256, 512)
r, w, b = torch.randn(16, 256, 1), torch.randn(512), torch.randn(1, 1, 512)
dst, src = torch.empty(16, 256, 512), torch.randn(16, 256, 512, dtype=torch.bfloat16)
expected = {}
def ready(p):
    p.export_chrome_trace(out)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
             schedule=schedule(wait=0, warmup=0, active=2, repeat=1), on_trace_ready=ready) as p:
    for _ in range(2):
        # RMSNorm's x * rsqrt(...) and its weight, and an add of an expanded tensor (stride
        # 0): each reads its inputs' distinct elements and writes x's size.
        y = x * r
        expected["aten::mul", y.nbytes + x.nbytes + r.nbytes] = "x * r"
        y = x * w
        expected["aten::mul", y.nbytes + x.nbytes + w.nbytes] = "x * w"
        e = b.expand(16, 256, 512)
        y = x + e
        expected["aten::add", y.nbytes + x.nbytes + b.nbytes] = "x + b.expand"
        dst.copy_(src)  # a cast in place: reads src, writes dst
        expected["aten::copy_", dst.nbytes + src.nbytes] = "dst.copy_(src)"
        p.step()
json.dump([[k[0], k[1], v] for k, v in expected.items()], open(oracle, "w"))
"""


class BroadcastBytes(unittest.TestCase):
    """A memory-bound op's bytes are its tensors' own: inputs read (a broadcast or expanded
    input once), the output written. The oracle is the real tensors' nbytes; before the
    trace reader read "Input Strides", x * rsqrt(...) over [..., 1] counted a few KB."""

    def test_broadcast_ops_move_their_tensors_bytes(self):
        d = tempfile.mkdtemp(prefix="shardscope-kbytes-")
        trace, oracle = os.path.join(d, "bcast.pt.trace.json"), os.path.join(d, "oracle.json")
        r = subprocess.run([sys.executable, "-c", BROADCAST, trace, oracle],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        with open(oracle) as f:
            expected = json.load(f)
        csv = os.path.join(d, "samples.csv")
        r = run("calibrate", "--from-trace", trace, "-c", peer.sample("clusters", "cpu-2core.json"),
                "-o", os.path.join(d, "fit.json"), "--samples", csv)
        self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
        rows = [x for x in read_csv(csv) if x["class"] == "memory-bound"]
        for op, nbytes, what in expected:
            got = sorted(float(x["bytes"]) for x in rows if x["op"] == op)
            print(f"  {what:16s} {op:12s} tensors {nbytes:>10d} B, trace reader {got}")
            self.assertIn(float(nbytes), got, what)


def gpu_trace(*parts):
    p = os.path.join(TRACES, *parts)
    return p if os.path.exists(p) else None


def nest(events):
    """Per thread, the enclosing cpu_ops of each host event (innermost last)."""
    by_tid = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            by_tid.setdefault((e["pid"], e["tid"]), []).append(e)
    for v in by_tid.values():
        v.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
    return by_tid


class GpuTraces(unittest.TestCase):
    def test_b200_gemms_from_launching_ops(self):
        path = gpu_trace("TraceLens", "tests", "traces", "b200", "eager_trace.json.gz")
        if not path:
            self.skipTest(f"needs ../shared/data/traces beside the checkout (none at {TRACES})")
        events = json.load(gzip.open(path))["traceEvents"]
        launches = {e["args"]["correlation"]: e for e in events
                    if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
        ops = nest(events)
        expected, flops = 0, 0.0
        for k in events:
            if k.get("cat") != "kernel":
                continue
            launch = launches.get(k.get("args", {}).get("correlation"))
            if not launch:
                continue
            enclosing = [o for o in ops.get((launch["pid"], launch["tid"]), [])
                         if o["ts"] <= launch["ts"] and o["ts"] + o["dur"] >= launch["ts"] + launch.get("dur", 0)]
            mm = [o for o in enclosing if o["name"] in MATMULS]
            if not mm:
                continue
            op = mm[-1]
            dims = op["args"]["Input Dims"]
            a, b = (dims[0], dims[1]) if op["name"] in ("aten::mm", "aten::bmm") else (dims[1], dims[2])
            n = 2.0 * a[-2] * a[-1] * b[-1] * (a[0] if len(a) == 3 else 1)
            expected += 1
            flops += n
        out = os.path.join(tempfile.mkdtemp(), "fit.json")
        csv_path = out + ".csv"
        r = run("calibrate", "--from-trace", path, "-c", peer.sample("clusters", "h200-8x8.json"),
                "-o", out, "--samples", csv_path, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("NVIDIA B200", r.stderr)  # the device mismatch is said
        gemms = [row for row in read_csv(csv_path) if row["class"] == "gemm"]
        ours = sum(float(row["flops"]) for row in gemms)
        print(f"B200 GEMM kernels: ShardScope {len(gemms)}, {ours:.6g} FLOPs; "
              f"counted here {expected}, {flops:.6g} FLOPs")
        self.assertGreater(expected, 100)
        self.assertEqual(len(gemms), expected)
        self.assertAlmostEqual(ours / flops, 1.0, places=9)
        res = json.loads(r.stdout)
        for c in res["classes"]:
            if c["priced"] and c["held_out"]:
                print(f"  {c['class']}: held back {c['held_out']}, total error after "
                      f"{c['after']['total_error']:+.1%}, median |error| {c['after']['median_abs_error']:.1%}")

    def test_a100_nccl_all_reduces(self):
        path = gpu_trace("HolisticTraceAnalysis", "tests", "data", "nccl_parser_config", "nccl_data.json.gz")
        if not path:
            self.skipTest(f"needs ../shared/data/traces beside the checkout (none at {TRACES})")
        events = json.load(gzip.open(path))["traceEvents"]
        ar = [e for e in events if e.get("cat") == "kernel" and "AllReduce" in e["name"]]
        out = os.path.join(tempfile.mkdtemp(), "fit.json")
        csv_path = out + ".csv"
        r = run("calibrate", "--from-trace", path, "-c", peer.sample("clusters", "a100-80gb-8x8.json"),
                "-o", out, "--samples", csv_path, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("record_shapes", r.stderr)  # what it cannot fit is said
        rows = [row for row in read_csv(csv_path) if row["collective"] == "allreduce"]
        self.assertEqual(len(rows), len(ar))
        self.assertEqual(sorted(float(row["bytes"]) for row in rows),
                         sorted(4.0 * e["args"]["In msg nelems"] for e in ar))
        self.assertTrue(all(row["group_size"] == "2" for row in rows))
        with open(out) as f:
            self.assertIn("/node/intra_bandwidth_bytes_per_s", json.load(f)["sources"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
