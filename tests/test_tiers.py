"""The suite's tiers: each test file lands in the tier its place and its mark say, and a unit
test that listens on a socket or starts a process fails."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import subprocess
import sys

import pytest

from tiers import (
    INTEGRATION,
    REAL_ENGINE,
    TIERS,
    UNIT,
    ServerInUnitTest,
    closest_tier,
    no_servers,
    tier,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "path",
    [
        "vllm/test_stall.py",
        "llamastack/test_probe.py",
        "ogx/test_tls.py",
        "test_demo.py",
    ],
)
def test_a_real_engines_files_are_real_engine(path: str) -> None:
    assert tier(path, None) == REAL_ENGINE
    assert tier(path, REAL_ENGINE) == REAL_ENGINE


@pytest.mark.parametrize("mark", [UNIT, INTEGRATION])
def test_a_real_engines_file_marked_another_tier_is_refused(mark: str) -> None:
    with pytest.raises(ValueError, match="real engine"):
        tier("vllm/test_stall.py", mark)


@pytest.mark.parametrize("path", ["gateway/test_relay.py", "test_cli.py", "vllmish/test_x.py"])
def test_elsewhere_a_test_is_its_mark_and_integration_unmarked(path: str) -> None:
    assert tier(path, None) == INTEGRATION
    assert tier(path, UNIT) == UNIT
    assert tier(path, INTEGRATION) == INTEGRATION
    assert tier(path, REAL_ENGINE) == REAL_ENGINE


def test_the_closest_tier_mark_wins() -> None:
    # A test's own integration mark is listed before its module's unit mark.
    assert closest_tier(["timeout", INTEGRATION, "parametrize", UNIT]) == INTEGRATION
    assert closest_tier(["timeout", UNIT]) == UNIT
    assert closest_tier(["timeout"]) is None


@pytest.mark.integration
def test_a_test_marked_integration_in_a_unit_module_may_start_a_process(
    request: pytest.FixtureRequest,
) -> None:
    # Its module's unit mark is gone from it, so `-m unit` leaves it out.
    assert [mark.name for mark in request.node.iter_markers() if mark.name in TIERS] == [
        INTEGRATION
    ]
    out = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, check=True)
    assert out.stdout == b"1\n"


def test_this_module_runs_as_a_unit_test(request: pytest.FixtureRequest) -> None:
    # Its unit mark moved from the module onto each test (see tests/conftest.py).
    assert [mark.name for mark in request.node.own_markers if mark.name in TIERS] == [UNIT]
    assert not [mark for mark in request.node.parent.own_markers if mark.name in TIERS]


def test_a_unit_test_cannot_listen() -> None:
    # The guard is on already (this is a unit test); with a second one inside, leaving it must
    # put back the first, not the real listen.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        with no_servers(), pytest.raises(ServerInUnitTest):
            sock.listen()
        with pytest.raises(ServerInUnitTest):
            sock.listen()


async def test_a_unit_test_cannot_serve_with_asyncio() -> None:
    with pytest.raises(ServerInUnitTest):
        await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)


def test_a_unit_test_cannot_start_a_process() -> None:
    with pytest.raises(ServerInUnitTest):
        subprocess.run([sys.executable, "-c", "pass"], check=False)
    with pytest.raises(ServerInUnitTest):
        os.fork()


async def test_a_unit_test_cannot_start_an_asyncio_subprocess() -> None:
    with pytest.raises(ServerInUnitTest):
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")


def test_a_unit_test_cannot_start_a_multiprocessing_process() -> None:
    context = multiprocessing.get_context("spawn")
    with pytest.raises(ServerInUnitTest):
        context.Process(target=print).start()


def test_outside_the_guard_listening_works_again() -> None:
    # The guard's own bookkeeping: leaving it restores the real functions.
    listen, execute, fork = socket.socket.listen, subprocess.Popen._execute_child, os.fork
    with no_servers():
        assert socket.socket.listen is not listen
    assert (socket.socket.listen, subprocess.Popen._execute_child, os.fork) == (
        listen,
        execute,
        fork,
    )
