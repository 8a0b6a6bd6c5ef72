# Two commands set everything up: `make demo` and `make test`. Both create .venv on first use and
# reinstall only when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lint format unasync test demo bench docs clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The synchronous client is generated from the asynchronous one; lint fails when they drift.
lint: $(STAMP)
	$(BIN)/ruff check src tests scripts
	$(BIN)/ruff format --check src tests scripts
	$(BIN)/python scripts/unasync.py --check
	$(BIN)/mypy

format: $(STAMP) unasync
	$(BIN)/ruff format src tests scripts
	$(BIN)/ruff check --fix src tests scripts

unasync: $(STAMP)
	$(BIN)/python scripts/unasync.py

test: lint
	$(BIN)/pytest -q

demo: $(STAMP)
	mkdir -p reports
	$(BIN)/streamsafe demo --json reports/demo.json --plot reports/demo.png

bench: $(STAMP)
	mkdir -p reports
	$(BIN)/streamsafe bench all --out reports

# docs/cli.md is generated from the argparse parsers; tests/test_docs.py fails when it is stale.
docs: $(STAMP)
	$(BIN)/python -m streamsafe._clidoc --write docs/cli.md

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .hypothesis
