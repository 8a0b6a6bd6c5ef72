"""Suite-wide: the servers tests hand to ``server_stops.stop_later`` are all stopped before the
session ends; and how ``make test TEST_PROCESSES=2`` spreads the files over two processes
(pytest-xdist, ``-n 2 --dist loadfile``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# Last on the path, so a folder's own helpers and conftest (put first by its conftest) win.
sys.path.append(os.path.dirname(__file__))

from server_stops import wait_stopped

#: The files that run the real Llama Stack servers: tests/llamastack share one 0.2.12 server for
#: the session (per process), tests/ogx one OGX 1.5 and one llama-stack 0.7.3, the demo starts
#: its own. Run in one process, one after another, so that two Llama Stack servers (each about a
#: core while it starts and under the report's load) never compete; and first, because together
#: they are the longest part of the suite.
MIDDLE_TIER = "middle tier"
#: tests/vllm: its files share one real vLLM for the session (per process), so they stay together.
REAL_VLLM = "real vllm"


def _unit(nodeid: str) -> str:
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # In an xdist worker (every worker collects the same list), put the middle tier first so
    # the scheduler hands it out first; a plain run keeps the files in their order.
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: _unit(item.nodeid) != MIDDLE_TIER)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, except that the middle-tier files are one unit, handed out first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class MiddleTierFirst(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    # Hand units out in collection order (middle tier first), not largest test count first.
    config.option.loadscopereorder = False
    return MiddleTierFirst(config, log)
