# SPDX-License-Identifier: Apache-2.0
"""No source writes a fixed name in the temporary directory: on a shared machine another user
can create that name first (a link to their own file, or to one of yours). Temporary files
come from mkstemp/mkdtemp (C++: makeTempFile, makeRunFolder; the tests: testTempDir();
Python: tempfile.mkstemp/mkdtemp/TemporaryDirectory) or live under a run's own folder.

The check reads every C++, Python and shell source of the repository for the patterns that
name a file directly under the temporary directory.
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

FOLDERS = ("engine", "profiler", "gui", "plans", "scripts", "samples", "tests")
PATTERNS = [
    # C++: temp_directory_path() / "name", or a literal "/tmp/name".
    re.compile(r"temp_directory_path\([^)]*\)\s*/\s*[\"(]"),
    re.compile(r"[\"']/tmp/[A-Za-z0-9_.-]"),
    # Python: os.path.join(tempfile.gettempdir(), "name").
    re.compile(r"gettempdir\(\)\s*,\s*[\"'fr]"),
    # Shell: a bare /tmp/name or $TMPDIR/name written to.
    re.compile(r"(>|\btee\b|\bcp\b|\bmv\b)\s*\"?(\$\{?TMPDIR\}?|/tmp)/[A-Za-z0-9_.-]"),
]
# A template that mkstemp/mkdtemp fills in is not a fixed name.
TEMPLATE = re.compile(r"X{6}")


class TemporaryNames(unittest.TestCase):
    def test_no_fixed_names_under_the_temporary_directory(self):
        found = []
        for folder in FOLDERS:
            for base, _, files in os.walk(os.path.join(peer.SOURCE, folder)):
                for name in files:
                    if not name.endswith((".cpp", ".h", ".py", ".sh")):
                        continue
                    path = os.path.join(base, name)
                    if os.path.abspath(path) == os.path.abspath(__file__):
                        continue  # its own examples of what it looks for
                    with open(path, errors="replace") as f:
                        for n, line in enumerate(f, 1):
                            code = line.split("//")[0] if name.endswith((".cpp", ".h")) else line
                            if code.lstrip().startswith("#") and not name.endswith((".cpp", ".h")):
                                continue  # a comment or usage line in Python or shell
                            if TEMPLATE.search(code):
                                continue
                            if any(p.search(code) for p in PATTERNS):
                                found.append(f"{os.path.relpath(path, peer.SOURCE)}:{n}: {line.strip()}")
        print(f"checked {', '.join(FOLDERS)}: {len(found)} fixed temporary names")
        self.assertEqual(found, [], "\n".join(found))

    def test_the_check_finds_what_it_looks_for(self):
        for bad in ['auto p = std::filesystem::temp_directory_path() / "shardscope-bench.json";',
                    'out = os.path.join(tempfile.gettempdir(), "x.json")', 'f = "/tmp/shardscope.json"',
                    'echo x > /tmp/shardscope.log']:
            self.assertTrue(any(p.search(bad) for p in PATTERNS), bad)
        self.assertFalse(TEMPLATE.search('"/tmp/" + prefix + "-XXXXXX"') is None)


if __name__ == "__main__":
    unittest.main(verbosity=2)
