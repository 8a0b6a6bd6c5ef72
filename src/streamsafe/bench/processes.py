"""Servers as child processes, for benchmarks (and tests) that kill them: ``streamsafe serve`` or
``simulate`` on a port the system picks, and ``redis-server`` without persistence."""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

__all__ = ["RedisServer", "ServerProcess", "free_port"]

_URL = re.compile(r"(http://127\.0\.0\.1:\d+)")


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``streamsafe ARGS --port 0`` as a child process; ``url`` is the address it announced
    (the first ``http://127.0.0.1:PORT`` after `` on ``)."""

    def __init__(self, *args: str, timeout: float = 30.0) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamsafe.cli", *args, "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        #: Everything it printed so far.
        self.output: list[str] = []
        self.url = self._announced(timeout)
        # Keep draining its output so a chatty process never blocks on a full pipe.
        threading.Thread(target=self._read_rest, daemon=True).start()

    def _announced(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while True:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                self.kill()
                raise RuntimeError(f"{self.args[0]}: no URL in {timeout} s: {self.output}")
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"{self.args[0]} exited ({self.proc.poll()}): {self.output}")
            self.output.append(line)
            found = _URL.findall(line.partition(" on ")[2])
            if found:
                return str(found[0])

    def _read_rest(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crashed host)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stop(self) -> None:
        """SIGINT, then SIGKILL if it does not exit within 15 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` with no persistence (``--save "" --appendonly no``) on a loopback
    port; Debian and Ubuntu ship the binary as the package ``redis-server``."""

    #: Seconds it gets to answer PING after it starts.
    START_TIMEOUT = 10.0

    def __init__(self, binary: str | None = None, port: int | None = None) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise FileNotFoundError(
                "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
            )
        self.binary = found
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="streamsafe-redis-")

    @property
    def url(self) -> str:
        """Its ``redis://`` URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start it and wait until it answers PING."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", self._dir]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._dir
        )
        deadline = time.monotonic() + self.START_TIMEOUT
        while not _ping(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer PING in {self.START_TIMEOUT} s")
            time.sleep(0.01)
        return self

    def kill(self) -> None:
        """SIGKILL: everything in it is gone (no persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        """Stop it and remove its folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self._dir, ignore_errors=True)

    def restart(self) -> None:
        """Kill and start again on the same port (an empty Redis)."""
        self.kill()
        self.start()
