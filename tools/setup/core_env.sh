#!/usr/bin/env bash
# Build the core venv: torch, mmengine, mmcv and mmdet, without mmrotate
# and mmseg, and without mmnanguard (tools/setup/check_wheel.sh installs the
# built wheel into it). It reuses the mmcv wheel that tools/setup/setup_env.sh
# compiled and cached; nothing is compiled here. A second run compares a
# stamp and returns in seconds.
#
# Environment:
#   CORE_VENV            venv folder (default: .venv-core)
#   MMNANGUARD_CACHE     wheel cache (default: ~/.cache/mmnanguard)
#   PYTHON               interpreter for the venv (default: python3)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV="${CORE_VENV:-.venv-core}"
CACHE="${MMNANGUARD_CACHE:-$HOME/.cache/mmnanguard}"
PYTHON="${PYTHON:-python3}"
REQS="tools/setup/requirements-core.txt"
MMCV_VERSION="2.0.1"
TORCH_VERSION="2.13.0"
STEP="start"

step() { STEP="$1"; echo "[core-env] $1"; }
on_error() {
    echo "[core-env] FAILED during step: ${STEP}" >&2
    echo "[core-env] Fix the cause shown above and run" \
         "'bash tools/setup/core_env.sh' again." >&2
}
trap on_error ERR

stamp_of() {
    cat "$REQS" "tools/setup/core_env.sh" | sha256sum | cut -c1-16
}
STAMP_FILE="$VENV/.mmnanguard-core"
if [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$(stamp_of)" ]]; then
    echo "[core-env] $VENV is up to date (delete $STAMP_FILE to rebuild)"
    exit 0
fi

step "create virtual environment $VENV with $PYTHON"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PY="$(cd "$VENV" && pwd)/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

step "install torch $TORCH_VERSION"
"$PY" -c "import torch" 2>/dev/null || "${PIP[@]}" install "torch==$TORCH_VERSION"

step "install setuptools, wheel and numpy"
"${PIP[@]}" install "setuptools>=77,<81" wheel numpy

TORCH_TAG="$("$PY" -c 'import sys, torch; print(f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}".replace("+", "_"))')"
WHEEL_DIR="$CACHE/wheels/$TORCH_TAG"
step "find the cached mmcv $MMCV_VERSION wheel in $WHEEL_DIR"
if ! ls "$WHEEL_DIR"/mmcv-"$MMCV_VERSION"-*.whl >/dev/null 2>&1; then
    echo "[core-env] no mmcv-$MMCV_VERSION wheel in $WHEEL_DIR:" \
         "run 'make setup' first, it compiles and caches it" >&2
    false
fi

step "install the mmcv wheel, mmengine and mmdet (no mmrotate, no mmseg)"
"${PIP[@]}" install "$WHEEL_DIR"/mmcv-"$MMCV_VERSION"-*.whl -r "$REQS"

step "check that the core stack imports and has no mmrotate or mmseg"
"$PY" - <<'PYEOF'
import importlib.util

import mmcv.ops  # noqa: F401
import mmdet

extra = [n for n in ('mmrotate', 'mmseg') if importlib.util.find_spec(n)]
if extra:
    raise SystemExit(f'[core-env] the core venv must not have {extra}')
print('[core-env] ok: mmcv', mmcv.__version__, 'mmdet', mmdet.__version__)
PYEOF
stamp_of > "$STAMP_FILE"
echo "[core-env] done"
