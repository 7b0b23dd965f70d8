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
printf '\nAll stages passed. Exports are in %s\n' "$out"
