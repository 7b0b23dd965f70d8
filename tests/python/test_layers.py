# SPDX-License-Identifier: Apache-2.0
"""The folders are the layers (docs/architecture.md): every #include of the sources points to
the same floor or one below, and no two folders include each other round a loop.

  1 plans/            model, cluster, plan (no Qt, no torch)
  2 profiler/         trace model, import, export, recorders, summaries
  3 engine/schedule, engine/sim, engine/search      the step program and the simulator
  4 engine/measure, engine/calibrate                 measured against simulated
  4 engine/exec                                      the LibTorch runtime
  5 engine/cli, gui/                                 the command line and the app

Read from the includes themselves (as `farm-studio look` draws them), not from the build.
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

FLOORS = {
    "plans": 1, "profiler": 2,
    "engine/schedule": 3, "engine/sim": 3, "engine/search": 3,
    "engine/measure": 4, "engine/calibrate": 4, "engine/exec": 4,
    "engine/cli": 5, "gui": 5,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(path):
    """The layer a repository path belongs to (the longest FLOORS key it starts with)."""
    best = None
    for key in FLOORS:
        if path == key or path.startswith(key + "/"):
            if best is None or len(key) > len(best):
                best = key
    return best


def includes():
    """(source file, included path) for every quoted include of the layered folders."""
    out = []
    for top in ("plans", "profiler", "engine", "gui"):
        for base, _, files in os.walk(os.path.join(peer.SOURCE, top)):
            for name in files:
                if not name.endswith((".cpp", ".h", ".cu")):
                    continue
                path = os.path.join(base, name)
                rel = os.path.relpath(path, peer.SOURCE)
                with open(path, errors="replace") as f:
                    for line in f:
                        m = INCLUDE.match(line)
                        if m and folder_of(m.group(1)):
                            out.append((rel, m.group(1)))
    return out


class Layers(unittest.TestCase):
    def test_no_include_runs_back_up(self):
        up = []
        edges = set()
        for src, inc in includes():
            a, b = folder_of(src), folder_of(inc)
            if a is None or b is None or a == b:
                continue
            edges.add((a, b))
            if FLOORS[b] > FLOORS[a]:
                up.append(f"{src} (floor {FLOORS[a]}) includes {inc} (floor {FLOORS[b]})")
        print(f"{len(edges)} folder-to-folder include edges, {len(up)} running back up")
        self.assertEqual(up, [], "\n".join(up))

    def test_no_circle_between_folders(self):
        graph = {}
        for src, inc in includes():
            a, b = folder_of(src), folder_of(inc)
            if a and b and a != b:
                graph.setdefault(a, set()).add(b)
        state, cycle = {}, []

        def visit(n, stack):
            state[n] = 1
            for m in sorted(graph.get(n, ())):
                if state.get(m) == 1:
                    cycle.append(stack + [n, m])
                elif m not in state:
                    visit(m, stack + [n])
            state[n] = 2

        for n in sorted(graph):
            if n not in state:
                visit(n, [])
        self.assertEqual(cycle, [])

    def test_the_app_and_the_simulator_stay_off_torch(self):
        # LibTorch stays in engine/exec (and the recorders): one torch include costs ~12 s.
        heavy = [(s, i) for s, i in includes() if folder_of(i) == "engine/exec" and not s.startswith("engine/exec")
                 and not s.startswith("engine/cli")]
        self.assertEqual(heavy, [])
        torch_in = []
        for top in ("plans", "engine/schedule", "engine/sim", "engine/search", "engine/measure",
                    "engine/calibrate", "gui"):
            for base, _, files in os.walk(os.path.join(peer.SOURCE, top)):
                for name in files:
                    with open(os.path.join(base, name), errors="replace") as f:
                        if re.search(r'#\s*include\s*[<"](torch|ATen|c10)/', f.read()):
                            torch_in.append(os.path.relpath(os.path.join(base, name), peer.SOURCE))
        self.assertEqual(torch_in, [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
