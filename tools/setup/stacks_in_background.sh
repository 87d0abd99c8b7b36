#!/usr/bin/env bash
# Build the venvs of the checked stacks (their mmcv wheels compiled once,
# cached outside the repository) in the background while the test suite
# runs, at the lowest CPU and I/O priority, so that a fresh clone does
# not compile them one after another after the suite.
#
#   bash tools/setup/stacks_in_background.sh start STACK...
#   bash tools/setup/stacks_in_background.sh wait
#   bash tools/setup/stacks_in_background.sh stop
#
# `start` returns at once; its log is work_dirs/stack_setup/setup.log.
# `wait` blocks until it has ended and prints how it ended; a stack whose
# setup failed here is set up again (and its error shown) by
# tools/setup/check_wheel.sh. With every stack up to date both take
# seconds. `stop` ends the setup and every process it started (after a
# failed suite, so that nothing is left compiling).
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
DIR="work_dirs/stack_setup"
ACTION="${1:-}"
shift || true

case "$ACTION" in
    start)
        mkdir -p "$DIR"
        rm -f "$DIR/status"
        STACKS="$*"
        # lowest priority where the tools exist. No new session: with the
        # kernel's autogroups a session gets its own group, which the
        # scheduler shares the CPUs with equally whatever its nice value
        # (measured: the suite ran at half speed beside it)
        LOW=(nice -n 19)
        ! command -v ionice >/dev/null || LOW+=(ionice -c 3)
        nohup "${LOW[@]}" bash -c '
            start=$SECONDS
            for stack in '"$STACKS"'; do
                if ! STACK=$stack bash tools/setup/setup_env.sh; then
                    echo "failed on $stack after $((SECONDS - start)) s" \
                        > "'"$DIR"'/status"
                    exit 1
                fi
            done
            echo "done in $((SECONDS - start)) s" > "'"$DIR"'/status"
        ' > "$DIR/setup.log" 2>&1 < /dev/null &
        echo $! > "$DIR/pid"
        echo "[stacks] setting up $STACKS in the background" \
             "(log: $DIR/setup.log)"
        ;;
    wait)
        [[ -f "$DIR/pid" ]] || exit 0
        pid="$(cat "$DIR/pid")"
        waited=$SECONDS
        while kill -0 "$pid" 2>/dev/null; do sleep 5; done
        rm -f "$DIR/pid"
        echo "[stacks] background setup: $(cat "$DIR/status" 2>/dev/null \
             || echo 'ended without a status') (waited" \
             "$((SECONDS - waited)) s after the suite)"
        ;;
    stop)
        [[ -f "$DIR/pid" ]] || exit 0
        pid="$(cat "$DIR/pid")"
        rm -f "$DIR/pid"
        tree() { local c; for c in $(pgrep -P "$1"); do tree "$c"; done; echo "$1"; }
        kill $(tree "$pid") 2>/dev/null || true
        echo "[stacks] background setup stopped"
        ;;
    *)
        echo "usage: $0 start STACK... | wait | stop" >&2
        exit 2
        ;;
esac
