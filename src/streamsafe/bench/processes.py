"""Starting the servers a benchmark measures as real processes, and reading what they cost.

Every server under test runs in its own process (as in production), so its CPU time and memory
are its own and it shares no GIL with the load or the bench. CPU and memory are read from
``/proc`` for the whole process tree (nginx's master and worker, a proxy's helpers), so a peer
that forks is charged for all of it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = ["cpu_seconds", "free_port", "http_ok", "launched", "process_tree", "rss_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")
_SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def free_port() -> int:
    """A loopback port nobody listens on right now (the server is started on it next)."""
    from streamsafe.serving import bind_socket

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
            proc.terminate()
            try:
                proc.wait(10)
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
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                continue  # the thread ended meanwhile
    return total / 1e9


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
