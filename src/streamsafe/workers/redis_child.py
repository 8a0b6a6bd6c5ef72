"""The supervisor's own ``redis-server``: how workers share their generations when no
``--redis`` is given.

Workers are replicas (docs/design.md, Replicas): a retry or a resume that lands on another
worker must find the generation the first one runs, and a dead worker's generations must be
taken over. They share that state exactly as replicas do, through Redis; without ``--redis``
the supervisor starts one for them and for this run only: on a unix socket in a private
temporary folder (mode 0700, so no other user reaches it), no TCP port (``--port 0``), no
persistence (``--save ''``, no append-only file), gone with the supervisor.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

__all__ = ["NoRedisServer", "RedisChild"]


class NoRedisServer(RuntimeError):
    """No ``redis-server`` binary to start: ``str()`` says what to do instead."""


class RedisChild:
    """``redis-server`` on a unix socket in a private folder, a child of this process."""

    #: Seconds it gets to answer PING after it starts.
    START_TIMEOUT = 10.0

    def __init__(self, binary: str | None = None) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise NoRedisServer(
                "--workers above 1 shares state through Redis: give --redis URL, or install "
                "redis-server (Debian/Ubuntu: apt-get install redis-server) so that the "
                "workers get one of their own"
            )
        self.binary = found
        self._dir = tempfile.mkdtemp(prefix="streamsafe-workers-")
        self.path = os.path.join(self._dir, "redis.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its ``unix://`` URL."""
        return f"unix://{self.path}"

    def start(self) -> RedisChild:
        """Start it and wait until it answers PING. Call it before this process starts a
        thread: the child is set up to die with this process between fork and exec."""
        args = [self.binary, "--port", "0", "--unixsocket", self.path, "--unixsocketperm", "700"]
        args += ["--save", "", "--appendonly", "no", "--dir", self._dir, "--loglevel", "warning"]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            cwd=self._dir,
            # Its own process group: a Ctrl-C at the terminal reaches the supervisor alone,
            # which stops this child only once the workers have drained.
            process_group=0,
            preexec_fn=_dies_with(os.getpid()),  # no thread runs yet: see start()
        )
        deadline = time.monotonic() + self.START_TIMEOUT
        while not self._pong():
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING in {self.START_TIMEOUT} s")
            time.sleep(0.01)
        return self

    def _pong(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                sock.connect(self.path)
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Stop it and remove its folder."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisChild:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _dies_with(parent: int) -> Callable[[], None] | None:
    """What runs in the child between fork and exec so that the kernel stops it when
    ``parent`` exits (Linux; elsewhere nothing): its C library is loaded here, before the
    fork."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def hook() -> None:
        prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return hook
