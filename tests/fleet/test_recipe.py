"""The fleet recipe (deploy/fleet): one command starts Redis, three gateway replicas and Debian's
nginx in front of them; a replica killed (SIGKILL) under load loses no stream, and the recipe
starts it again. Real processes throughout; needs redis-server and nginx on the PATH (`make test`
puts the Debian package `make nginx` unpacks there): missing, the test fails in CI and is skipped
elsewhere."""

from __future__ import annotations

import asyncio
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading

import httpx2
import orjson
import pytest
from fleet_helpers import redis_binary

from streamsafe.client import AsyncClient, Timeouts
from streamsafe.engine_sim import expected_text
from streamsafe.sse import SSEDecoder
from streamsafe_bench.processes import ServerProcess
from waiting import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_TOKENS = 80


def _nginx() -> None:
    if shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK):
        return
    msg = "nginx is not installed (`make nginx` unpacks Debian's package into .nginx)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def _content(body: str) -> str:
    """The text of a chat stream's chunks; ``[DONE]`` must end it."""
    events = SSEDecoder().feed(body.encode())
    assert events[-1].data == "[DONE]"
    chunks = [orjson.loads(e.data) for e in events[:-1]]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Recipe:
    """``python deploy/fleet/run.py`` as a process; ``lines`` is what it printed so far."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "deploy/fleet/run.py"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        # One reader from the start: a pipe read through a buffered text stream cannot be
        # polled line by line (a select after a readline misses what the buffer already holds).
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(40) or not any(x.startswith("fleet ready") for x in self.lines):
            self.stop()
            raise AssertionError(f"the fleet did not start: {self.lines}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("fleet ready"):
                self._ready.set()
        self._ready.set()  # exited: the caller sees no "fleet ready" line

    def replica_pid(self, i: int) -> int:
        for line in self.lines:
            found = re.match(rf"replica {i} on \S+ \(pid (\d+)\)", line)
            if found:
                return int(found.group(1))
        raise AssertionError(f"no replica {i} in {self.lines}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)


@pytest.mark.timeout(120)
def test_a_replica_killed_under_load_loses_no_stream(tmp_path: pathlib.Path) -> None:
    redis_binary()
    _nginx()
    engine = ServerProcess("simulate", "--itl-ms", "30", "--itl-ms-per-seq", "0")
    port = _free_port()
    recipe = Recipe(
        "--replicas", "3", "--port", str(port), "--upstream", engine.url, "--workdir", str(tmp_path)
    )
    try:
        bodies = [
            {
                "model": "sim-llama-8b",
                "messages": [{"role": "user", "content": f"fleet stream {i}"}],
                "max_tokens": MAX_TOKENS,
            }
            for i in range(12)
        ]
        texts, resumes = asyncio.run(_load_and_kill(f"http://127.0.0.1:{port}", bodies, recipe))
        for body, text in zip(bodies, texts, strict=True):
            assert text == expected_text(body, MAX_TOKENS)  # every token once, none lost
        assert sum(resumes) >= 1  # some streams were on the killed replica and resumed
        wait_until(
            lambda: any("replica 1 exited" in line for line in recipe.lines),
            30,
            lambda: f"the recipe says replica 1 exited: {recipe.lines}",
            every=0.1,
        )
    finally:
        code = recipe.stop()
        engine.stop()
    assert code == 0 and any(line.startswith("fleet stopped") for line in recipe.lines)


async def _load_and_kill(
    url: str, bodies: list[dict[str, object]], recipe: Recipe
) -> tuple[list[str], list[int]]:
    client = AsyncClient(
        base_url=url + "/v1", api_key="fleet", timeout=Timeouts(connect=5, first_byte=30, idle=30)
    )
    flowing = [asyncio.Event() for _ in bodies]

    async def one(i: int) -> tuple[str, int]:
        stream = await client.chat.completions.create(**bodies[i], stream=True)  # type: ignore[arg-type]
        parts = []
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
                if len(parts) == 3:
                    flowing[i].set()
        return "".join(parts), stream.resumes

    async def kill() -> None:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in flowing)), 30)
        os.kill(recipe.replica_pid(1), signal.SIGKILL)

    try:
        results = await asyncio.gather(*(one(i) for i in range(len(bodies))), kill())
    finally:
        await client.close()
    done = [r for r in results if r is not None]
    return [t for t, _ in done], [n for _, n in done]


@pytest.mark.timeout(120)
def test_a_rolling_restart_refuses_nothing_and_cuts_no_stream(tmp_path: pathlib.Path) -> None:
    # Plain clients, which neither resume nor retry: the restart alone must keep them whole.
    redis_binary()
    _nginx()
    engine = ServerProcess("simulate", "--itl-ms", "30", "--itl-ms-per-seq", "0")
    port = _free_port()
    recipe = Recipe(
        "--replicas", "2", "--port", str(port), "--upstream", engine.url, "--workdir", str(tmp_path)
    )
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    statuses: list[int] = []
    texts: dict[int, str] = {}
    done = threading.Event()

    def stream(i: int) -> None:
        body = {
            "model": "sim-llama-8b",
            "messages": [{"role": "user", "content": f"rolling {i}"}],
            "max_tokens": 60,
            "stream": True,
        }
        with httpx2.Client(timeout=30) as client:
            r = client.post(url, json=body)
        statuses.append(r.status_code)
        texts[i] = _content(r.text) if r.status_code == 200 else r.text
        assert texts[i] == expected_text(body, 60), texts[i]

    def keep_asking() -> None:
        i = 100
        while not done.is_set():
            stream(i)
            i += 1

    try:
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(6)]
        threads.append(threading.Thread(target=keep_asking))
        for t in threads:
            t.start()
        # The restart comes while the six streams are generating.
        wait_until(
            lambda: httpx2.get(engine.url + "/stats", timeout=5).json()["generations_started"] >= 6,
            30,
            "six streams started",
            every=0.05,
        )
        recipe.proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: any(line.startswith("rolling restart done") for line in recipe.lines),
            60,
            lambda: f"the recipe says the rolling restart is done: {recipe.lines}",
            every=0.1,
        )
        done.set()
        for t in threads:
            t.join(30)
    finally:
        done.set()
        code = recipe.stop()
        engine.stop()
    assert code == 0
    assert statuses and set(statuses) == {200}, statuses
    assert len(texts) == len(statuses) >= 8  # the six, and those asked during the restart
    pids = [line for line in recipe.lines if re.match(r"replica \d on ", line)]
    assert len(pids) == 4  # each of the two started twice
