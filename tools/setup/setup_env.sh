#!/usr/bin/env bash
# Take a fresh machine to one supported stack in its own repo-local venv.
#
#   make setup                 # STACK=rotate, .venv (the development stack)
#   make setup STACK=mmdet     # .venv-mmdet; also onedl, core
#
# Steps: create the venv -> torch (an installed one is kept in the
# development stack) -> build tools -> the stack's mmcv wheel (built once
# from its PyPI sdist, its C++ standard raised where the stack's torch needs
# it, cached outside the repo) -> the stack's packages (tools/setup/stacks/STACK.txt)
# -> mmnanguard in editable mode (the development stack only) -> an import
# check. The stacks are defined in tools/setup/stacks/define.sh. A second
# run compares a stamp and returns in seconds.
#
# Environment:
#   STACK                rotate (default), mmdet, onedl or core
#   MMNANGUARD_VENV      venv folder (default: the stack's, see define.sh)
#   MMNANGUARD_CACHE     wheel cache (default: ~/.cache/mmnanguard)
#   PYTHON               interpreter for the venv (default: python3)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
STACK="${STACK:-rotate}"
# shellcheck source=stacks/define.sh
source tools/setup/stacks/define.sh
VENV="${MMNANGUARD_VENV:-$STACK_VENV}"
CACHE="${MMNANGUARD_CACHE:-$HOME/.cache/mmnanguard}"
PYTHON="${PYTHON:-python3}"
STEP="start"

step() { STEP="$1"; echo "[setup $STACK] $1"; }
on_error() {
    echo "[setup $STACK] FAILED during step: ${STEP}" >&2
    echo "[setup $STACK] Fix the cause shown above and run" \
         "'make setup STACK=$STACK' again; finished steps are not repeated." >&2
}
trap on_error ERR

stamp_of() {
    cat "$STACK_REQS" "${STACK_NODEPS_REQS[@]}" tools/setup/stacks/define.sh \
        tools/setup/setup_env.sh setup.py pyproject.toml | sha256sum | cut -c1-16
}
STACK_NODEPS_REQS=()
[[ ! -f "tools/setup/stacks/$STACK-nodeps.txt" ]] || \
    STACK_NODEPS_REQS=("tools/setup/stacks/$STACK-nodeps.txt")
STAMP_FILE="$VENV/.mmnanguard-setup"
if [[ -f "$STAMP_FILE" && "$(cat "$STAMP_FILE")" == "$(stamp_of)" ]]; then
    echo "[setup $STACK] $VENV is up to date (delete $STAMP_FILE to force a re-install)"
    exit 0
fi

step "create virtual environment $VENV with $PYTHON"
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PY="$(cd "$VENV" && pwd)/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

TORCH_REQS=("torch==$TORCH_VERSION")
[[ -z "$TORCHVISION_VERSION" ]] || TORCH_REQS+=("torchvision==$TORCHVISION_VERSION")
if [[ "$EDITABLE" == "1" ]] && "$PY" -c "import torch" 2>/dev/null; then
    step "keep the installed torch (the development stack takes yours)"
    echo "[setup $STACK] keeping torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
    step "install ${TORCH_REQS[*]}"
    "${PIP[@]}" install "${TORCH_REQS[@]}"
fi

step "install build tools (setuptools>=77,<81, ninja, wheel, numpy)"
"${PIP[@]}" install "setuptools>=77,<81" ninja wheel numpy

TORCH_TAG="$("$PY" -c 'import sys, torch; print(f"torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}".replace("+", "_"))')"
WHEEL_DIR="$CACHE/wheels/$TORCH_TAG"
step "$MMCV_DIST $MMCV_VERSION wheel for $TORCH_TAG (cache: $WHEEL_DIR)"
if ! ls "$WHEEL_DIR/$MMCV_FILE"-*.whl >/dev/null 2>&1; then
    BUILD="$(mktemp -d)"
    step "download the $MMCV_DIST $MMCV_VERSION sdist"
    "${PIP[@]}" download --no-deps --no-binary :all: --no-build-isolation \
        "$MMCV_DIST==$MMCV_VERSION" -d "$BUILD"
    tar -xzf "$BUILD/$MMCV_FILE.tar.gz" -C "$BUILD"
    if [[ -n "$MMCV_CXX" ]]; then
        sed -i "s/c++1[47]/c++$MMCV_CXX/g" "$BUILD/$MMCV_FILE/setup.py"
    fi
    step "compile $MMCV_DIST $MMCV_VERSION with ops (9 to 14 minutes on 2 cores)"
    mkdir -p "$WHEEL_DIR"
    (cd "$BUILD/$MMCV_FILE" && \
        MAX_JOBS="${MAX_JOBS:-$(nproc)}" MMCV_WITH_OPS=1 FORCE_CUDA="${FORCE_CUDA:-0}" \
        "$PY" -m pip --disable-pip-version-check -q wheel --no-deps \
            --no-build-isolation . -w "$BUILD/out")
    mv "$BUILD/out/$MMCV_FILE"-*.whl "$WHEEL_DIR/"
    rm -rf "$BUILD"
fi

step "install the $MMCV_DIST wheel and the packages of $STACK_REQS"
"${PIP[@]}" install "$WHEEL_DIR/$MMCV_FILE"-*.whl -r "$STACK_REQS"
if [[ ${#STACK_NODEPS_REQS[@]} -gt 0 ]]; then
    step "install the packages of ${STACK_NODEPS_REQS[0]} (--no-deps)"
    "${PIP[@]}" install --no-deps -r "${STACK_NODEPS_REQS[0]}"
fi

if [[ "$EDITABLE" == "1" ]]; then
    step "install mmnanguard in editable mode"
    "${PIP[@]}" install --no-deps --no-build-isolation -e .
fi

step "check that the stack imports (${PRESENT}) and lacks (${ABSENT:-nothing})"
PRESENT="$PRESENT" ABSENT="$ABSENT" EDITABLE="$EDITABLE" STACK="$STACK" "$PY" - <<'PYEOF'
import importlib
import importlib.util
import os

import mmcv.ops  # noqa: F401
import mmengine

found = {'mmengine': mmengine.__version__, 'mmcv': mmcv.__version__}
for name in os.environ['PRESENT'].split():
    found[name] = importlib.import_module(name).__version__
extra = [n for n in os.environ['ABSENT'].split() if importlib.util.find_spec(n)]
if extra:
    raise SystemExit(f'stack {os.environ["STACK"]} must not have {extra}')
if os.environ['EDITABLE'] == '1':
    import mmnanguard  # noqa: F401
print(f'[setup {os.environ["STACK"]}] ok:',
      ', '.join(f'{k} {v}' for k, v in found.items()))
PYEOF
stamp_of > "$STAMP_FILE"
echo "[setup $STACK] done"
