# mmnanguard: `make demo` runs the main job, `make test` the test suite.
# Both run `make setup` first, which builds .venv with the pinned stack
# (the first time about 12 minutes: mmcv is compiled; afterwards seconds).
# `make test` ends with `make test-wheel`: the built wheel, installed into
# .venv-core (mmengine, mmcv, mmdet; no mmrotate, no mmseg), trains a
# protected RetinaNet from a folder outside the repository.
VENV ?= .venv
PY := $(VENV)/bin/python
LINT_PATHS := mmnanguard tools tests benchmarks configs setup.py

.PHONY: setup core-env demo test test-wheel lint format bench clean

setup:
	@bash tools/setup/setup_env.sh

core-env: setup
	@bash tools/setup/core_env.sh

demo: setup
	$(PY) tools/demo.py

lint: setup
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)

format: setup
	$(PY) -m ruff check --fix $(LINT_PATHS)
	$(PY) -m ruff format $(LINT_PATHS)

test: setup lint
	$(PY) -m pytest tests
	@$(MAKE) --no-print-directory test-wheel

test-wheel: setup
	@bash tools/setup/check_wheel.sh

bench: setup
	$(PY) benchmarks/overhead.py

clean:
	rm -rf work_dirs .pytest_cache .ruff_cache
