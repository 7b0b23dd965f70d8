# SPDX-License-Identifier: Apache-2.0
"""Recorded figures of the expensive oracles (FSDPMemTracker on full-size models), keyed by
everything they depend on, so the test suite compares the simulator live against PyTorch's
figures in every run without re-running PyTorch for every case.

Each case's key hashes what its figures depend on (the oracle hands over the parts: the
model's config, the plan as exported, the shape, the oracle's own source, the torch and
transformers versions). SHARDSCOPE_ORACLE picks how a case's figures are obtained:

  auto    (the default) the recorded figures when the key is recorded, except for the one
          key the day's rotation picks (the recorded keys in turn, one a day), which PyTorch
          runs live and must give the recorded figures again; a key with no record runs live.
  live    PyTorch runs every case (`shardscope bench memory` does).
  record  PyTorch runs every case and its figures are recorded (commit the file).

The record is tests/data/oracle/<name>.json; docs/testing.md says when to re-record.
"""
import fcntl
import hashlib
import json
import os
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _path(name):
    return os.path.join(ROOT, "tests", "data", "oracle", name + ".json")


def _read(name):
    try:
        with open(_path(name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"format": "shardscope.oracle_record", "version": 1, "cases": {}}


def _write(name, key, parts, label, figures):
    """Adds one case, under a lock on the record's folder (tests run in parallel), and
    replaces the file atomically."""
    path = _path(name)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    lock = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rec = _read(name)
        rec["cases"][key] = {"case": label, "depends_on": parts, "figures": figures}
        rec["cases"] = dict(sorted(rec["cases"].items()))
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".record-")
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        os.close(lock)


def key_of(parts):
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def recorded(name, parts, label, run_live):
    """The figures of one case: recorded or live (run_live()), as SHARDSCOPE_ORACLE says.
    Returns (figures, "recorded" or "live")."""
    mode = os.environ.get("SHARDSCOPE_ORACLE", "auto")
    if mode not in ("auto", "live", "record"):
        raise SystemExit(f"SHARDSCOPE_ORACLE={mode!r}: expected auto, live or record")
    if mode == "live":
        return run_live(), "live"
    key = key_of(parts)
    cases = _read(name)["cases"]
    known = cases.get(key)
    # One recorded key a day runs live, the keys in turn: every case is checked against
    # PyTorch again over len(cases) days, and a run pays for one live case at most.
    today = int(time.time() // 86400)
    todays = sorted(cases)[today % len(cases)] if cases else None
    if mode == "auto" and known and key != todays:
        return known["figures"], "recorded"
    figures = run_live()
    if mode == "record":
        _write(name, key, parts, label, figures)
    elif known and known["figures"] != figures:
        raise AssertionError(f"{name}: PyTorch gave other figures than recorded for {label} (key {key}, same "
                             f"inputs): {figures} vs {known['figures']}; find what the key misses, then "
                             "re-record with SHARDSCOPE_ORACLE=record")
    elif not known:
        print(f"{name}: no record for {label} (key {key}): ran live; record it with SHARDSCOPE_ORACLE=record")
    return figures, "live"
