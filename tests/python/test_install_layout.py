# SPDX-License-Identifier: Apache-2.0
"""The installed binary finds its bundled data next to itself, not in the source tree.

`cmake --install` puts the binary in PREFIX/bin and the samples and scripts in
PREFIX/share/shardscope. Run from another folder, the installed binary must read the
installed copies (the published runs file it names is the installed one, a bundled profile
by name resolves there), and SHARDSCOPE_DATA_DIR comes first.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402


class InstallLayout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        build = os.path.dirname(os.path.dirname(os.path.abspath(peer.BIN)))
        cls.prefix = os.path.join(cls.tmp, "prefix")
        r = subprocess.run(["cmake", "--install", build, "--prefix", cls.prefix],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise unittest.SkipTest("cmake --install failed: " + r.stderr[-400:])
        cls.bin = os.path.join(cls.prefix, "bin", "shardscope")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_installed(self, *args, env=None):
        e = dict(os.environ)
        e.pop("SHARDSCOPE_DATA_DIR", None)
        e.update(env or {})
        return subprocess.run([self.bin, *args], capture_output=True, text=True, cwd=self.tmp,
                              env=e, timeout=300)

    def test_the_installed_samples_are_read(self):
        r = self.run_installed("bench", "published", "--filter", "64xa100-llama3-8b-ac-op")
        self.assertEqual(r.returncode, 0, r.stderr)
        installed = os.path.join(self.prefix, "share", "shardscope", "samples", "published",
                                 "fsdp-runs.json")
        self.assertIn(installed, r.stdout)

    def test_a_bundled_profile_by_name_resolves_there(self):
        r = self.run_installed("collective", "all_gather", "--bytes", "1G", "--ranks", "8",
                               "-c", "h100-sxm-80gb-does-not-exist")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(os.path.join(self.prefix, "share", "shardscope", "samples", "clusters"),
                      r.stderr)

    def test_shardscope_data_dir_comes_first(self):
        data = os.path.join(self.tmp, "data")
        shutil.copytree(os.path.join(self.prefix, "share", "shardscope", "samples"),
                        os.path.join(data, "samples"))
        r = self.run_installed("bench", "published", "--filter", "64xa100-llama3-8b-ac-op",
                               env={"SHARDSCOPE_DATA_DIR": data})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(os.path.join(data, "samples", "published", "fsdp-runs.json"), r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
