#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Screenshots of shardscope-gui's main views under xvfb-run, as a user sees them:
#   scripts/screenshots.sh [BUILD_DIR] [OUT_DIR]     (default: build, BUILD_DIR/screenshots)
# The test suite runs it (gui_screenshots) and keeps the PNGs as artifacts; the README's
# images are these, copied to gui/screenshots after being looked at.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-$build/screenshots}
gui="$build/gui/shardscope-gui"
ss="$build/engine/shardscope"
for tool in xvfb-run "$gui" "$ss"; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "$tool" ]; then
        echo "SKIP: needs $tool (scripts/setup.sh installs xvfb and builds the app)"
        exit 77
    fi
done
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shot() {  # shot NAME ARGS...: one PNG, failing loudly
    local name=$1
    shift
    echo "  $out/$name.png"
    QT_QPA_PLATFORM=xcb timeout 120 xvfb-run -a -s "-screen 0 1400x900x24" \
        "$gui" "$@" --screenshot "$out/$name.png" >"$tmp/$name.log" 2>&1 ||
        { cat "$tmp/$name.log"; echo "error: screenshot $name failed"; exit 1; }
}
llama=(samples/models/llama3-8b/config.json samples/plans/llama-per-block.json samples/clusters/h100-sxm-8x8.json)
echo "shardscope-gui screenshots:"
# The plan, its simulated step, and the figures of a range of it.
shot main-window "${llama[@]}" --select-range 60:140
# An op's details, zoomed in on the start of the step.
shot timeline-details "${llama[@]}" --view 0:20 --select-op 6
# Search: the first backward all-gather of one unit, found by name (Ctrl+F in the app).
shot search "${llama[@]}" --view 0:40 --find "layers.30 all-gather"
# Compare: the per-block plan against the HSDP plan with explicit prefetch (simulated
# trace), or against the demo's measured run when it is there.
if [ -f shardscope-out/tiny-llama.reshard-true.measured-trace.json ]; then
    shot compare samples/models/tiny-llama/config.json samples/plans/tiny-llama-2rank.json \
        shardscope-out/cpu-2core.calibrated.json shardscope-out/tiny-llama.reshard-true.measured-trace.json \
        --tab compare
else
    "$ss" simulate -m samples/models/llama3-8b/config.json -p samples/plans/llama-hsdp-prefetch.json \
        -c samples/clusters/h100-sxm-8x8.json --trace "$tmp/hsdp.json" >/dev/null
    shot compare "${llama[@]}" "$tmp/hsdp.json" --tab compare
fi
# A 4-rank x 8-stream PyTorch-profiler-style trace (32 stream rows and 4 rank headers): the
# tracks scroll inside the window, zoomed in to 2 ms.
"$ss" bench import --size-mb 3 --keep "$tmp/4rank.pt.trace.json" >/dev/null
shot multi-rank "$tmp/4rank.pt.trace.json" --view 0:2
# Pinning: rank 0's and rank 1's last streams pinned under the axis, the tracks scrolled to
# rank 3.
shot pinned "$tmp/4rank.pt.trace.json" --view 0:2 --pin "rank 0 · 107" --pin "rank 1 · 207" \
    --scroll-to-end
# A real PyTorch FSDP2 step on 2 CPU ranks (Gloo), recorded with torch.profiler when the
# environment's Python has torch: a host thread's nested slices, a depth per row.
py=${SHARDSCOPE_PYTHON:-python3}
if "$py" -c "import torch, transformers" >/dev/null 2>&1; then
    "$py" scripts/record_fsdp_trace.py --model samples/models/tiny-llama/config.json \
        --plan samples/plans/tiny-llama-2rank.json --out "$tmp/fsdp" --steps 1 \
        --shardscope "$ss" >"$tmp/record.log" 2>&1 ||
        { cat "$tmp/record.log"; echo "error: recording the FSDP2 trace failed"; exit 1; }
    shot nested-cpu-trace "$tmp/fsdp/rank0.pt.trace.json" --view 0:12
else
    echo "  (no nested-cpu-trace: $py has no torch/transformers)"
fi
# Recommend: the search's Pareto front for Llama-3-8B on 64 H100s.
shot recommend "${llama[@]}" --search
# Launch-to-kernel flows in a PyTorch profiler trace, when the shared traces are there.
flows=../shared/data/traces/TraceLens/tests/traces/b200/eager_trace.json.gz
[ -f "$flows" ] && shot flows "$flows" --flows --view 10:14
echo "done: $(ls "$out"/*.png | wc -l) screenshots in $out"
