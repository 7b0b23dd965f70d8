# SPDX-License-Identifier: Apache-2.0
"""The bundled GPU profiles are what their measurements and stated derivations give:
scripts/derive_profiles.py re-fits H200's kernel tables from the fifteen real H200 runs in
tests/data (calibrate --from-trace) and re-derives the H100, Grand Teton H100 and A100
profiles from them; every committed file must equal what it writes, so no figure in them
is tuned by hand. Each profile loads by name (`-c h100-sxm-80gb-ib`) and cites a source for
its tables.
"""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

DEVICE_FILES = ["h200-sxm", "h100-sxm-80gb", "h100-96gb-hbm2e-500w", "a100-sxm-80gb", "a100-sxm-40gb"]


class Profiles(unittest.TestCase):
    def test_the_committed_profiles_are_what_the_derivation_writes(self):
        r = subprocess.run([sys.executable, os.path.join(peer.SOURCE, "scripts", "derive_profiles.py"),
                            "--check", "--shardscope", peer.BIN], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_each_device_profile_cites_its_tables(self):
        for name in DEVICE_FILES:
            with open(peer.sample("clusters", name + ".json")) as f:
                c = json.load(f)
            for key in ("/sim", "/device/peak_flops", "/device/hbm_bandwidth_bytes_per_s", "/device/memory_bytes"):
                self.assertIn(key, c["sources"], f"{name}: {key}")
            for table in ("compute_efficiency", "gemm_efficiency_by_shape", "attention_efficiency",
                          "memory_efficiency_by_bytes", "memory_efficiency_by_op", "cpu_launch_forward_ns"):
                self.assertIn(table, c["sim"], f"{name}: sim.{table}")
            self.assertNotIn("profiler_ns_per_event", c["sim"], name)  # a run without the profiler

    def test_derived_gpus_are_slower_where_their_hardware_is(self):
        # The same 8B layer on each profile, one GPU: H200 fastest, the 500 W HBM2e H100
        # slower than the 700 W HBM3 one, A100 slowest; memory-bound kernels follow HBM.
        times = {}
        for name in DEVICE_FILES:
            out = peer.shardscope("simulate", "-m", peer.sample("models", "llama3.1-8b", "config.json"),
                                  "-p", peer.sample("plans", "llama-per-block.json"),
                                  "-c", peer.sample("clusters", name + ".json"), "--json")
            times[name] = (out["kernels"]["gemm"]["device_ns"], out["kernels"]["memory_bound"]["device_ns"])
        print({k: (round(g / 1e6), round(m / 1e6)) for k, (g, m) in times.items()})
        self.assertEqual(times["h200-sxm"][0], times["h100-sxm-80gb"][0])
        self.assertLess(times["h200-sxm"][1], times["h100-sxm-80gb"][1])
        self.assertLess(times["h100-sxm-80gb"][1], times["h100-96gb-hbm2e-500w"][1])
        self.assertLess(times["h100-sxm-80gb"][0], times["h100-96gb-hbm2e-500w"][0])
        self.assertLess(times["h100-96gb-hbm2e-500w"][0], times["a100-sxm-80gb"][0])
        self.assertLess(times["a100-sxm-80gb"][1], times["a100-sxm-40gb"][1])

    def test_a_profile_loads_by_name(self):
        out = peer.shardscope("collective", "all_gather", "--bytes", "1G", "--ranks", "64", "-c",
                              "h100-sxm-80gb-ib", "--json")
        self.assertEqual(out["nodes"], 8)
        r = peer.run("collective", "all_gather", "--bytes", "1G", "--ranks", "8", "-c", "h100-sxm-80gb-iv")
        self.assertEqual(r.returncode, 2)
        self.assertIn("h100-sxm-80gb-ib", r.stderr)  # the nearest bundled name


if __name__ == "__main__":
    unittest.main(verbosity=2)
