"""``streamsafe serve --workers 2`` as real processes in front of a simulator process: every
promise holds across the workers of one port.

Which worker a connection lands on is the kernel's choice (they accept from one socket); a test
that needs both opens connections until ``/stats`` (its ``pid``) has named both, and keeps each
connection (kept alive), so that its requests go to the worker it named.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fleet_helpers import MODEL, Process, chat_body, redis_binary, sse_events, whole_text

from streamsafe.engine_sim import expected_text
from waiting import wait_until

pytestmark = pytest.mark.timeout(90)


def stats(url: str) -> dict[str, Any]:
    return dict(httpx2.get(url + "/stats", timeout=10).json())


def new_generations(sim: Process) -> int:
    """Generations the simulator started for a new request (a takeover's continuation of a
    dead worker's generation is not one)."""
    s = stats(sim.url)
    return int(s["generations_started"]) - int(s["continuations"])


def pinned(url: str, per_worker: int, workers: int = 2) -> dict[int, list[httpx2.Client]]:
    """``per_worker`` clients on a kept-alive connection to each of ``workers`` workers, by
    the pid that answered their first ``/stats``."""
    found: dict[int, list[httpx2.Client]] = {}

    def one_more() -> dict[int, list[httpx2.Client]] | None:
        client = httpx2.Client(base_url=url, timeout=30, limits=httpx2.Limits(max_connections=1))
        pid = int(client.get("/stats").json()["pid"])
        if len(found.setdefault(pid, [])) < per_worker:
            found[pid].append(client)
        else:
            client.close()
        if len(found) == workers and all(len(c) == per_worker for c in found.values()):
            return found
        return None

    # A worker still starting answers nothing yet.
    return wait_until(
        one_more, 30, lambda: f"{per_worker} connections to each of {workers}: {found}", every=0
    )
    close_all(found)
    raise AssertionError(f"in 30 s connections reached {len(found)} worker(s)")


def close_all(clients: dict[int, list[httpx2.Client]]) -> None:
    for group in clients.values():
        for client in group:
            client.close()


@pytest.fixture(scope="module")
def sim() -> Iterator[Process]:
    proc = Process("simulate", "--itl-ms", "15", "--itl-ms-per-seq", "0")
    yield proc
    proc.stop()


def workers(sim: Process, *extra: str) -> Process:
    redis_binary()  # skipped (failed in CI) without one
    # A pinned connection must outlive the seconds a second worker may take to start while
    # the first answers (the default keep-alive, 5 s, closed some on a loaded machine).
    keep = ("--keep-alive-timeout", "120")
    return Process("serve", "--upstream", sim.url, "--workers", "2", "--lease", "1", *keep, *extra)


@pytest.fixture(scope="module")
def gateway(sim: Process) -> Iterator[Process]:
    proc = workers(sim)
    yield proc
    proc.stop()


def test_one_key_sent_to_both_workers_at_once_is_one_generation(
    sim: Process, gateway: Process
) -> None:
    clients = pinned(gateway.url, 4)
    try:
        body = chat_body("eight copies, two workers", 30)
        before = new_generations(sim)
        seen = {pid: stats_of(group[0])["requests_received"] for pid, group in clients.items()}
        key = {"Idempotency-Key": "workers-one-key-1"}

        def post(pid_client: tuple[int, httpx2.Client]) -> tuple[int, str]:
            pid, client = pid_client
            with client.stream("POST", "/v1/chat/completions", json=body, headers=key) as r:
                assert r.status_code == 200, r.read()
                got = list(sse_events(r))
            return pid, whole_text(got)

        jobs = [(pid, c) for pid, group in clients.items() for c in group]
        with ThreadPoolExecutor(len(jobs)) as pool:
            answers = list(pool.map(post, jobs))
        assert {text for _, text in answers} == {expected_text(body, 30, 0)}
        assert new_generations(sim) == before + 1
        for pid, group in clients.items():
            # Each worker answered its four on the connections it named (still its own), and
            # counted them: the eight really were spread over both.
            assert all(stats_of(c)["pid"] == pid for c in group)
            assert stats_of(group[0])["requests_received"] - seen[pid] == 4
    finally:
        close_all(clients)


def stats_of(client: httpx2.Client) -> dict[str, Any]:
    return dict(client.get("/stats").json())


def client_on(url: str, pid: int) -> httpx2.Client:
    """A client whose kept-alive connection is worker ``pid``'s (a stream read only in part
    closes its connection, so each request that follows one needs a client of its own)."""

    def connected() -> httpx2.Client | None:
        client = httpx2.Client(base_url=url, timeout=30, limits=httpx2.Limits(max_connections=1))
        if stats_of(client)["pid"] == pid:
            return client
        client.close()
        return None

    return wait_until(connected, 30, f"a connection reaching worker {pid}", every=0)


def test_a_resume_on_either_worker_is_exact(sim: Process, gateway: Process) -> None:
    clients = pinned(gateway.url, 1)
    close_all(clients)
    first, second = clients
    body = chat_body("resume across workers", 60)
    key = {"Idempotency-Key": "workers-resume-1"}
    before = new_generations(sim)
    got: list[tuple[int, bytes]] = []
    # Begun on one worker, resumed on the other, then on the first again.
    for pid, until in ((first, 4), (second, 9), (first, None)):
        headers = {**key, "Last-Event-ID": str(got[-1][0])} if got else key
        with (
            contextlib.closing(client_on(gateway.url, pid)) as client,
            client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
        ):
            assert r.status_code == 200
            for event in sse_events(r):
                got.append(event)
                if len(got) == until:
                    break
    assert [i for i, _ in got] == list(range(len(got)))
    assert whole_text(got) == expected_text(body, 60, 0)
    assert new_generations(sim) == before + 1
    for pid in (first, second):
        with contextlib.closing(client_on(gateway.url, pid)) as client:
            assert stats_of(client)["resumed"] >= 1


def test_a_worker_killed_under_live_streams_loses_none_and_is_replaced(sim: Process) -> None:
    from streamsafe import Client

    gateway = workers(sim)
    try:
        clients = pinned(gateway.url, 1)
        pids = set(clients)
        streams, tokens = 6, 120
        bodies = [chat_body(f"killed worker {i}", tokens) for i in range(streams)]
        started = threading.Barrier(streams + 1, timeout=30)
        before = new_generations(sim)

        def read(body: dict[str, Any]) -> tuple[str, int]:
            client = Client(base_url=gateway.url + "/v1", timeout=30)
            try:
                stream = client.chat.completions.create(
                    model=MODEL, messages=body["messages"], max_tokens=tokens, stream=True
                )
                for n, _ in enumerate(stream):
                    if n == 3:
                        started.wait()
                return stream.text, stream.resumes
            finally:
                client.close()

        with ThreadPoolExecutor(streams) as pool:
            futures = [pool.submit(read, body) for body in bodies]
            started.wait()
            # The worker with readers of its own dies as a crashed host does.
            victim = max(pids, key=lambda pid: stats_of(clients[pid][0])["subscribers"])
            assert stats_of(clients[victim][0])["subscribers"] >= 1
            os.kill(victim, signal.SIGKILL)
            answers = [f.result(60) for f in futures]
        for body, (text, _) in zip(bodies, answers, strict=True):
            assert text == expected_text(body, tokens, 0)
        assert sum(resumes for _, resumes in answers) >= 1
        assert new_generations(sim) == before + streams
        # The supervisor started another worker in its place.
        wait_until(
            lambda: any("died (SIGKILL)" in line for line in gateway.output), 30, "the death"
        )
        replaced = pinned(gateway.url, 1)
        assert victim not in replaced and len(replaced) == 2
        close_all(replaced)
        close_all(clients)
    finally:
        gateway.stop()


def test_sigterm_to_the_supervisor_drains_the_workers_and_exits_0(sim: Process) -> None:
    gateway = workers(sim, "--drain-timeout", "20")
    try:
        close_all(pinned(gateway.url, 1))  # both workers serve

        def worker_lines() -> list[str]:
            lines = [line for line in gateway.output if line.startswith("worker ")]
            return lines if len(lines) == 2 else []

        lines = wait_until(worker_lines, 10, "both workers' lines")
        worker_pids = [int(line.split("(pid ")[1].split(")")[0]) for line in lines]
        body = chat_body("drained whole", 80)
        got: list[tuple[int, bytes]] = []
        with httpx2.stream(
            "POST", gateway.url + "/v1/chat/completions", json=body, timeout=30
        ) as r:
            for event in sse_events(r):
                got.append(event)
                if len(got) == 3:
                    gateway.proc.send_signal(signal.SIGTERM)
        # The stream that ran when the signal came ended whole; then every process exited.
        assert whole_text(got) == expected_text(body, 80, 0)
        assert gateway.proc.wait(30) == 0
        assert not [pid for pid in worker_pids if os.path.exists(f"/proc/{pid}")]
        assert any("draining 2 worker(s)" in line for line in gateway.output)
    finally:
        gateway.stop()  # nothing left where the test failed


def test_workers_without_redis_or_a_redis_server_are_refused(tmp_path: Any) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no redis-server on it
    cmd = [sys.executable, "-m", "streamsafe.cli", "serve", "--workers", "2", "--port", "0"]
    done = subprocess.run(
        [*cmd, "--upstream", "http://127.0.0.1:9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "give --redis URL, or install redis-server" in done.stderr


def test_options_the_workers_refuse_stop_the_supervisor_with_status_2(sim: Process) -> None:
    redis_binary()
    cmd = [sys.executable, "-m", "streamsafe.cli", "serve", "--workers", "2", "--port", "0"]
    done = subprocess.run(
        [*cmd, "--upstream", sim.url, "--tenant-weight", "no-weight"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--tenant-weight wants KEY=WEIGHT" in done.stdout
    assert "refused its options" in done.stderr + done.stdout


def test_a_supervisor_killed_leaves_no_worker_and_no_redis_behind(sim: Process) -> None:
    from streamsafe_bench.processes import process_tree

    gateway = workers(sim)
    try:
        wait_until(lambda: len(process_tree(gateway.proc.pid)) == 4, 30, "2 workers and redis")
        children = [pid for pid in process_tree(gateway.proc.pid) if pid != gateway.proc.pid]
        redis = [
            p for p in children if Path(f"/proc/{p}/comm").read_text().strip() == "redis-server"
        ]
        assert len(redis) == 1
        folder = os.readlink(f"/proc/{redis[0]}/cwd")  # its private folder
        assert os.path.basename(folder).startswith("streamsafe-workers-")
        gateway.kill()
        # The kernel tells each of them (PR_SET_PDEATHSIG): none serves on for nobody.
        wait_until(
            lambda: not [pid for pid in children if os.path.exists(f"/proc/{pid}")],
            30,
            "the workers and redis-server to exit",
        )
        shutil.rmtree(folder)  # the one thing a killed supervisor leaves (docs/gateway.md)
    finally:
        gateway.kill()
