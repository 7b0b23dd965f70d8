#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The CUDA paths on a GPU machine, with binaries built elsewhere (a build machine without a
# GPU, the same LibTorch as the GPU machine's python3 torch):
#
#   scripts/gpu_check.sh BIN_DIR [OUT_DIR]
#
# BIN_DIR holds shardscope, shardscope-engine and test_cupti (strip them to carry them:
# `strip -o BIN_DIR/shardscope build/engine/shardscope`, ...) and, in BIN_DIR/lib, the
# shared libraries the GPU machine lacks (libsimdjson.so.*). The binaries are run against
# the machine's torch and its nvidia/* libraries. Runs `doctor`, the CUPTI recorder's tests,
# the engine on NCCL against the unsharded reference (tests/python/test_engine_cuda.py) and
# `calibrate --measure --device cuda`, each with a time limit, and writes OUT_DIR/measured.json.
# docs/gpu-runs.md records what these printed on each GPU lent so far.
set -uo pipefail
if [ $# -lt 1 ] || [ ! -x "$1/shardscope" ]; then
    echo "usage: scripts/gpu_check.sh BIN_DIR [OUT_DIR]  (BIN_DIR/shardscope must exist)" >&2
    exit 2
fi
bin="$(cd "$1" && pwd)"
out="${2:-$(mktemp -d)}"
mkdir -p "$out"
cd "$(dirname "$0")/.." || exit 1
t0=$(date +%s)
step() { echo "[$(($(date +%s) - t0))s] $*"; }
export PYTHONUNBUFFERED=1
site="$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')" || {
    echo "error: python3 has no torch" >&2
    exit 1
}
libs="$site/torch/lib"
for d in "$site"/nvidia/*/lib; do libs="$libs:$d"; done
export LD_LIBRARY_PATH="$bin/lib:$libs:${LD_LIBRARY_PATH:-}"
# tests/python/peer.py finds the engine beside SHARDSCOPE_BIN.
mkdir -p build/engine build/tests
cp "$bin/shardscope" "$bin/shardscope-engine" build/engine/
[ -x "$bin/test_cupti" ] && cp "$bin/test_cupti" build/tests/
export SHARDSCOPE_BIN="$PWD/build/engine/shardscope"
status=0
step "doctor"
timeout 60 "$SHARDSCOPE_BIN" doctor || status=1
if [ -x build/tests/test_cupti ]; then
    step "test_cupti"
    timeout 120 build/tests/test_cupti 2>&1 | tail -6 || status=1
fi
step "the engine on NCCL (tests/python/test_engine_cuda.py)"
timeout 300 python3 tests/python/test_engine_cuda.py 2>&1 | tail -12 || status=1
step "calibrate --measure --device cuda"
timeout 180 "$SHARDSCOPE_BIN" calibrate --measure --device cuda --nproc 1 -o "$out/measured.json" || status=1
step "done (exit $status); $out/measured.json"
exit $status
