#!/usr/bin/env bash
# Build the mmnanguard wheel and check it in the core venv (mmengine, mmcv
# and mmdet, no mmrotate, no mmseg), installed like a user installs it:
#
#   1. tools/setup/core_env.sh builds the core venv (cached: seconds);
#   2. a copy of the source tree (the files git tracks or would track) is
#      built into a wheel with `pip wheel --no-deps`, so that the working
#      tree (its mmnanguard/.mim links, build/) is left as it is;
#   3. the wheel is installed, not editable, into the core venv;
#   4. from an empty folder outside the repository,
#      tools/setup/wheel_smoke.py checks the wheel's files, the import,
#      the registries, the console entry points, a 2-iteration RetinaNet
#      run protected through `mmnanguard::` with a planted NaN gradient,
#      and the errors of configs that need mmrotate.
#
# Environment:
#   CORE_VENV            core venv folder (default: .venv-core)
#   MMNANGUARD_CACHE     wheel cache (default: ~/.cache/mmnanguard)
#   KEEP_WHEEL_TMP=1     keep the temporary folder (its path is printed)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VENV="${CORE_VENV:-.venv-core}"
STEP="start"
START=$SECONDS

step() { STEP="$1"; echo "[check-wheel] $1"; }
on_error() {
    echo "[check-wheel] FAILED during step: ${STEP}" >&2
}
trap on_error ERR

step "core venv $VENV (tools/setup/core_env.sh)"
CORE_VENV="$VENV" bash tools/setup/core_env.sh
PY="$(cd "$VENV" && pwd)/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

TMP="$(mktemp -d)"
if [[ "${KEEP_WHEEL_TMP:-0}" == "1" ]]; then
    echo "[check-wheel] keeping $TMP"
else
    trap 'rm -rf "$TMP"' EXIT
fi

step "copy the source tree (git ls-files) to $TMP/src"
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "[check-wheel] $ROOT is not a git checkout: the files to build" \
         "are the ones git tracks or would track" >&2
    false
fi
mkdir -p "$TMP/src" "$TMP/dist" "$TMP/project"
git ls-files -z --cached --others --exclude-standard \
    | xargs -0 sh -c 'for f; do [ ! -e "$f" ] || printf "%s\0" "$f"; done' _ \
    | tar --null -T - -cf - | tar -xf - -C "$TMP/src"

step "build the wheel (pip wheel --no-deps)"
"${PIP[@]}" wheel "$TMP/src" --no-deps --no-build-isolation -w "$TMP/dist"
WHEEL="$(ls "$TMP"/dist/mmnanguard-*.whl)"
echo "[check-wheel] built $(basename "$WHEEL")"

step "install the wheel into $VENV (not editable)"
"${PIP[@]}" install --no-deps --force-reinstall "$WHEEL"

step "check it from a folder outside the repository"
cd "$TMP/project"
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PY" "$ROOT/tools/setup/wheel_smoke.py" \
    --wheel "$WHEEL" --source "$TMP/src"
echo "[check-wheel] passed in $((SECONDS - START)) s"
