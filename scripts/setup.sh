#!/usr/bin/env bash
# ShardScope set-up: Debian packages, the pinned torch wheel in a cached virtual
# environment, and the build. Idempotent: a second run only checks and rebuilds what
# changed (seconds). Then runs the requested job:
#
#   scripts/setup.sh demo     set up, then run the main job on the bundled samples
#   scripts/setup.sh test     set up, then run the whole test suite (what CI runs)
#   scripts/setup.sh build    set up only
#
# Environment:
#   SHARDSCOPE_CACHE   cache root outside the checkout [${XDG_CACHE_HOME:-~/.cache}/shardscope]
#   SHARDSCOPE_BUILD   build directory [<checkout>/build]
#   SHARDSCOPE_NO_APT  set to 1 to skip the apt step (packages installed by other means)
#   CCACHE_DIR         ccache's cache [~/.cache/ccache]
set -euo pipefail

job="${1:-build}"
case "$job" in demo | test | build) ;; -h | --help)
    sed -n '2,16p' "$0"
    exit 0
    ;;
*)
    echo "usage: scripts/setup.sh [demo|test|build]" >&2
    exit 2
    ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SHARDSCOPE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardscope}"
build="${SHARDSCOPE_BUILD:-$root/build}"
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# Paths inside the checkout are hashed relative to it and the working directory not at all,
# so a fresh clone elsewhere (CI's) hits what another checkout compiled.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
mkdir -p "$cache" "$CCACHE_DIR"
t0=$(date +%s)
step() { printf '\n==> [%ss] %s\n' "$(($(date +%s) - t0))" "$*"; }

# --- 1. Debian packages --------------------------------------------------------------------
packages=(build-essential cmake ninja-build ccache pkg-config git python3 python3-venv python3-pip
    nlohmann-json3-dev libsimdjson-dev libgtest-dev libgmock-dev zlib1g-dev libgloo-dev
    qt6-base-dev qt6-charts-dev libqt6opengl6-dev xvfb xauth clang libclang-rt-14-dev)
if [ "${SHARDSCOPE_NO_APT:-0}" != 1 ]; then
    step "checking Debian packages"
    missing=()
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing: ${missing[*]}"
        sudo=""
        [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -q
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        echo "all ${#packages[@]} packages present"
    fi
fi

# --- 2. Python environment with the pinned torch wheel -----------------------------------
step "checking the Python environment"
python="${SHARDSCOPE_PYTHON_BIN:-$(command -v python3)}"
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
req="$root/scripts/requirements.txt"
reqnodeps="$root/scripts/requirements-nodeps.txt"
reqhash="$(cat "$req" "$reqnodeps" | sha256sum | cut -c1-12)"
venv="$cache/venv-py$pyver"
stamp="$venv/.shardscope-requirements-$reqhash"
if [ ! -f "$stamp" ]; then
    echo "creating $venv (torch wheel download is ~1 GB with its CUDA libraries; cached after)"
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q --progress-bar on -r "$req"
    "$venv/bin/python" -m pip install -q --no-deps -r "$reqnodeps"
    rm -f "$venv"/.shardscope-requirements-*
    touch "$stamp"
else
    echo "cached: $venv ($(grep -E '^torch==' "$req"))"
fi
export SHARDSCOPE_VENV="$venv"

# --- 3. Build ------------------------------------------------------------------------------
step "configuring and building in $build"
if [ ! -f "$build/build.ninja" ]; then
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DSHARDSCOPE_PYTHON="$venv/bin/python"
fi
cmake --build "$build" -- -j"$(nproc)"
if command -v ccache >/dev/null; then ccache -s 2>/dev/null | grep -E "Hits|hit rate" | head -2 || true; fi
export PATH="$build/engine:$build/gui:$PATH"

# --- 4. The job ----------------------------------------------------------------------------
case "$job" in
build)
    step "built: $build/engine/shardscope"
    ;;
demo)
    step "running the main job on the bundled samples"
    exec bash "$root/scripts/demo.sh" "$build"
    ;;
test)
    step "running the test suite"
    cd "$build"
    export QT_QPA_PLATFORM=offscreen
    # Every layer (labels unit, peer, slow, fuzz, gpu, gui: docs/testing.md); ctest ends
    # with the time each label took.
    ctest --output-on-failure -j"$(nproc)" --timeout 900
    step "done in $(($(date +%s) - t0)) s"
    ;;
esac
