"""The real vLLM (0.32, CPU build) serving the tiny model: one server for the whole session,
shared by every test in this folder, and helpers to put the gateway in front of it.

Fixtures:

- ``vllm_engine``: the session's :class:`~streamsafe_bench.vllm_engine.VLLMEngine` (``.url``,
  ``.model``; ``.requests_received(seed=...)`` and ``.requests_aborted()`` read its request
  log; ``.engine_core_pid()``; ``.pause()``, ``.resume()`` and ``.stall(seconds)`` stop and
  continue its engine). Its KV cache is small (16 blocks of 128 tokens, 2,048 tokens: the
  issue's pressure test), room for 8 ordinary requests at once.
  After each test the engine runs again, whatever the test left.
- ``start_vllm``: starts another vLLM for one test, with other ``vllm serve`` arguments
  (``start_vllm("--max-num-queued-reqs", "1")``, or ``VLLMOptions`` fields as keywords), and
  stops it after the test. A start takes 26-58 s: give the test a timeout that covers it.

Without the vLLM virtualenv (``make vllm``) the tests are skipped, saying so; in CI
(``CI=true``) they fail instead, so a CI run never passes without the real engine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from streamsafe_bench.vllm_engine import VLLMEngine, VLLMOptions, VLLMUnavailable, find_venv

sys.path.insert(0, os.path.dirname(__file__))

#: The session server's options: the issue's small KV cache, everything else as the tests use.
SESSION_OPTIONS = VLLMOptions(kv_cache_blocks=16)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    """The vLLM virtualenv; skipped where it is missing, failed in CI."""
    try:
        return find_venv()
    except VLLMUnavailable as exc:
        if _in_ci():
            pytest.fail(f"{exc}; CI runs the real vLLM and never skips it", pytrace=False)
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def vllm_engine(vllm_venv: Path) -> Iterator[VLLMEngine]:
    engine = VLLMEngine(SESSION_OPTIONS, venv=vllm_venv).start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture(autouse=True)
def _engine_runs_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "vllm_engine" in request.fixturenames:
        request.getfixturevalue("vllm_engine").resume()


@pytest.fixture
def start_vllm(vllm_venv: Path) -> Iterator[Callable[..., VLLMEngine]]:
    yield from _starter(vllm_venv)


@pytest.fixture(scope="module")
def start_vllm_module(vllm_venv: Path) -> Iterator[Callable[..., VLLMEngine]]:
    """``start_vllm`` for a whole module: its servers stop after the module's last test."""
    yield from _starter(vllm_venv)


def _starter(vllm_venv: Path) -> Iterator[Callable[..., VLLMEngine]]:
    started: list[VLLMEngine] = []

    def start(*extra_args: str, **options: Any) -> VLLMEngine:
        opts = VLLMOptions(extra_args=tuple(extra_args), **options)
        engine = VLLMEngine(opts, venv=vllm_venv)
        started.append(engine)
        return engine.start()

    yield start
    for engine in started:
        engine.stop()
