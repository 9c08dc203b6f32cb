# Two commands for a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: demo test check bench install clean

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

## Start a node on 127.0.0.1:8000 with demo accounts and datasets.
demo: install
	$(VENV)/bin/dpnode serve --demo --host $(HOST) --port $(PORT)

## Install, then check lint, types and migrations, and run the whole suite
## (SQLite, and a real PostgreSQL server that the tests start themselves).
test: install
	scripts/ensure-postgres
	scripts/ensure-s3rver
	PY=$(PY) scripts/check
	$(PY) -m pytest

## Lint, format check, types and migration drift (what reviewers expect before a merge).
check: install
	scripts/check

## Every benchmark, each printing ratios against a baseline measured in the same run.
bench: install
	$(PY) -m bench.engine
	$(PY) -m bench.noise
	$(PY) -m bench.publish
	$(PY) -m bench.sdk
	$(PY) -m bench.tracking
	$(PY) -m bench.dpsgd
	$(PY) -m bench.upload --rows 10000000
	$(PY) -m bench.utility
	$(PY) -m bench.utility_stats
	$(PY) -m bench.amplification

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
