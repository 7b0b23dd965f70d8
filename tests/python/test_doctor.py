# SPDX-License-Identifier: Apache-2.0
"""Peer test: the C++ build links the LibTorch of the environment's torch wheel (same version,
CUDA 13 build) and c10d's Gloo backend runs a real all-reduce from C++."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")


class Doctor(unittest.TestCase):
    def test_runtime_matches_python_torch(self):
        d = peer.shardscope("doctor", "--json")
        if not d["build"]["libtorch"]:
            print("SKIP: this build has no LibTorch engine (configure with SHARDSCOPE_PYTHON)")
            sys.exit(77)
        self.assertEqual(d["runtime"]["libtorch"], torch.__version__.split("+")[0])
        self.assertEqual(torch.version.cuda.split(".")[0], "13")
        self.assertTrue(d["runtime"]["gloo"].startswith("ok"), d["runtime"]["gloo"])
        self.assertEqual(d["runtime"]["cuda_devices"], torch.cuda.device_count())

    def test_nccl_is_the_wheels_and_the_profiles_model_it(self):
        # The NCCL the engine loads is the one the wheel ships (torch.cuda.nccl.version()
        # reads the same library), and every bundled profile with an NCCL section models
        # that version unless it names the run it was measured on (the Lambda B200 sweep
        # ran NCCL 2.26.2, the others' own versions are in samples/published).
        d = peer.shardscope("doctor", "--json")
        if not d["build"]["libtorch"] or not d["runtime"]["nccl"][:1].isdigit():
            print("SKIP: this build loads no NCCL")
            sys.exit(77)
        wheel = ".".join(str(x) for x in torch.cuda.nccl.version())
        self.assertEqual(d["runtime"]["nccl"], wheel)
        import glob
        import json
        for path in sorted(glob.glob(peer.sample("clusters", "*.json"))):
            with open(path) as f:
                own = json.load(f)
            version = own.get("nccl", {}).get("version")
            if version is not None:
                self.assertEqual(version, wheel, path)


if __name__ == "__main__":
    unittest.main(verbosity=2)
