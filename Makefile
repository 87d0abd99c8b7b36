# mmnanguard: `make demo` runs the main job, `make test` the test suite
# (`make test-fast`: lint and the tests not marked slow).
# Both first build .venv, the development stack `rotate` (the first time
# about 12 minutes: mmcv is compiled; afterwards seconds).
# `make setup STACK=NAME` builds the venv of another supported stack
# (tools/setup/stacks/define.sh: mmdet, onedl, core, toolboxes).
# `make test` ends with `make test-stacks`: on each of core, mmdet, onedl and
# toolboxes the built wheel, installed into that stack's venv, trains
# protected configs from a folder outside the repository, and the tests
# marked stack_smoke run against it. Those stacks' venvs (and mmcv wheels)
# are set up in the background, at the lowest priority, while the suite
# runs (tools/setup/stacks_in_background.sh).
STACK ?= rotate
VENV := .venv
PY := $(VENV)/bin/python
LINT_PATHS := mmnanguard tools tests benchmarks configs setup.py
CHECKED_STACKS := core mmdet onedl toolboxes
WHEEL_STACK := $(if $(filter rotate,$(STACK)),core,$(STACK))

.PHONY: setup dev demo test test-fast test-wheel test-stacks lint format bench clean

setup:
	@STACK=$(STACK) bash tools/setup/setup_env.sh

dev:
	@STACK=rotate bash tools/setup/setup_env.sh

demo: dev
	$(PY) tools/demo.py

lint: dev
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)
	$(PY) -m mypy

format: dev
	$(PY) -m ruff check --fix $(LINT_PATHS)
	$(PY) -m ruff format $(LINT_PATHS)

test: dev lint
	@bash tools/setup/stacks_in_background.sh start $(CHECKED_STACKS)
	@$(PY) -m pytest tests \
	    || { bash tools/setup/stacks_in_background.sh stop; exit 1; }
	@bash tools/setup/stacks_in_background.sh wait
	@$(MAKE) --no-print-directory test-stacks

# lint and the tests not marked slow (a few minutes), for development
test-fast: dev lint
	$(PY) -m pytest tests -m "not slow"

test-wheel:
	@STACK=$(WHEEL_STACK) bash tools/setup/check_wheel.sh

test-stacks:
	@failed=""; for stack in $(CHECKED_STACKS); do \
	    STACK=$$stack bash tools/setup/check_wheel.sh || failed="$$failed $$stack"; \
	done; \
	if [ -n "$$failed" ]; then echo "[test-stacks] FAILED on:$$failed" >&2; exit 1; fi; \
	echo "[test-stacks] passed on: $(CHECKED_STACKS)"

bench: dev
	$(PY) benchmarks/overhead.py

clean:
	rm -rf work_dirs .pytest_cache .ruff_cache
