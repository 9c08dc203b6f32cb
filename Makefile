# Two commands for a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: demo demo-reset sdk wheel test check bench install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# One stamp per set of extras: `make demo` installs the node and the demo's datasets only
# (no torch), `make sdk` adds the data scientist's SDK, `make test` everything.
$(VENV)/.installed-%: pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[$*]'
	touch $@

install: $(VENV)/.installed-dev
sdk: $(VENV)/.installed-sdk

## Start a node on 127.0.0.1:8000 with demo accounts and datasets.
demo: $(VENV)/.installed-demo
	$(VENV)/bin/dpnode serve --demo --host $(HOST) --port $(PORT)

## Stop `make demo` first: forget its accounts' spending, uploads and policies, and start afresh.
demo-reset:
	rm -rf dpnode-data
	$(MAKE) demo

## A wheel for analysts and operators elsewhere: dist/dpnode-VERSION-py3-none-any.whl
## (then `pip install 'dist/dpnode-VERSION-py3-none-any.whl[sdk]'`).
wheel: | $(PY)
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .

## Install, then check lint, types and migrations, and run the whole suite
## (SQLite, and a real PostgreSQL server that the tests start themselves) on every core:
## one pytest-xdist worker a core, each test on its own but a module's tests kept together
## when they share a module-scoped fixture (conftest.py). WORKERS=0 runs it in one process.
WORKERS ?= auto
test: install
	scripts/ensure-postgres
	scripts/ensure-chromium
	scripts/ensure-s3rver
	PY=$(PY) scripts/check
	$(PY) -m pytest -n $(WORKERS) --dist loadgroup

## Lint, format check, types and migration drift (what reviewers expect before a merge).
check: install
	scripts/check

## Every benchmark, each printing ratios against a baseline measured in the same run.
bench: install
	$(PY) -m bench.engine
	$(PY) -m bench.noise
	$(PY) -m bench.publish
	$(PY) -m bench.dask_publish
	$(PY) -m bench.sdk
	$(PY) -m bench.tracking
	$(PY) -m bench.dpsgd
	$(PY) -m bench.upload --rows 10000000
	$(PY) -m bench.utility
	$(PY) -m bench.utility_stats
	$(PY) -m bench.amplification
	$(PY) -m bench.load

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
