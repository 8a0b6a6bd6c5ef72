"""Starting the servers a benchmark measures as real processes, and reading what they cost.

Every server under test runs in its own process (as in production), so its CPU time and memory
are its own and it shares no GIL with the load or the bench. CPU and memory are read from
``/proc`` for the whole process tree (nginx's master and worker, a proxy's helpers), so a peer
that forks is charged for all of it. :class:`ServerProcess` (``streamsafe serve`` or
``simulate``), :class:`RedisServer` and the nodes of :class:`RedisClusterServers` are processes
a benchmark or a test may kill.
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
from typing import Any

__all__ = [
    "RedisClusterServers",
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


#: Hash slots of a Redis Cluster.
_SLOTS = 16384


def _cluster_port() -> int:
    """A free loopback port whose cluster bus port (10000 above it) is free too, both below the
    kernel's ephemeral range."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 22500)
        with socket.socket() as sock, socket.socket() as bus:
            try:
                sock.bind(("127.0.0.1", port))
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class RedisClusterServers:
    """A Redis Cluster of ``primaries`` :class:`RedisServer` primaries (no replicas) on loopback,
    the slots split in equal ranges; a node killed and started again comes back with its slots
    (its ``nodes.conf`` stays) and no data."""

    #: Seconds the nodes get to agree on the cluster once started.
    SETTLE_TIMEOUT = 20.0

    def __init__(self, binary: str | None = None, primaries: int = 3) -> None:
        args: tuple[str, ...] = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
        args += ("--cluster-node-timeout", "2000")  # (also what a failover waits for)
        self.nodes = [RedisServer(binary, _cluster_port(), args) for _ in range(primaries)]

    @property
    def url(self) -> str:
        """Its ``redis+cluster://`` URL, naming every node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def _client(self, node: RedisServer) -> Any:
        import redis

        return redis.Redis(port=node.port, socket_timeout=5, decode_responses=True)

    def start(self) -> RedisClusterServers:
        """Start the nodes, give each its range of slots, join them, and wait until every node
        says the cluster is ok and knows every other."""
        for node in self.nodes:
            node.start()
        count = len(self.nodes)
        for i, node in enumerate(self.nodes):
            with self._client(node) as client:
                first, last = i * _SLOTS // count, (i + 1) * _SLOTS // count - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                if i:
                    client.execute_command("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port)
        deadline = time.monotonic() + self.SETTLE_TIMEOUT
        while not self.settled():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not settle in {self.SETTLE_TIMEOUT} s")
            time.sleep(0.02)
        return self

    def settled(self) -> bool:
        """Whether every node says the cluster is ok, knows every node, and agrees with the
        others on who holds which slot."""
        import redis

        layouts = []
        try:
            for node in self.nodes:
                with self._client(node) as client:
                    info = client.execute_command("CLUSTER", "INFO")
                    if "cluster_state:ok" not in str(info):
                        return False
                    known = client.execute_command("CLUSTER", "NODES")
                    if str(known).count("master") < len(self.nodes):
                        return False
                    slots = client.execute_command("CLUSTER", "SLOTS")
                    layouts.append(sorted((s[0], s[1], s[2][1]) for s in slots))
        except (redis.RedisError, OSError):
            return False
        return all(layout == layouts[0] for layout in layouts)

    def layout(self) -> list[tuple[int, int, RedisServer]]:
        """Who holds which slots now: ``(first, last, node)`` ranges."""
        with self._client(self.nodes[0]) as client:
            ranges = client.execute_command("CLUSTER", "SLOTS")
        by_port = {n.port: n for n in self.nodes}
        return [(first, last, by_port[primary[1]]) for first, last, primary, *_ in ranges]

    def node_of(self, slot: int) -> RedisServer:
        """The node that holds ``slot`` now."""
        for first, last, node in self.layout():
            if first <= slot <= last:
                return node
        raise LookupError(f"slot {slot} is not covered")

    def migrate(
        self,
        slot: int,
        to: RedisServer,
        batch: int = 10,
        midway: Callable[[], None] | None = None,
    ) -> int:
        """Move ``slot`` and its keys to node ``to`` as ``redis-cli --cluster reshard`` does
        (the target importing, the source migrating, the keys moved ``batch`` at a time with
        ``MIGRATE``, then the slot given to the target on every node); how many keys moved.
        ``midway()`` is called once after the first batch moved: as long as it runs, the slot's
        keys are split between the two nodes (a slot of many keys, or a slow link)."""
        source = self.node_of(slot)
        if source is to:
            return 0
        moved = 0
        with self._client(to) as target, self._client(source) as origin:
            target_id = target.execute_command("CLUSTER", "MYID")
            source_id = origin.execute_command("CLUSTER", "MYID")
            target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            origin.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := origin.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                origin.execute_command(
                    "MIGRATE", "127.0.0.1", to.port, "", 0, 5000, "REPLACE", "KEYS", *keys
                )
                moved += len(keys)
                if midway is not None:
                    midway()
                    midway = None
            target.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            origin.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
            for node in self.nodes:
                if node is not to and node is not source:
                    with self._client(node) as other:
                        other.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return moved

    def stop(self) -> None:
        """Stop every node and remove their folders."""
        for node in self.nodes:
            node.stop()
