#!/usr/bin/env bash
# Build the mmnanguard wheel and check it on one supported stack, installed
# the way a user installs it into the environment they already have:
#
#   1. tools/setup/setup_env.sh builds the stack's venv, which holds the
#      stack and no mmnanguard (cached: seconds);
#   2. a copy of the source tree (the files git tracks or would track) is
#      built into a wheel with `pip wheel --no-deps`, so that the working
#      tree (its mmnanguard/.mim links, build/) is left as it is;
#   3. the wheel is installed, not editable, into the stack's venv;
#   4. from an empty folder outside the repository,
#      tools/setup/wheel_smoke.py checks the wheel's files, the import, the
#      registries, the console entry points, protected runs of a detector,
#      a segmenter and a rotated detector (as far as the stack has mmseg
#      and mmrotate) with a planted NaN gradient, a resume, and the errors
#      of configs that need a missing mmrotate;
#   5. where the stack has pytest, the tests marked `stack_smoke` (the safe
#      modules against the upstream modules of this stack, the optional
#      packages) run from the copy, with its mmnanguard/ removed, so that
#      they import the installed wheel.
#
#   bash tools/setup/check_wheel.sh            # STACK=core
#   STACK=onedl bash tools/setup/check_wheel.sh
#
# Environment:
#   STACK                core (default), mmdet, onedl or toolboxes (not
#                        rotate: its venv is the editable development
#                        install)
#   MMNANGUARD_CACHE     wheel cache (default: ~/.cache/mmnanguard)
#   KEEP_WHEEL_TMP=1     keep the temporary folder (its path is printed)
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
STACK="${STACK:-core}"
# shellcheck source=stacks/define.sh
source tools/setup/stacks/define.sh
if [[ "$EDITABLE" == "1" ]]; then
    echo "[check-wheel $STACK] stack $STACK holds the editable install;" \
         "check the wheel on one of the other stacks" >&2
    exit 2
fi
VENV="$STACK_VENV"
STEP="start"
START=$SECONDS

step() { STEP="$1"; echo "[check-wheel $STACK] $1"; }
on_error() {
    echo "[check-wheel $STACK] FAILED during step: ${STEP}" >&2
}
trap on_error ERR

step "stack venv $VENV (tools/setup/setup_env.sh)"
STACK="$STACK" MMNANGUARD_VENV="$VENV" bash tools/setup/setup_env.sh
PY="$(cd "$VENV" && pwd)/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

TMP="$(mktemp -d)"
if [[ "${KEEP_WHEEL_TMP:-0}" == "1" ]]; then
    echo "[check-wheel $STACK] keeping $TMP"
else
    trap 'rm -rf "$TMP"' EXIT
fi

step "copy the source tree (git ls-files) to $TMP/src"
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "[check-wheel $STACK] $ROOT is not a git checkout: the files to" \
         "build are the ones git tracks or would track" >&2
    false
fi
mkdir -p "$TMP/src" "$TMP/dist" "$TMP/project"
git ls-files -z --cached --others --exclude-standard \
    | xargs -0 sh -c 'for f; do [ ! -e "$f" ] || printf "%s\0" "$f"; done' _ \
    | tar --null -T - -cf - | tar -xf - -C "$TMP/src"

step "build the wheel (pip wheel --no-deps)"
"${PIP[@]}" wheel "$TMP/src" --no-deps --no-build-isolation -w "$TMP/dist"
WHEEL="$(ls "$TMP"/dist/mmnanguard-*.whl)"
echo "[check-wheel $STACK] built $(basename "$WHEEL")"

step "install the wheel into $VENV (not editable)"
"${PIP[@]}" install --no-deps --force-reinstall "$WHEEL"

step "check it from a folder outside the repository"
(cd "$TMP/project" && \
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PY" "$ROOT/tools/setup/wheel_smoke.py" \
        --wheel "$WHEEL" --source "$TMP/src" --stack "$STACK" \
        --present $PRESENT --absent $ABSENT)

if "$PY" -c "import pytest" 2>/dev/null; then
    step "the stack_smoke tests against the installed wheel"
    rm -rf "$TMP/src/mmnanguard" "$TMP/src/build"
    (cd "$TMP/src" && OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
        "$(dirname "$PY")/pytest" -q -m stack_smoke -p no:cacheprovider tests)
fi
echo "[check-wheel $STACK] passed in $((SECONDS - START)) s"
