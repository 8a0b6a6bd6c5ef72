"""What a supervisor tells each worker it starts, and how a worker reads it.

A worker is ``streamsafe serve`` again, with the command line it was started with, plus these
environment variables (never options: ``ps`` would show a secret, and a worker's command line
stays the operator's own):

- ``STREAMSAFE_WORKER_FD``: the listening socket, inherited, that every worker accepts from
  (a pre-fork server: one accept queue, so a dead worker loses only the connections it had
  accepted, and a connection never waits in a dead worker's queue as it would with
  ``SO_REUSEPORT``);
- ``STREAMSAFE_WORKER``: the worker's number (1..N), for its log lines;
- ``STREAMSAFE_WORKER_PARENT``: the supervisor's pid: a worker whose supervisor died drains and
  exits (on Linux the kernel tells it; elsewhere it is checked at start only);
- ``STREAMSAFE_WORKER_REDIS``: the supervisor's own ``redis-server`` (``unix://``), where no
  ``--redis`` was given;
- ``STREAMSAFE_WORKER_UPSTREAM``: the supervisor's engine simulator, where no ``--upstream``
  was given;
- ``STREAMSAFE_REDIS_SECRET``: the secret the supervisor made for its own Redis, where none was
  given (read as ``--redis-secret`` is).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["WorkerPlace", "die_with_parent", "this_worker", "worker_env"]

_FD = "STREAMSAFE_WORKER_FD"
_INDEX = "STREAMSAFE_WORKER"
_PARENT = "STREAMSAFE_WORKER_PARENT"
_REDIS = "STREAMSAFE_WORKER_REDIS"
_UPSTREAM = "STREAMSAFE_WORKER_UPSTREAM"
_SECRET = "STREAMSAFE_REDIS_SECRET"
#: Linux's prctl option that sends a signal to this process when its parent exits.
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerPlace:
    """Where a worker serves: the socket it accepts from, its number, what the supervisor
    started for it (``None``: nothing; the worker's own options hold)."""

    sock: socket.socket
    index: int
    redis: str | None
    upstream: str | None


def worker_env(
    fd: int,
    index: int,
    *,
    redis: str | None = None,
    upstream: str | None = None,
    secret: str | None = None,
) -> dict[str, str]:
    """The variables a supervisor adds to worker ``index``'s environment."""
    env = {_FD: str(fd), _INDEX: str(index), _PARENT: str(os.getpid())}
    if redis is not None:
        env[_REDIS] = redis
    if upstream is not None:
        env[_UPSTREAM] = upstream
    if secret is not None:
        env[_SECRET] = secret
    return env


def this_worker(environ: Mapping[str, str] = os.environ) -> WorkerPlace | None:
    """This process's place as a worker, or ``None`` where no supervisor started it. A worker
    whose supervisor is already gone exits here."""
    fd = environ.get(_FD)
    if fd is None:
        return None
    parent = int(environ.get(_PARENT, "0") or 0)
    if parent:
        die_with_parent(parent)
    sock = socket.socket(fileno=int(fd))
    return WorkerPlace(
        sock=sock,
        index=int(environ.get(_INDEX, "1")),
        redis=environ.get(_REDIS) or None,
        upstream=environ.get(_UPSTREAM) or None,
    )


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent exits (Linux), so a worker
    or a ``redis-server`` left by a supervisor killed -9 stops instead of serving on for
    nobody; exit at once if ``parent`` is already gone (it died before this could be asked)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent:
        os._exit(1)
