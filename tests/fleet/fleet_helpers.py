"""A real ``redis-server`` per test session, on a free loopback port, that a test may kill and
restart. When the binary is missing, tests that need it fail in CI (the ``CI`` environment
variable is set) and are skipped elsewhere; Debian and Ubuntu ship it as ``redis-server``."""

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

import pytest

#: Seconds redis-server gets to answer PING after it starts.
START_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_binary() -> str:
    """The redis-server binary, or fail (CI) / skip (elsewhere) the test that needs it."""
    found = shutil.which("redis-server")
    if found is None:
        msg = "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return found


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisProcess:
    """One redis-server process with no persistence (``--save "" --appendonly no``)."""

    def __init__(self, binary: str, port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="streamsafe-redis-")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", self._dir]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self._dir
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not _ping(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"redis-server did not answer PING in {START_TIMEOUT} s")
            time.sleep(0.01)
        return self

    def kill(self) -> None:
        """SIGKILL: everything in it is gone (no persistence)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
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


_URL = re.compile(r"(http://127\.0\.0\.1:\d+)")


class Process:
    """``streamsafe ARGS --port 0`` as a child process; ``url`` is the address it announced."""

    def __init__(self, *args: str, timeout: float = 30.0) -> None:
        self.args = args
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamsafe.cli", *args, "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.output: list[str] = []
        self.url = self._announced(timeout)
        # Keep draining its output so a chatty process never blocks on a full pipe.
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()

    def _announced(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while True:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                self.kill()
                raise AssertionError(f"{self.args[0]}: no URL in {timeout} s: {self.output}")
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"{self.args[0]} exited ({self.proc.poll()}): {self.output}")
            self.output.append(line)
            if " on http://" in line or "listening on" in line or "running at" in line:
                found = _URL.findall(line)
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
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
