# SPDX-License-Identifier: Apache-2.0
"""Shared helpers for peer tests: PyTorch (and transformers) are the oracle.

Each test script exits 77 (ctest's skip code) with the reason when the Python environment
lacks torch, so a build without the set-up script's venv reports "skipped", never a fake pass.
"""
import json
import os
import subprocess
import sys

SOURCE = os.environ.get("SHARDSCOPE_SOURCE", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BIN = os.environ.get("SHARDSCOPE_BIN", os.path.join(SOURCE, "build", "engine", "shardscope"))


def require(module):
    try:
        return __import__(module)
    except ImportError as e:
        print(f"SKIP: needs the Python package {module!r} from scripts/requirements.txt ({e})")
        sys.exit(77)


def require_engine():
    """(shardscope, shardscope-engine) paths; exits 77 when the LibTorch engine is not built."""
    bin_ = os.environ.get("SHARDSCOPE_BIN", "")
    engine = os.path.join(os.path.dirname(bin_), "shardscope-engine") if bin_ else ""
    if not bin_ or not os.path.exists(engine):
        print("SKIP: needs the LibTorch engine (shardscope-engine beside SHARDSCOPE_BIN)")
        sys.exit(77)
    return bin_, engine


def shardscope(*args, check=True):
    """Runs the shardscope CLI and returns its stdout (parsed as JSON when it is JSON)."""
    r = subprocess.run([BIN, *args], capture_output=True, text=True, cwd=SOURCE)
    if check and r.returncode != 0:
        raise AssertionError(f"shardscope {' '.join(args)} exited {r.returncode}:\n{r.stderr}{r.stdout}")
    try:
        return json.loads(r.stdout)
    except json.JSONDecodeError:
        return r.stdout


def run(*args, binary=None):
    """Runs the shardscope CLI (or `binary`) from the source folder; the CompletedProcess."""
    return subprocess.run([binary or BIN, *args], capture_output=True, text=True, cwd=SOURCE)


def read_csv(path):
    import csv
    with open(path) as f:
        return list(csv.DictReader(f))


def sample(*parts):
    return os.path.join(SOURCE, "samples", *parts)
