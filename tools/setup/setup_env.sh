#!/usr/bin/env bash
# Take a fresh machine to the pinned OpenMMLab stack in a repo-local .venv.
#
# Steps: create the venv -> torch (kept if present) -> build tools ->
# mmcv 2.0.1 wheel (built once from the PyPI sdist under C++17, cached outside
# the repo) -> mmengine/mmdet/mmrotate/mmseg -> mmnanguard in editable mode.
# A second run compares a stamp and returns in seconds.
#
# Environment:
#   VENV                 venv folder (default: .venv)
#   MMNANGUARD_CACHE     wheel cache (default: ~/.cache/mmnanguard)
#   PYTHON               interpreter for the venv (default: python3)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV="${VENV:-.venv}"
CACHE="${MMNANGUARD_CACHE:-$HOME/.cache/mmnanguard}"
PYTHON="${PYTHON:-python3}"
REQS="tools/setup/requirements.txt"
MMCV_VERSION="2.0.1"
STEP="start"

step() { STEP="$1"; echo "[setup] $1"; }
on_error() {
    echo "[setup] FAILED during step: ${STEP}" >&2
    echo "[setup] Fix the cause shown above and run 'make setup' again;" \
         "finished steps are not repeated." >&2
}
trap on_error ERR

stamp_of() {
    cat "$REQS" "tools/setup/setup_env.sh" setup.py | sha256sum | cut -c1-16
}
STAMP_FILE="$VENV/.mmnanguard-setup"
if [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$(stamp_of)" ]]; then
    echo "[setup] $VENV is up to date (delete $STAMP_FILE to force a re-install)"
    exit 0
fi

step "create virtual environment $VENV with $PYTHON"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PY="$(cd "$VENV" && pwd)/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

step "install torch (an already installed torch is kept)"
if "$PY" -c "import torch" 2>/dev/null; then
    echo "[setup] keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
    "${PIP[@]}" install "torch==2.13.0"
fi

step "install build tools (setuptools>=77,<81, ninja, wheel, numpy)"
"${PIP[@]}" install "setuptools>=77,<81" ninja wheel numpy

TORCH_TAG="$("$PY" -c 'import sys, torch; print(f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}".replace("+", "_"))')"
WHEEL_DIR="$CACHE/wheels/$TORCH_TAG"
step "mmcv $MMCV_VERSION wheel for $TORCH_TAG (cache: $WHEEL_DIR)"
if ! ls "$WHEEL_DIR"/mmcv-"$MMCV_VERSION"-*.whl >/dev/null 2>&1; then
    BUILD="$(mktemp -d)"
    step "download the mmcv $MMCV_VERSION sdist"
    "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation \
        "mmcv==$MMCV_VERSION" -d "$BUILD"
    tar -xzf "$BUILD/mmcv-$MMCV_VERSION.tar.gz" -C "$BUILD"
    # mmcv 2.0.1 passes -std=c++14; torch >= 2.1 headers need C++17
    # (fixed upstream in mmcv 2.1.0).
    sed -i 's/c++14/c++17/g' "$BUILD/mmcv-$MMCV_VERSION/setup.py"
    step "compile mmcv $MMCV_VERSION with ops under C++17 (about 9 minutes on 2 cores)"
    mkdir -p "$WHEEL_DIR"
    (cd "$BUILD/mmcv-$MMCV_VERSION" && \
        MAX_JOBS="${MAX_JOBS:-$(nproc)}" MMCV_WITH_OPS=1 FORCE_CUDA="${FORCE_CUDA:-0}" \
        "$PY" -m pip --disable-pip-version-check -q wheel --no-deps \
            --no-build-isolation . -w "$BUILD/out")
    mv "$BUILD"/out/mmcv-*.whl "$WHEEL_DIR/"
    rm -rf "$BUILD"
fi

step "install the mmcv wheel and the pinned OpenMMLab packages"
"${PIP[@]}" install "$WHEEL_DIR"/mmcv-"$MMCV_VERSION"-*.whl -r "$REQS"

step "install mmnanguard in editable mode"
"${PIP[@]}" install --no-deps --no-build-isolation -e .

step "check that the stack imports"
"$PY" -c "import mmnanguard, mmcv.ops, mmdet, mmrotate, mmseg; print('[setup] ok:', 'mmcv', mmcv.__version__, 'mmdet', mmdet.__version__, 'mmrotate', mmrotate.__version__, 'mmseg', mmseg.__version__)"
stamp_of > "$STAMP_FILE"
echo "[setup] done"
