"""The suite's three tiers, and the guard that keeps the unit tier pure.

``unit``: pure cores: no listening socket, no child process; a module says so itself with
``pytestmark = pytest.mark.unit``, and one of its tests that does start a process says
``@pytest.mark.integration`` (the closest of the two marks wins). ``real_engine``: the real vLLM,
Llama Stack 0.2.12, OGX and llama-stack 0.7.3, known by where the file lives. ``integration``:
every other test (the simulator, the gateway, redis-server, nginx, as real processes or
in-process servers). A test nobody marked is therefore integration: forgetting the mark costs
speed, never purity.
"""

from __future__ import annotations

import _posixsubprocess
import os
import socket
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import PurePosixPath
from typing import Any, NoReturn

UNIT = "unit"
INTEGRATION = "integration"
REAL_ENGINE = "real_engine"

#: Folders (and the one file) under tests/ whose tests run a real engine or Llama Stack server;
#: the demo runs the middle tier's rows on a real Llama Stack.
REAL_ENGINE_PLACES = ("vllm/", "llamastack/", "ogx/", "test_demo.py")


TIERS = (UNIT, INTEGRATION, REAL_ENGINE)


def closest_tier(marks: Iterable[str]) -> str | None:
    """The first tier among a test's marks, closest first (its own, its class's, its module's)."""
    return next((name for name in marks if name in TIERS), None)


def tier(path: str, closest_mark: str | None) -> str:
    """The tier of a test in the file at ``path`` (relative to tests/, with ``/``) whose closest
    tier mark is ``closest_mark``. A real engine's file needs no mark, and another tier's mark
    on it is a mistake, refused; elsewhere a test is what it is marked, integration unmarked."""
    if str(PurePosixPath(path)).startswith(REAL_ENGINE_PLACES):
        if closest_mark not in (None, REAL_ENGINE):
            raise ValueError(f"{path} runs a real engine and cannot be marked {closest_mark}")
        return REAL_ENGINE
    return closest_mark or INTEGRATION


class ServerInUnitTest(AssertionError):
    """A unit test opened a listening socket or started a process."""


def _refuse(what: str) -> Any:
    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise ServerInUnitTest(
            f"a unit test {what}: mark it @pytest.mark.integration (or drop its module's"
            " pytestmark = pytest.mark.unit)"
        )

    return refuse


#: (owner, attribute, what the refusal says was tried). Popen's _execute_child is where
#: subprocess.run, check_output and asyncio's subprocesses all end up; multiprocessing's spawn
#: and forkserver call _posixsubprocess.fork_exec themselves, its fork os.fork.
_GUARDED: list[tuple[Any, str, str]] = [
    (socket.socket, "listen", "listened on a socket"),
    (subprocess.Popen, "_execute_child", "started a process"),
    (_posixsubprocess, "fork_exec", "started a process"),
    (os, "fork", "forked"),
    (os, "posix_spawn", "spawned a process"),
    (os, "posix_spawnp", "spawned a process"),
]


_INHERITED = object()


@contextmanager
def no_servers() -> Iterator[None]:
    """Within: listening on a socket or starting a process raises :class:`ServerInUnitTest`."""
    # socket.socket inherits listen from _socket.socket: where the attribute is inherited, the
    # refusal shadows it and goes again afterwards, rather than being replaced by a copy.
    saved = [(owner, name, owner.__dict__.get(name, _INHERITED)) for owner, name, _ in _GUARDED]
    try:
        for owner, name, what in _GUARDED:
            setattr(owner, name, _refuse(what))
        yield
    finally:
        for owner, name, original in saved:
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
