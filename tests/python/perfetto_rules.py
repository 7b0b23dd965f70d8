# SPDX-License-Identifier: Apache-2.0
"""What Perfetto's JSON importer needs from a Chrome trace, as checks.

Perfetto UI loads JSON through trace_processor (src/trace_processor/importers/json/
json_trace_parser_impl.cc); no trace_processor binary can be fetched on these machines, so
its rules are checked here instead:
  - the container is an object with a traceEvents array (displayTimeUnit "ns" or "ms");
  - ph is one of the phases the parser handles; X needs a numeric dur, C an args object
    whose values are numbers (others count as json_parser_failure);
  - pid and tid are integers in [1, 2^32): pid 0 is the kernel's idle process and tid 0
    its thread ("start from pid = 1", perfetto#394), and larger ids are truncated to 32
    bits (perfetto#935);
  - a thread_name record names a tid whatever its pid (ProcessTracker::UpdateThreadName),
    so no tid may appear under two pids, or the names go to the wrong process;
  - slices on one thread must nest: a slice that partly overlaps an open one is drawn
    wrongly (Perfetto FAQ, "Incorrectly displayed overlapping events in JSON trace").
"""

PHASES = set("BEXCMiIstfbenPR")
METADATA = {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}


def problems(trace, limit=20):
    """A list of human-readable violations (empty when Perfetto can load the trace as meant)."""
    out = []

    def bad(msg):
        if len(out) < limit:
            out.append(msg)

    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["not an object with a traceEvents array"]
    if trace.get("displayTimeUnit", "ms") not in ("ns", "ms"):
        bad("displayTimeUnit %r is neither ns nor ms" % trace["displayTimeUnit"])
    pid_of_tid = {}
    slices = {}
    for i, e in enumerate(trace["traceEvents"]):
        where = "traceEvents[%d]" % i
        if not isinstance(e, dict):
            bad(where + ": not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            bad("%s: ph %r is not a phase Perfetto reads" % (where, ph))
            continue
        pid, tid = e.get("pid"), e.get("tid", e.get("pid"))
        for key, v in (("pid", pid), ("tid", tid)):
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v < 2**32:
                bad("%s: %s %r is not an integer in [1, 2^32)" % (where, key, v))
        if isinstance(tid, int) and isinstance(pid, int):
            if pid_of_tid.setdefault(tid, pid) != pid:
                bad("%s: tid %d appears under pid %d and pid %d" % (where, tid, pid_of_tid[tid], pid))
        if ph != "M" and not isinstance(e.get("ts"), (int, float)):
            bad("%s: ts %r is not a number" % (where, e.get("ts")))
            continue
        if ph == "M":
            if e.get("name") not in METADATA:
                bad("%s: metadata %r is not one Perfetto reads" % (where, e.get("name")))
            elif e["name"].endswith("_name"):
                name = (e.get("args") or {}).get("name")
                if not isinstance(name, str) or not name:
                    bad("%s: %s without a string args.name" % (where, e["name"]))
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args:
                bad("%s: counter without an args object" % where)
            else:
                for k, v in args.items():
                    if not isinstance(v, (int, float)) or isinstance(v, bool):
                        bad("%s: counter series %r is %r, not a number" % (where, k, v))
        elif ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or dur < 0:
                bad("%s: dur %r is not a non-negative number" % (where, dur))
                continue
            # Integer nanoseconds: ts and dur are microseconds with up to 3 decimals.
            start = round(e["ts"] * 1000)
            slices.setdefault((pid, tid), []).append((start, start + round(dur * 1000), where))
    for (pid, tid), evs in slices.items():
        evs.sort(key=lambda s: (s[0], -s[1]))
        open_ = []
        for s, t, where in evs:
            while open_ and open_[-1][1] <= s:
                open_.pop()
            if open_ and t > open_[-1][1]:
                bad("%s: slice [%d, %d) ns on pid %d tid %d partly overlaps %s [%d, %d)"
                    % (where, s, t, pid, tid, open_[-1][2], open_[-1][0], open_[-1][1]))
            open_.append((s, t, where))
    return out
