#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer harnesses (clang++, ASan + UBSan) and runs each for a while.
#
#   scripts/fuzz.sh [SECONDS_PER_HARNESS] [HARNESS...]     (default 60 s, all harnesses)
#
# Harnesses (tests/fuzz): plan, model, cluster (the JSON loaders, then resolution or a round
# trip), kineto and kineto_gz (the trace importer on plain and gzip input, then every
# analysis of a loaded trace), step_trace (ShardScope's own traces). Each corpus lives in
# $SHARDSCOPE_FUZZ_CORPUS/<harness> (default ~/.cache/shardscope/fuzz-corpus), seeded from
# samples/ and the small real traces of ../shared/data/traces, and grows from run to run.
# A crash, a sanitizer report or an escaping exception stops that harness and writes the
# input as crash-* in the corpus folder; the script then exits 1 naming it. CI runs it
# for 60 s per harness (the `fuzz_smoke` test); a longer run, e.g. 20 minutes each:
#
#   scripts/fuzz.sh 1200
#
# or a fixed number of executions per harness (the issue's bar is a million each):
#
#   SHARDSCOPE_FUZZ_RUNS=1000000 scripts/fuzz.sh 86400
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(plan model cluster kineto kineto_gz step_trace alloc_history)
build="$(realpath -m "${SHARDSCOPE_FUZZ_BUILD:-${SHARDSCOPE_BUILD:-$root/build}-fuzz}")"
corpus="$(realpath -m "${SHARDSCOPE_FUZZ_CORPUS:-$HOME/.cache/shardscope/fuzz-corpus}")"
traces="${SHARDSCOPE_SHARED_TRACES:-$root/../shared/data/traces}"

if ! command -v clang++ >/dev/null; then
    echo "SKIP: scripts/fuzz.sh needs clang++ with libFuzzer (Debian: clang libclang-rt-14-dev)"
    exit 77
fi
if [ ! -f "$build/build.ninja" ]; then
    CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CXX_COMPILER=clang++ -DSHARDSCOPE_FUZZ=ON >/dev/null
fi
echo "building the harnesses in $build"
if ! build_log="$(cmake --build "$build" -- -j"$(nproc)" 2>&1)"; then
    echo "error: building the harnesses failed (clang++ $(clang++ -dumpversion)):"
    printf '%s\n' "$build_log" | grep -E -A8 "error|FAILED" | head -60
    exit 2
fi

# Seeds (copied once; a corpus that exists keeps what earlier runs found).
seed() {  # seed HARNESS FILE...
    local dir="$corpus/$1"
    shift
    mkdir -p "$dir"
    for f in "$@"; do
        [ -f "$f" ] || continue
        local name
        name="seed-$(basename "$(dirname "$f")")-$(basename "$f" .gz)"
        [ -f "$dir/$name" ] || case "$f" in
            *.gz) gzip -dc "$f" >"$dir/$name" ;;
            *) cp "$f" "$dir/$name" ;;
        esac
    done
}
seed plan "$root"/samples/plans/*.json
seed model "$root"/samples/models/*/config.json "$root"/samples/models/*.json
seed cluster "$root"/samples/clusters/*.json
small_traces=("$traces/HolisticTraceAnalysis/tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    "$traces/HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
seed kineto "${small_traces[@]}" "$root"/tests/data/hostile-traces/*.json
seed kineto_gz "${small_traces[@]}"
seed alloc_history "$root"/tests/data/h200-llama8b-4layers/memory-history.json.gz
mkdir -p "$corpus/step_trace"
if [ -x "$root/build/engine/shardscope" ] && [ ! -f "$corpus/step_trace/seed-tiny-llama-sim" ]; then
    "$root/build/engine/shardscope" simulate -m "$root/samples/models/tiny-llama/config.json" \
        -p "$root/samples/plans/tiny-llama-2rank.json" -c "$root/samples/clusters/cpu-2core.json" \
        --trace "$corpus/step_trace/seed-tiny-llama-sim" >/dev/null 2>&1 || true
    cp "$corpus/step_trace/seed-tiny-llama-sim" "$corpus/kineto/" 2>/dev/null || true
fi

status=0
for h in "${harnesses[@]}"; do
    bin="$build/tests/fuzz/fuzz_$h"
    [ -x "$bin" ] || { echo "error: no harness fuzz_$h in $build"; exit 2; }
    log="$corpus/$h.log"
    # -rss_limit_mb: a parse that needs more than 2 GB is a bug; -timeout: a hang is one.
    if (cd "$corpus/$h" && ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
        "$bin" "$corpus/$h" -max_total_time="$seconds" ${SHARDSCOPE_FUZZ_RUNS:+-runs=$SHARDSCOPE_FUZZ_RUNS} \
        -max_len=262144 -timeout=20 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$corpus/$h/" >"$log" 2>&1); then
        runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
        took=$(grep -E '^Done [0-9]+ runs in' "$log" | awk '{print $5}')
        echo "fuzz_$h: ${runs:-?} executions in ${took:-$seconds} s, no crash, no sanitizer report (corpus $(ls "$corpus/$h" | wc -l) inputs)"
    else
        echo "fuzz_$h: FAILED; the input is in $corpus/$h/ (crash-*, timeout-* or oom-*); log: $log"
        grep -E "ERROR|runtime error|SUMMARY|terminate|what\(\)|No such" "$log" | head -5 || true
        status=1
    fi
done
exit $status
