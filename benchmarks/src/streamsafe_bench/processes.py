"""Starting the servers a benchmark measures as real processes, and reading what they cost.

Every server under test runs in its own process (as in production), so its CPU time and memory
are its own and it shares no GIL with the load or the bench. CPU and memory are read from
``/proc`` for the whole process tree (nginx's master and worker, a proxy's helpers), so a peer
that forks is charged for all of it. :class:`ServerProcess` (``streamsafe serve`` or
``simulate``) and :class:`RedisServer` are processes a benchmark or a test may kill.
"""

from __future__ import annotations

import contextlib
import os
import random
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = [
    "RedisServer",
    "ServerProcess",
    "cpu_seconds",
    "free_port",
    "http_ok",
    "launched",
    "process_tree",
    "rss_bytes",
    "stop_process",
]

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")
_SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def free_port() -> int:
    """A loopback port nobody listens on right now (the server is started on it next)."""
    from streamsafe.server import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    port: int = sock.getsockname()[1]
    sock.close()
    return port


def http_ok(url: str) -> Callable[[], bool]:
    """A readiness check: ``url`` answers 200."""

    def check() -> bool:
        import httpx2

        try:
            return httpx2.get(url, timeout=1).status_code == 200
        except httpx2.HTTPError:
            return False

    return check


@contextlib.contextmanager
def launched(
    cmd: Sequence[str],
    *,
    name: str,
    ready: Callable[[], bool],
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``cmd``, wait until ``ready()`` (or fail with the tail of its stderr), yield the
    process, and stop it after (terminate, then kill after 10 s)."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=cwd)
        try:
            deadline = time.monotonic() + timeout_s
            while not ready():
                if proc.poll() is not None or time.monotonic() > deadline:
                    err.seek(0)
                    tail = err.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(f"{name} did not start: {tail}")
                time.sleep(0.1)
            yield proc
        finally:
            stop_process(proc)


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Terminate ``proc`` and wait for it; kill it if it is still there after ``grace`` s."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants now alive."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(parents.get(p, ()))
    return tree


def cpu_seconds(pids: Sequence[int]) -> float:
    """CPU seconds spent so far by ``pids`` and all their threads (those gone count 0).

    Read from each thread's ``schedstat`` (nanoseconds on a CPU), as the clock-tick figures of
    ``stat`` (10 ms) are too coarse for a burst of cheap requests; ``stat`` where the kernel
    keeps no ``schedstat``."""
    if not _SCHEDSTAT:
        return sum(_stat_cpu_seconds(pid) for pid in pids)
    total = 0
    for task in _threads(pids):
        try:
            total += int(Path(task, "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return total / 1e9


def _threads(pids: Sequence[int]) -> list[str]:
    """The ``/proc`` folders of every thread of ``pids`` now alive."""
    folders: list[str] = []
    for pid in pids:
        try:
            folders.extend(f"/proc/{pid}/task/{tid}" for tid in os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue  # the process ended meanwhile
    return folders


def preemptions(pids: Sequence[int]) -> dict[str, int]:
    """How often the kernel took a CPU from each thread of ``pids`` while it could still run
    (involuntary context switches, from each thread's ``status``), by thread; see
    :func:`preempted_since`.

    A proxy preempted in the middle of relaying one tick's chunks holds the rest of them until
    it runs again: how often that happens per chunk is what turns CPU per chunk into tail
    latency on a machine with fewer cores than busy processes."""
    counts: dict[str, int] = {}
    for task in _threads(pids):
        try:
            status = Path(task, "status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        for line in status.splitlines():
            if line.startswith("nonvoluntary_ctxt_switches:"):
                counts[task] = int(line.split()[1])
                break
    return counts


def preempted_since(before: dict[str, int], pids: Sequence[int]) -> int:
    """Preemptions of ``pids``' threads since ``before`` (a :func:`preemptions` reading). A
    thread that ended meanwhile takes its count with it; it is never counted negative."""
    return sum(max(0, n - before.get(task, 0)) for task, n in preemptions(pids).items())


def _stat_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def rss_bytes(pids: Sequence[int]) -> int:
    """Resident memory of ``pids`` together, in bytes."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total * _PAGE


_URL = re.compile(r"(https?://127\.0\.0\.1:\d+)")


class ServerProcess:
    """``streamsafe ARGS --port 0`` as a child process; ``url`` is the address it announced
    (the first ``http://127.0.0.1:PORT`` or ``https://...`` after `` on ``)."""

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


def _quiet_port() -> int:
    """A free loopback port below the kernel's ephemeral range, so that no client socket or
    ``--port 0`` server takes it while a test has Redis down for a restart on it."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


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

    def __init__(
        self, binary: str | None = None, port: int | None = None, args: Sequence[str] = ()
    ) -> None:
        found = binary or shutil.which("redis-server")
        if found is None:
            raise FileNotFoundError(
                "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)"
            )
        self.binary = found
        self.port = port or _quiet_port()
        #: More of its command line (``--replicaof HOST PORT``, say).
        self.args = tuple(args)
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="streamsafe-redis-")

    @property
    def url(self) -> str:
        """Its ``redis://`` URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start it and wait until it answers PING."""
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", self._dir, *self.args]
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
