#!/usr/bin/env bash
# The main job on the bundled samples: the sample models and plans against the sample
# clusters, exports, a simulated step, recommendations for Llama-3-8B on 64 H100s and
# Llama-3-70B on 512, and a tiny Llama run for real on 2 CPU ranks under two plans,
# predicted against measured. Called by `scripts/setup.sh demo`; SHARDSCOPE_OUT names the
# output folder, SHARDSCOPE_DEMO_SEQ/STEPS shrink the real runs (the end-to-end test does).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
ss="$build/engine/shardscope"
cd "$root"
stage=0
run() {
    stage=$((stage + 1))
    printf '\n[%d] $ shardscope %s\n' "$stage" "$*"
    "$ss" "$@" || { echo "stage $stage failed: shardscope $*" >&2; exit 1; }
}
run doctor
run model show --model samples/models/llama3-8b/config.json --depth 3
run model show --model samples/models/mixtral-8x7b/config.json --depth 4
run plan show --model samples/models/llama3-8b/config.json --plan samples/plans/llama-per-block.json \
    --cluster samples/clusters/h100-sxm-8x8.json
run plan show --model samples/models/llama3-8b/config.json --plan samples/plans/llama-hsdp-prefetch.json \
    --cluster samples/clusters/h100-sxm-8x8.json
run plan show --model samples/models/llama3-70b/config.json --plan samples/plans/llama-fsdp1.json \
    --cluster samples/clusters/h100-sxm-64x8.json
run plan validate --model samples/models/gpt2/config.json --plan samples/plans/gpt2-lightning.json \
    --cluster samples/clusters/a100-80gb-8x8.json
stage=$((stage + 1))
printf '\n[%d] $ shardscope plan validate ... -p samples/plans/broken/llama-mistakes.json   (a plan with mistakes: must fail)\n' "$stage"
if "$ss" plan validate --model samples/models/llama3-8b/config.json --plan samples/plans/broken/llama-mistakes.json \
    --cluster samples/clusters/h100-sxm-8x8.json; then
    echo "stage $stage failed: validate accepted a broken plan" >&2
    exit 1
fi
echo "(exit status 1, as expected)"
out="${SHARDSCOPE_OUT:-$root/shardscope-out}"
mkdir -p "$out"
for f in fsdp2 fsdp1 lightning shardscope; do
    run plan export --model samples/models/llama3-8b/config.json --plan samples/plans/llama-per-block.json \
        --cluster samples/clusters/h100-sxm-8x8.json --format "$f" --output "$out/llama3-8b-per-block.$f.json"
done
# Simulate the common per-block plan; the trace opens in Perfetto UI (ui.perfetto.dev).
run simulate --model samples/models/llama3-8b/config.json --plan samples/plans/llama-per-block.json \
    --cluster samples/clusters/h100-sxm-8x8.json --trace "$out/llama3-8b-per-block.sim-trace.json"
# Recommendations: Llama-3-8B on 64 H100s and Llama-3-70B on 512 H100s, against the default.
run recommend --model samples/models/llama3-8b/config.json --cluster samples/clusters/h100-sxm-8x8.json \
    --seq 4096 --format shardscope --output "$out/llama3-8b.64xH100.recommended.plan.json"
# The recommended plan in the formats FSDP2, FSDP1 and Lightning users apply directly.
for f in fsdp2 fsdp1 lightning; do
    run plan export --model samples/models/llama3-8b/config.json --plan "$out/llama3-8b.64xH100.recommended.plan.json" \
        --cluster samples/clusters/h100-sxm-8x8.json --format "$f" --output "$out/llama3-8b.64xH100.recommended.$f.json"
done
run recommend --model samples/models/llama3-70b/config.json --cluster samples/clusters/h100-sxm-64x8.json \
    --seq 4096 --format shardscope --output "$out/llama3-70b.512xH100.recommended.plan.json"
run plan export --model samples/models/llama3-70b/config.json --plan "$out/llama3-70b.512xH100.recommended.plan.json" \
    --cluster samples/clusters/h100-sxm-64x8.json --format fsdp2 --output "$out/llama3-70b.512xH100.recommended.fsdp2.json"
# The plan run for real: a tiny Llama on 2 CPU ranks (Gloo), reshard_after_forward True
# against False; the CPU profile calibrated on the first run; both simulated with it; then
# the predicted-against-measured report and the memory plot of both.
py="${SHARDSCOPE_VENV:+$SHARDSCOPE_VENV/bin/python}"
[ -n "$py" ] || py="$(sed -n 's/^SHARDSCOPE_PYTHON:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)"
[ -n "$py" ] || py=python3
run_json() {  # run_json FILE ARGS...: like run, stdout to FILE
    local file="$1"
    shift
    stage=$((stage + 1))
    printf '\n[%d] $ shardscope %s > %s\n' "$stage" "$*" "$file"
    "$ss" "$@" >"$file" || { echo "stage $stage failed: shardscope $*" >&2; exit 1; }
}
tiny=samples/models/tiny-llama/config.json
cpu=samples/clusters/cpu-2core.json
seq="${SHARDSCOPE_DEMO_SEQ:-128}"
steps="${SHARDSCOPE_DEMO_STEPS:-3}"
plans=(reshard-true:samples/plans/tiny-llama-2rank.json reshard-false:samples/plans/tiny-llama-2rank-keep.json)
for pair in "${plans[@]}"; do
    run run --model "$tiny" --plan "${pair#*:}" --cluster "$cpu" --seq "$seq" --steps "$steps" \
        --trace "$out/tiny-llama.${pair%%:*}.measured-trace.json" --output "$out/tiny-llama.${pair%%:*}.run.json"
done
# The CPU profile's figures are estimates: fit them to the first plan's run, then predict
# both plans with the fitted profile (the second is a check on a run it was not fitted to).
run calibrate --trace "$out/tiny-llama.reshard-true.measured-trace.json" --cluster "$cpu" \
    --output "$out/cpu-2core.calibrated.json"
for pair in "${plans[@]}"; do
    name="tiny-llama.${pair%%:*}"
    run_json "$out/$name.sim.json" simulate --model "$tiny" --plan "${pair#*:}" --cluster "$out/cpu-2core.calibrated.json" \
        --seq "$seq" --trace "$out/$name.sim-trace.json" --json
done
stage=$((stage + 1))
printf '\n[%d] $ python scripts/demo_report.py %s tiny-llama.reshard-true tiny-llama.reshard-false\n' "$stage" "$out"
"$py" scripts/demo_report.py "$out" tiny-llama.reshard-true tiny-llama.reshard-false ||
    { echo "stage $stage failed: the predicted-against-measured report" >&2; exit 1; }

printf '\nAll stages passed. Outputs are in %s:\n' "$out"
ls -1 "$out"
printf '\nOpen the results in the desktop app (%s):\n' "$build/gui/shardscope-gui"
printf '  shardscope-gui %s\n      the measured run: every rank and stream, the memory beneath\n' \
    "$out/tiny-llama.reshard-true.measured-trace.json"
printf '  shardscope-gui %s %s %s\n      the same plan simulated, with the what-if bar\n' "$tiny" samples/plans/tiny-llama-2rank.json "$cpu"
printf '  shardscope-gui samples/models/llama3-8b/config.json %s samples/clusters/h100-sxm-8x8.json\n      Llama-3-8B per block on 64 H100s\n' \
    "$out/llama3-8b-per-block.shardscope.json"
