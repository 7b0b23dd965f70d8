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


if __name__ == "__main__":
    unittest.main(verbosity=2)
