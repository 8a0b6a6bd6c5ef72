"""The engine simulator as a real process (``streamsafe simulate``), for faults only a process
has: killed (SIGKILL: connections reset, then refused) and frozen (SIGSTOP: the kernel still
accepts connections, nothing answers)."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

import httpx2

_URL = re.compile(r"(http://127\.0\.0\.1:(\d+))")

FAST_ARGS = (
    "--itl-ms",
    "2",
    "--itl-ms-per-seq",
    "0",
    "--prefill-ms-per-token",
    "0",
    "--default-max-tokens",
    "16",
)


def _drain(stream: IO[str]) -> None:
    with contextlib.suppress(ValueError, OSError):  # closed when the process is killed
        for _ in stream:
            pass


class EngineProcess:
    """``streamsafe simulate`` on a loopback port; :meth:`kill`, :meth:`freeze`, :meth:`thaw`
    and :meth:`restart` (same port)."""

    def __init__(self, *args: str, port: int = 0) -> None:
        self.args = args
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self, timeout: float = 30.0) -> EngineProcess:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamsafe.cli",
                "simulate",
                *FAST_ARGS,
                *self.args,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.proc = proc
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        seen = []
        while True:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                raise AssertionError(f"simulator announced no URL in {timeout} s: {seen}")
            line = proc.stdout.readline()
            if not line:
                raise AssertionError(f"simulator exited early ({proc.poll()}): {seen}")
            seen.append(line)
            found = _URL.findall(line)
            if found:
                self.url, port = found[0]
                self.port = int(port)
                break
        sel.close()
        # Drain its output in the background so a chatty process never blocks on a full pipe
        # (a simulator that logs every request froze once 64 KiB of lines were unread, and its
        # /health went silent as if the engine were gone).
        threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
        return self

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = httpx2.get(self.url + "/stats", timeout=10).json()
        return result

    def kill(self) -> None:
        """SIGKILL: open connections are reset, new ones refused."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel, nothing is answered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """A fresh process on the same port."""
        self.stop()
        self.start()

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@contextlib.contextmanager
def engine_process(*args: str) -> Iterator[EngineProcess]:
    engine = EngineProcess(*args).start()
    try:
        yield engine
    finally:
        engine.stop()
        if engine.proc is not None and engine.proc.stdout is not None:
            engine.proc.stdout.close()
