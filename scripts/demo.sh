#!/usr/bin/env bash
# The main job on the bundled samples. It grows with the project; today: the sample models
# and the plans resolved against the sample clusters. Called by `scripts/setup.sh demo`.
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
    --seq 4096 --format fsdp2 --output "$out/llama3-8b.64xH100.recommended.fsdp2.json"
run recommend --model samples/models/llama3-70b/config.json --cluster samples/clusters/h100-sxm-64x8.json \
    --seq 4096 --format shardscope --output "$out/llama3-70b.512xH100.recommended.plan.json"
for f in fsdp1 lightning; do
    run recommend --model samples/models/llama3-8b/config.json --cluster samples/clusters/h100-sxm-8x8.json \
        --seq 4096 --format "$f" --output "$out/llama3-8b.64xH100.recommended.$f.json" --json >/dev/null
    echo "wrote $out/llama3-8b.64xH100.recommended.$f.json"
done
printf '\nAll stages passed. Outputs are in %s:\n' "$out"
ls -1 "$out"
printf '\nOpen a plan in the desktop app:\n  shardscope-gui samples/models/llama3-8b/config.json %s samples/clusters/h100-sxm-8x8.json\n' \
    "$out/llama3-8b-per-block.shardscope.json"
