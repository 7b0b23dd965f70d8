# SPDX-License-Identifier: Apache-2.0
"""The collective model against the published record: every nccl-tests or torch.distributed
sweep in samples/published/nccl-sweeps.json (the shared reference's published-runs.md
section 7, transcribed with its sources), predicted by `shardscope collective` from the
bundled cluster profiles.

Bars (issue 48): within 10 % at >= 16 MiB and within 25 % at <= 1 MiB, read as the median
|error| of each sweep's points in that band. The profiles' corrections (launch_us and the
efficiencies) are fitted to these sweeps by `shardscope collective --sweeps ... --fit`;
this test also refits them and checks the committed profiles hold the fit's values, so no
profile figure is tuned by hand. The held-out sweep (skypilot's run on the same kind of
Nebius nodes, another day, another NCCL) is not in the fit.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

SWEEPS = peer.sample("published", "nccl-sweeps.json")
BARS = {">= 16 MiB": 0.10, "<= 1 MiB": 0.25}
# Sweeps the model does not meet in a band, with the bound it holds today and why; any other
# sweep and band must meet the bar. Stated in docs/collectives.md.
KNOWN_MISSES = {
    ("h100-2x8-gcp-a3mega-all-reduce", ">= 16 MiB"): (
        0.20,
        "GPUDirect-TCPXO's all-reduce holds ~0.9 ms of fixed cost from 8 MiB to 8 GiB "
        "(977.6 us at 16 MiB, 1,261.6 at 64 MiB) that neither NCCL's model nor a time per call "
        "has; the same fabric's all-gather meets the bar"),
}


class CollectiveSweeps(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.result = peer.shardscope("collective", "--sweeps", SWEEPS, "--json")

    def test_every_sweep_meets_the_bars(self):
        failures = []
        for s in self.result["sweeps"]:
            for band, bar in BARS.items():
                if band not in s["bands"]:
                    continue
                med = s["bands"][band]["median_abs_error"]
                allowed, why = KNOWN_MISSES.get((s["id"], band), (bar, ""))
                print(f"{s['id']:42s} {band:9s} median |error| {med * 100:5.1f}%"
                      f"  (bar {bar * 100:.0f}%{', not met: ' + why[:60] + '...' if why else ''})")
                if med > allowed:
                    failures.append(f"{s['id']} {band}: median |error| {med:.3f} > {allowed}")
        self.assertEqual(failures, [])

    def test_known_misses_still_miss(self):
        # A known miss that starts meeting its bar must leave the list (and the docs).
        by_id = {s["id"]: s for s in self.result["sweeps"]}
        for (sid, band), (_, why) in KNOWN_MISSES.items():
            med = by_id[sid]["bands"][band]["median_abs_error"]
            self.assertGreater(med, BARS[band], f"{sid} {band} now meets the bar: drop it from KNOWN_MISSES")

    def test_the_held_out_run_is_predicted(self):
        held = [s for s in self.result["sweeps"] if s["held_out"]]
        self.assertTrue(held)
        for s in held:
            for band, bar in BARS.items():
                if band in s["bands"]:
                    self.assertLessEqual(s["bands"][band]["median_abs_error"], bar, s["id"])

    def test_nccl_picks_what_the_sources_saw(self):
        by_id = {s["id"]: s for s in self.result["sweeps"]}
        # stas00: "NCCL uses Ring with the LL protocol up to a 1MiB payload and NVLS with
        # SIMPLE from 2MiB up" (8 x H200, NCCL 2.27.7).
        for p in by_id["h200-8x-nvswitch-all-reduce"]["points"]:
            want = ("Ring", "LL") if p["bytes"] <= 1 << 20 else ("NVLS", "Simple")
            self.assertEqual((p["algorithm"], p["protocol"]), want, p["bytes"])
        # nccl-tests with NCCL_NVLS_ENABLE=0 runs the ring; the other 16 GiB points are the
        # ring all-gather and reduce-scatter, and NVLS all-reduce.
        for p in by_id["h200-8x-nvswitch-16gib"]["points"]:
            want = "NVLS" if p["collective"] == "all_reduce" and not p["env"] else "Ring"
            self.assertEqual(p["algorithm"], want, p)

    def test_the_profiles_hold_the_fit(self):
        fit = peer.shardscope("collective", "--sweeps", SWEEPS, "--fit", "--json")["fit"]
        for p in fit["profiles"]:
            with open(peer.sample("clusters", p["cluster"] + ".json")) as f:
                own = json.load(f).get("nccl", {})
            self.assertIn("launch_us", own, p["cluster"])
            self.assertAlmostEqual(own["launch_us"], p["launch_us"], delta=max(1.0, 0.05 * p["launch_us"]),
                                   msg=p["cluster"])
            for k in ("nvlink_efficiency", "net_efficiency", "nvls_efficiency"):
                if k in own:
                    self.assertAlmostEqual(own[k], p[k], delta=0.02, msg=f"{p['cluster']} {k}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
