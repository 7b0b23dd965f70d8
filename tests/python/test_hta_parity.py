# SPDX-License-Identifier: Apache-2.0
"""Holistic Trace Analysis is the oracle for `shardscope trace summary`.

On every real trace in ../shared/data/traces, HTA 0.5.0 (TraceAnalysis: get_temporal_breakdown,
get_comm_comp_overlap) and `shardscope trace summary --json` must agree: kernel, idle,
compute and non-compute time within 1 us, the communication-computation overlap within
0.01 percentage points. Checked with HTA's defaults (the last ProfilerStep and the GPU
events it launched left out, fractional microseconds rounded) and with each turned off the
way HTA turns it off (include_last_profiler_step=True with --include-last-step;
HTA_DISABLE_NS_ROUNDING=1 with --no-ns-rounding). Traces HTA cannot analyse (it raises on
the 30-event CPU-only trace) are reported and skipped; a trace without communication is
NaN in HTA and 0 here.
"""
import glob
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

peer.require("pandas")
hta_ta = peer.require("hta.trace_analysis")

TRACES = os.environ.get("SHARDSCOPE_SHARED_TRACES",
                        os.path.join(peer.SOURCE, "..", "shared", "data", "traces"))
FILES = sorted(glob.glob(os.path.join(TRACES, "**", "*.json.gz"), recursive=True))
if not FILES:
    print(f"SKIP: needs the real traces of ../shared/data/traces beside the checkout (none at {TRACES})")
    sys.exit(77)

HTA_SCRIPT = r"""
import json, logging, os, shutil, sys, tempfile
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
path, include_last = sys.argv[1], sys.argv[2] == "1"
d = tempfile.mkdtemp()
shutil.copy(path, d)
try:
    ta = TraceAnalysis(trace_dir=d, include_last_profiler_step=include_last)
    tb = ta.get_temporal_breakdown(visualize=False).to_dict(orient="records")[0]
    ov = ta.get_comm_comp_overlap(visualize=False).to_dict(orient="records")[0]
    print(json.dumps({"temporal": tb, "overlap": ov["comp_comm_overlap_pctg"]}, default=float))
except Exception as e:
    print(json.dumps({"error": repr(e)[:300]}))
finally:
    shutil.rmtree(d)
"""


def hta(path, include_last=False, rounding=True):
    env = dict(os.environ)
    if not rounding:
        env["HTA_DISABLE_NS_ROUNDING"] = "1"
    r = subprocess.run([sys.executable, "-c", HTA_SCRIPT, path, "1" if include_last else "0"],
                       capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"HTA failed on {path}: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def ours(path, *flags):
    return peer.shardscope("trace", "summary", "--json", path, *flags)[0]


class HtaParity(unittest.TestCase):
    files = FILES

    def compare(self, path, h, s):
        tb, t = h["temporal"], s["temporal_breakdown"]
        for hk, sk in (("kernel_time(us)", "kernel_time_ns"), ("idle_time(us)", "idle_ns"),
                       ("compute_time(us)", "compute_ns"), ("non_compute_time(us)", "non_compute_ns")):
            self.assertAlmostEqual(t[sk] / 1000.0, tb[hk], delta=1.0, msg=f"{os.path.basename(path)} {hk}")
        hov = h["overlap"]
        ov = 100.0 * s["comp_comm_overlap_ratio"]
        if hov is None or (isinstance(hov, float) and math.isnan(hov)):
            self.assertEqual(s["comm_ns"], 0, "HTA has no communication to overlap")
        else:
            self.assertAlmostEqual(ov, hov, delta=0.01, msg=f"{os.path.basename(path)} overlap")

    def test_defaults_equal_hta(self):
        checked = 0
        for path in self.files:
            with self.subTest(trace=os.path.basename(path)):
                h = hta(path)
                if "error" in h:
                    print(f"HTA cannot analyse {os.path.basename(path)}: {h['error']}")
                    continue
                self.compare(path, h, ours(path))
                checked += 1
        self.assertGreaterEqual(checked, 5)

    def test_each_default_turned_off_as_hta_turns_it_off(self):
        for path in self.files:
            name = os.path.basename(path)
            with self.subTest(trace=name, variant="include last step"):
                h = hta(path, include_last=True)
                if "error" not in h:
                    self.compare(path, h, ours(path, "--include-last-step"))
            with self.subTest(trace=name, variant="no rounding"):
                h = hta(path, rounding=False)
                if "error" not in h:
                    self.compare(path, h, ours(path, "--no-ns-rounding"))


if __name__ == "__main__":
    unittest.main()
