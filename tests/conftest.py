"""Suite-wide: every test's tier (unit, integration, real_engine: see tiers.py), a unit test
kept from listening or starting a process; no stream handler a test set left on the root logger;
the servers tests hand to
``server_stops.stop_later`` all stopped before the session ends; and how ``make test
TEST_PROCESSES=2`` spreads the files over two processes (pytest-xdist, ``-n 2 --dist
loadfile``)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# Last on the path, so a folder's own helpers and conftest (put first by its conftest) win.
sys.path.append(os.path.dirname(__file__))

from server_stops import wait_stopped
from tiers import TIERS, UNIT, closest_tier, no_servers, tier

TESTS = os.path.dirname(os.path.abspath(__file__))

#: The files that run the real Llama Stack servers: tests/llamastack share one 0.2.12 server for
#: the session (per process), tests/ogx one OGX 1.5 and one llama-stack 0.7.3, the demo starts
#: its own. Run in one process, one after another, so that two Llama Stack servers (each about a
#: core while it starts and under the report's load) never compete; and first, because together
#: they are the longest part of the suite.
MIDDLE_TIER = "middle tier"
#: tests/vllm: its files share one real vLLM for the session (per process), so they stay together.
REAL_VLLM = "real vllm"


def _work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or :data:`MIDDLE_TIER`."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(("tests/llamastack/", "tests/ogx/")) or path == "tests/test_demo.py":
        return MIDDLE_TIER
    if path.startswith("tests/vllm/"):
        return REAL_VLLM
    return path


@pytest.fixture(scope="session", autouse=True)
def _servers_stopped_at_the_end() -> Iterator[None]:
    yield
    wait_stopped()


@pytest.fixture(autouse=True)
def _root_handlers_restored() -> Iterator[None]:
    # A command run in-process (``cli.main``) sets its handler on the stderr pytest captured for
    # that test; left on the root logger, a server thread a later test still stops in the
    # background wrote its access line to that closed stream ("--- Logging error ---"). Only
    # such plain stream handlers are taken off: pytest's own come and go with each phase.
    root = logging.getLogger()
    before, level = set(root.handlers), root.level
    yield
    for handler in root.handlers[:]:
        if handler not in before and type(handler) is logging.StreamHandler:
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Each test ends with exactly one tier mark, its own: a module's unit mark moves down onto
    # its tests, except those marked otherwise themselves, so that `-m unit` (which sees every
    # mark up the chain) selects no test its module calls unit but the test does not. First, so
    # that `-m` deselects on the resolved marks.
    tiers = []
    for item in items:
        path = os.path.relpath(item.path, TESTS).replace(os.sep, "/")
        try:
            tiers.append(tier(path, closest_tier(mark.name for mark in item.iter_markers())))
        except ValueError as error:
            raise pytest.UsageError(str(error)) from None
    for item, name in zip(items, tiers, strict=True):
        for node in item.listchain():
            node.own_markers[:] = [mark for mark in node.own_markers if mark.name not in TIERS]
        item.add_marker(name)
    # In an xdist worker (every worker collects the same list), put the middle tier first so
    # the scheduler hands it out first; a plain run keeps the files in their order.
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: _work_unit(item.nodeid) != MIDDLE_TIER)


def _is_unit(item: pytest.Item) -> bool:
    return closest_tier(mark.name for mark in item.iter_markers()) == UNIT


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    # Setup too: a server a unit test asks for through a fixture is refused there.
    if not _is_unit(item):
        return (yield)
    with no_servers():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if not _is_unit(item):
        return (yield)
    with no_servers():
        return (yield)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, except that the middle-tier files are one unit, handed out first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class MiddleTierFirst(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    # Hand units out in collection order (middle tier first), not largest test count first.
    config.option.loadscopereorder = False
    return MiddleTierFirst(config, log)
