"""Today's Llama Stack, real: OGX 1.5.0 and llama-stack 0.7.3, each started once for the session
in front of an engine slot (see streamsafe_bench.llamastack_deployment); each test installs a
fresh simulator in the slot, so every count is its own.

Fixtures:

- ``today``: the session's server of one flavor (the tests that take it run once per flavor,
  ``ogx`` and ``llama-stack-0.7``), with ``.url``, ``.engine(...)``, ``.seen`` (what reached the
  engine), ``.client_python`` (the venv's Python, with the flavor's client) and ``.flavor``.
- ``ogx_server``: the OGX one alone, for what only OGX and ogx-client do; it serves the
  Responses API too.

Without a flavor's virtualenv (``make ogx``, ``make llamastack07``) its tests are skipped, saying
so; in CI (``CI=true``) they fail instead, so a CI run never passes without the real servers.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from today_tier import FAST, MODEL, TodayTier

from streamsafe.engine_sim import SimConfig, Simulator
from streamsafe_bench.llamastack_deployment import llama_stack_deployment
from streamsafe_bench.ogx_server import (
    FLAVORS,
    OGX,
    Flavor,
    OGXServer,
    ServerUnavailable,
    find_venv,
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1")


def _venv(flavor: Flavor) -> Path:
    try:
        return find_venv(flavor)
    except ServerUnavailable as exc:
        if _in_ci():
            pytest.fail(f"{exc}; CI runs the real server and never skips it", pytrace=False)
        pytest.skip(str(exc))


class _Servers:
    """The session's servers, started on first use and stopped at the session's end."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.started: dict[str, TodayTier] = {}

    def get(self, flavor: Flavor) -> TodayTier:
        tier = self.started.get(flavor.name)
        if tier is None:
            venv = _venv(flavor)
            deployment = self.stack.enter_context(
                llama_stack_deployment(
                    Simulator(SimConfig(**FAST)),
                    MODEL,
                    server=lambda url: OGXServer(
                        url, flavor=flavor, venv=venv, responses=flavor is OGX
                    ),
                )
            )
            tier = self.started[flavor.name] = TodayTier(flavor, deployment)
        return tier


@pytest.fixture(scope="session")
def _servers() -> Iterator[_Servers]:
    with contextlib.ExitStack() as stack:
        yield _Servers(stack)


@pytest.fixture(params=sorted(FLAVORS), scope="session")
def _today_session(request: pytest.FixtureRequest, _servers: _Servers) -> TodayTier:
    return _servers.get(FLAVORS[request.param])


@pytest.fixture
def today(_today_session: TodayTier) -> TodayTier:
    """The session's server of this run's flavor, with a fresh default engine."""
    _today_session.engine()
    return _today_session


@pytest.fixture
def ogx_server(_servers: _Servers) -> TodayTier:
    """The session's OGX server, with a fresh default engine."""
    tier = _servers.get(OGX)
    tier.engine()
    return tier
